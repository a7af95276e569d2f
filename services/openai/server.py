"""Front bootstrap: ``python -m services.openai`` (and, once wired, ``nexus serve openai``).

Like the gRPC services' ``server.run``: bind (port 0 = a free port, passed to ``ready``), serve, warm up (wait for
the router and engine to report SERVING, read the registry), only then report healthy and call ``ready``; SIGTERM /
SIGINT (or ``stop_event``) stop it, in-flight requests getting ``grace_s`` to finish."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl

import uvicorn

from services.common.errors import NexusError
from services.common.security import ServerSecurity
from services.openai.app import create_app
from services.openai.backend import Backend
from services.openai.chat import ChatService
from services.openai.config import OpenAIConfig

log = logging.getLogger("nexus.openai")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: ``run`` owns SIGTERM / SIGINT like every Nexus server (uvicorn's
    re-raises the signal after shutdown, so the process would not exit 0)."""

    def __init__(self, config: uvicorn.Config):
        super().__init__(config)
        self.started_event = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self.started_event.set()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app, config: OpenAIConfig) -> uvicorn.Config:
    sec = ServerSecurity.from_config(config)
    tls = {}
    if sec.tls:
        tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
        if config.tls_client_ca:
            tls |= {"ssl_ca_certs": config.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                          timeout_graceful_shutdown=config.grace_s, **tls)


async def run(config: OpenAIConfig, *, ready=None, stop_event: asyncio.Event | None = None) -> None:
    token = ServerSecurity.from_config(config).token()
    backend = Backend(config)
    service = ChatService(config, backend)
    state = {"serving": False}

    async def health() -> dict[str, str]:
        return await backend.health(timeout_s=2.0)

    app = create_app(config, service, token=token, health=health, serving=lambda: state["serving"])
    sock = _bind(config.host, config.port)
    port = sock.getsockname()[1]
    server = _Server(_uvicorn_config(app, config))
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (RuntimeError, ValueError):  # not the main thread
            pass
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        started = asyncio.create_task(server.started_event.wait())
        await asyncio.wait({serving, started}, return_when=asyncio.FIRST_COMPLETED)
        if not server.started_event.is_set():
            started.cancel()
            await serving  # raises what stopped it (e.g. a bad TLS file)
            raise RuntimeError("the HTTP server did not start")
        log.info("listening", extra={"host": config.host, "port": port, "model": config.model_name,
                                     "router": config.router_addr, "engine": config.engine_addr,
                                     "auth": token is not None, "tls": bool(config.tls_cert)})
        if not await backend.wait_serving(config.backend_wait_s):
            log.warning("router / engine not SERVING yet; serving anyway (/health answers 503 until they are)",
                        extra={"waited_s": config.backend_wait_s})
        else:
            try:
                await service.book.refresh()
            except NexusError as e:
                log.warning("could not read the registry at start-up", extra={"error": e.message})
        state["serving"] = True
        if ready is not None:
            ready(port)
        log.info("serving", extra={"port": port})
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
    finally:
        log.info("stopping", extra={"grace_s": config.grace_s})
        state["serving"] = False
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await backend.close()
        sock.close()
