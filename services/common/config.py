"""Service configuration: one frozen dataclass per service.

Precedence is defaults < TOML file < ``NEXUS_<SERVICE>_<FIELD>`` environment variables.
Unknown keys (in the file or in the service's env namespace) are fatal, so a typo never
silently falls back to a default. Parsed once in ``__main__`` / the CLI and passed explicitly.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from services.common.errors import InvalidArgument

T = TypeVar("T")

MiB = 1024 * 1024


class ConfigError(InvalidArgument):
    """The configuration is invalid (unknown key, wrong type)."""


def _coerce(name: str, value: Any, typ: Any) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or value == "":
            return None
        return _coerce(name, value, args[0])
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if typ is float:
            return float(value)
        if typ is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if origin is tuple:
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            (inner, *_rest) = typing.get_args(typ)
            return tuple(_coerce(name, v, inner) for v in value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config key {name!r}: cannot use {value!r} as {typ}") from e
    return value


def load_config(
    cls: type[T],
    *,
    prefix: str,
    file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from defaults, then ``file`` (TOML), then ``env`` vars ``{prefix}{FIELD}``,
    then explicit ``overrides`` (command-line flags). Unknown keys raise ``ConfigError``."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}

    if file is not None:
        path = Path(file)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"config file not found: {path}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from e
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ConfigError(f"unknown config key(s) in {path}: {', '.join(unknown)}")
        values.update(data)

    env = os.environ if env is None else env
    for key, raw in env.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :].lower()
        if name not in fields:
            raise ConfigError(f"unknown environment variable {key} (fields: {', '.join(sorted(fields))})")
        values[name] = raw

    for key, raw in (overrides or {}).items():
        if raw is None:
            continue
        if key not in fields:
            raise ConfigError(f"unknown config key {key!r}")
        values[key] = raw

    coerced = {k: _coerce(k, v, hints[k]) for k, v in values.items()}
    return cls(**coerced)


@dataclasses.dataclass(frozen=True)
class TransportSecurity:
    """Transport security fields every service config inherits (services/common/security.py; all off by default):
    PEM server cert + key serve the port over TLS, ``tls_client_ca`` requires client certificates (mTLS),
    ``auth_token`` / ``auth_token_file`` require ``authorization: Bearer <token>`` on every call except health."""

    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    auth_token: str = ""
    auth_token_file: str = ""


@dataclasses.dataclass(frozen=True)
class ServerConfig(TransportSecurity):
    """Settings every gRPC server shares (embedded in each service's config by field names)."""

    host: str = "127.0.0.1"
    port: int = 0
    grace_s: float = 5.0
    max_message_bytes: int = 16 * MiB
