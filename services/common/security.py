"""Transport security for every Nexus server and client: optional TLS (and mTLS) and a bearer token.

Both are off by default (plaintext, no token: what ``make run`` and the tests use). A service turns
them on through its own config (``NEXUS_<SERVICE>_TLS_CERT`` …, or the TOML file):

    tls_cert, tls_key     PEM server certificate chain and private key: the port is served over TLS
    tls_client_ca         PEM CA bundle: clients must present a certificate it signed (mTLS)
    auth_token            shared secret: every call must carry ``authorization: Bearer <token>``
    auth_token_file       the same, read from a file (preferred: keeps the secret out of the environment)

A missing or wrong token is refused with UNAUTHENTICATED before the servicer runs. The gRPC health
service stays open (``/grpc.health.v1.Health/*``) so load balancers, k8s probes and ``nexus up`` can
probe a server without holding the secret; it reveals nothing but SERVING / NOT_SERVING. Reflection is
protected like every other RPC (``grpcurl -H 'authorization: Bearer …'``).
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from services.common.config import ConfigError
from services.common.errors import Unauthenticated

AUTH_METADATA_KEY = "authorization"
# Calls allowed without a token (see the module docstring for why).
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path!r}: {e.strerror or e}") from e


def _token(value: str, file: str, what: str) -> str | None:
    if value and file:
        raise ConfigError(f"set either {what} or {what}_file, not both")
    if file:
        token = _read(file, f"{what}_file").decode("utf-8", "strict").strip()
        if not token:
            raise ConfigError(f"{what}_file {file!r} is empty")
        return token
    return value or None


@dataclass(frozen=True)
class ServerSecurity:
    """A server's TLS and token settings (empty strings = off)."""

    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    auth_token: str = ""
    auth_token_file: str = ""

    @classmethod
    def from_config(cls, config: Any) -> ServerSecurity:
        """The security fields of any service config (fields it does not have count as off)."""
        return cls(**{f: getattr(config, f, "") or "" for f in cls.__dataclass_fields__})

    @property
    def tls(self) -> bool:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key must be set together")
        if self.tls_client_ca and not self.tls_cert:
            raise ConfigError("tls_client_ca (mTLS) needs tls_cert and tls_key")
        return bool(self.tls_cert)

    def token(self) -> str | None:
        return _token(self.auth_token, self.auth_token_file, "auth_token")

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        ca = _read(self.tls_client_ca, "tls_client_ca") if self.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(_read(self.tls_key, "tls_key"), _read(self.tls_cert, "tls_cert"))],
            root_certificates=ca, require_client_auth=ca is not None,
        )

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        token = self.token()
        return [TokenAuthInterceptor(token)] if token else []


def _bearer(metadata) -> str | None:
    for key, value in metadata or ():
        if key == AUTH_METADATA_KEY:
            v = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            scheme, _, cred = v.partition(" ")
            return cred.strip() if scheme.lower() == "bearer" else None
    return None


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses (UNAUTHENTICATED) every call whose ``authorization`` metadata is not ``Bearer <token>``.

    It sits inside ``ErrorInterceptor``, so a refusal is logged and counted like any other status.
    The comparison is constant-time."""

    def __init__(self, token: str):
        if not token:
            raise ValueError("empty token")
        self._token = token.encode()

    def _ok(self, metadata) -> bool:
        got = _bearer(metadata)
        return got is not None and hmac.compare_digest(got.encode(), self._token)

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES) or self._ok(
            handler_call_details.invocation_metadata
        ):
            return handler
        reason = "missing bearer token" if _bearer(handler_call_details.invocation_metadata) is None \
            else "invalid bearer token"
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        if handler.unary_unary:
            async def refuse_uu(request, context):
                raise Unauthenticated(reason)

            return grpc.unary_unary_rpc_method_handler(refuse_uu, **kw)
        if handler.unary_stream:
            async def refuse_us(request, context):
                raise Unauthenticated(reason)
                yield  # pragma: no cover - makes this an async generator

            return grpc.unary_stream_rpc_method_handler(refuse_us, **kw)
        if handler.stream_unary:
            async def refuse_su(request_iterator, context):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

            return grpc.stream_unary_rpc_method_handler(refuse_su, **kw)

        async def refuse_ss(request_iterator, context):  # reflection is bidi streaming
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
            yield  # pragma: no cover

        return grpc.stream_stream_rpc_method_handler(refuse_ss, **kw)


@dataclass(frozen=True)
class ClientSecurity:
    """How a client reaches a secured server: a CA to trust (turns TLS on), an optional client
    certificate for mTLS, and an optional bearer token."""

    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    token: str = ""
    token_file: str = ""

    def credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("client tls_cert and tls_key must be set together")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.tls_ca, "tls_ca") if self.tls_ca else None,
            private_key=_read(self.tls_key, "tls_key") if self.tls_key else None,
            certificate_chain=_read(self.tls_cert, "tls_cert") if self.tls_cert else None,
        )

    def bearer(self) -> str | None:
        return _token(self.token, self.token_file, "token")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        t = self.bearer()
        return ((AUTH_METADATA_KEY, f"Bearer {t}"),) if t else ()

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``NexusClient``."""
        return {"credentials": self.credentials(), "token": self.bearer()}

    @classmethod
    def for_compiler(cls, router_config: Any) -> ClientSecurity:
        """The router's settings for its calls to the compiler (``compiler_tls_ca``, ``compiler_auth_token``…)."""
        g = lambda f: getattr(router_config, f, "") or ""  # noqa: E731
        return cls(tls_ca=g("compiler_tls_ca"), tls_cert=g("compiler_tls_cert"), tls_key=g("compiler_tls_key"),
                   token=g("compiler_auth_token"), token_file=g("compiler_auth_token_file"))

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> ClientSecurity:
        """``NEXUS_CLIENT_TLS_CA``, ``NEXUS_CLIENT_TLS_CERT``, ``NEXUS_CLIENT_TLS_KEY``, ``NEXUS_CLIENT_TOKEN``,
        ``NEXUS_CLIENT_TOKEN_FILE`` (the ``nexus`` CLI's defaults; its flags override them)."""
        env = os.environ if env is None else env
        return cls(**{f: env.get(f"NEXUS_CLIENT_{f.upper()}", "") for f in cls.__dataclass_fields__})
