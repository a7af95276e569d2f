"""Run one service from its own ``__main__`` (``python -m services.router``) with what ``nexus serve`` takes:
``--config FILE``, ``--host``, ``--port``, ``--store``, then ``NEXUS_<SERVICE>_*`` environment variables. A service
may add flags of its own (``ExtraArg``: one flag, one config field). Serving code only: starting a service never
imports the command line, training or evaluation code."""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (the OS picks it), for a service started on it next (benches, tests)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class ExtraArg:
    """A flag a service adds to the common ones; it overrides the config field ``field``."""

    flag: str
    field: str
    help: str
    type: Callable[[str], Any] = str


def add_serve_args(p: argparse.ArgumentParser, extra: Sequence[ExtraArg] = ()) -> argparse.ArgumentParser:
    p.add_argument("--config", help="TOML config file")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--store", help="store URL: a directory or redis://…")
    for a in extra:
        p.add_argument(a.flag, dest=a.field, type=a.type, help=a.help)
    return p


def load_service_config(service: str, cls: type, args: argparse.Namespace, extra: Sequence[ExtraArg] = ()) -> Any:
    """``cls`` from its defaults < ``--config`` < ``NEXUS_<SERVICE>_*`` env < the flags given (a flag given for a
    field ``cls`` does not have is a ``ConfigError``)."""
    from services.common.config import load_config

    overrides = {"port": getattr(args, "port", None), "host": getattr(args, "host", None),
                 "store_url": getattr(args, "store", None)}
    overrides |= {a.field: getattr(args, a.field, None) for a in extra}
    return load_config(cls, prefix=f"NEXUS_{service.upper()}_", file=getattr(args, "config", None),
                       overrides=overrides)


def serve(service: str, cls: type, run: Callable[[Any], Awaitable[None]], args: argparse.Namespace,
          extra: Sequence[ExtraArg] = ()) -> int:
    from services.common.logging_setup import setup_logging

    config = load_service_config(service, cls, args, extra)
    setup_logging(config.log_level, service=service)
    asyncio.run(run(config))
    return 0


def main(service: str, cls: type, run: Callable[[Any], Awaitable[None]], argv: Sequence[str] | None = None, *,
         extra_args: Sequence[ExtraArg] = ()) -> int:
    """A service's ``__main__``: parse the flags (the common ones + ``extra_args``), then ``serve``; a bad config
    exits 2 with its message."""
    from services.common.errors import NexusError

    p = add_serve_args(argparse.ArgumentParser(prog=f"python -m services.{service}", description=f"run the {service}"),
                       extra_args)
    args = p.parse_args(argv)
    try:
        return serve(service, cls, run, args, extra_args)
    except NexusError as e:
        p.exit(2, f"{p.prog}: {type(e).__name__}: {e.message}\n")
    except KeyboardInterrupt:
        return 130
