"""Engine server bootstrap: ``python -m services.engine`` or ``nexus serve engine``."""

from __future__ import annotations

import asyncio

from nexus.v1 import engine_pb2_grpc
from services.common.metrics import Metrics
from services.common.security import ServerSecurity
from services.common.server import Registration, serve
from services.common.store import open_store
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.servicer import EngineServicer


async def run(config: EngineConfig, *, ready=None, stop_event: asyncio.Event | None = None) -> None:
    store = open_store(config.store_url)
    engine = await asyncio.to_thread(Engine, config, store)
    metrics = Metrics("engine")

    async def warmup() -> None:
        await asyncio.to_thread(engine.warmup)
        # a compiler on another GGUF: an error in the log with both fingerprints, and the gauge, from the start
        await asyncio.to_thread(engine.check_compiler_model)
        metrics.kv_model_mismatch.set(1.0 if engine.model_mismatch else 0.0)

    async def on_stop() -> None:
        engine.close()
        store.close()

    await serve(
        [Registration(engine_pb2_grpc.add_EngineServiceServicer_to_server, EngineServicer(engine, metrics),
                      "nexus.v1.EngineService")],
        host=config.host, port=config.port, max_message_bytes=config.max_message_bytes, grace_s=config.grace_s,
        warmup=warmup, on_stop=on_stop, ready=ready, stop_event=stop_event,
        metrics=metrics, metrics_port=config.metrics_port, security=ServerSecurity.from_config(config),
    )
