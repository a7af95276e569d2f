"""Router server bootstrap: ``python -m services.router`` or ``nexus serve router``."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nexus.v1 import router_pb2_grpc
from services.common.clients import AsyncCompilerClient
from services.common.embedder import Embedder
from services.common.errors import NexusError
from services.common.metrics import Metrics
from services.common.security import ClientSecurity, ServerSecurity
from services.common.server import Registration, serve
from services.common.store import open_store
from services.router.config import RouterConfig
from services.router.router import Router
from services.router.servicer import RouterServicer

log = logging.getLogger("nexus.router")


async def run(config: RouterConfig, *, ready=None, stop_event: asyncio.Event | None = None) -> None:
    store = open_store(config.store_url)
    embedder = await asyncio.to_thread(Embedder, config.embedder_path)
    router = Router(config, store, embedder)
    compiler = AsyncCompilerClient(config.compiler_addr, timeout_s=config.compile_timeout_s,
                                   security=ClientSecurity.for_compiler(config))
    poller: asyncio.Task | None = None
    metrics = Metrics("router")

    async def poll() -> None:
        # Replicas share the registry through the store: pick up other replicas' changes.
        while True:
            await asyncio.sleep(config.registry_poll_s)
            try:
                await router.sync()
            except NexusError as e:  # store down: keep serving the loaded registry
                log.warning("registry sync failed; serving the loaded registry", extra={"error": e.message})

    async def warmup() -> None:
        nonlocal poller
        await router.sync(force=True)
        await asyncio.to_thread(embedder.embed_one, "warm up")
        poller = asyncio.create_task(poll())

    async def on_stop() -> None:
        if poller is not None:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
        await compiler.close()
        store.close()

    await serve(
        [Registration(router_pb2_grpc.add_RouterServiceServicer_to_server, RouterServicer(router, compiler, metrics),
                      "nexus.v1.RouterService")],
        host=config.host, port=config.port, max_message_bytes=config.max_message_bytes, grace_s=config.grace_s,
        warmup=warmup, on_stop=on_stop, ready=ready, stop_event=stop_event,
        metrics=metrics, metrics_port=config.metrics_port, security=ServerSecurity.from_config(config),
    )
