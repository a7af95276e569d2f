"""Compiler server bootstrap: ``python -m services.compiler`` or ``nexus serve compiler``."""

from __future__ import annotations

import asyncio
import logging

from nexus.v1 import compiler_pb2_grpc
from services.common.embedder import Embedder
from services.common.metrics import Metrics
from services.common.security import ServerSecurity
from services.common.server import Registration, serve
from services.common.store import open_store
from services.compiler.compiler import Compiler
from services.compiler.config import CompilerConfig
from services.compiler.servicer import CompilerServicer
from services.compiler.tokenizer import load_tokenizer

log = logging.getLogger("nexus.compiler")


async def run(config: CompilerConfig, *, ready=None, stop_event: asyncio.Event | None = None) -> None:
    store = open_store(config.store_url)
    embedder = await asyncio.to_thread(Embedder, config.embedder_path)
    tokenize = await asyncio.to_thread(load_tokenizer, config.model_path)
    blocks = None
    if config.kv_blocks:
        from services.compiler.kvblock import BlockCompiler

        blocks = await asyncio.to_thread(BlockCompiler, config.model_path, n_threads=config.kv_threads)
        log.info("KV blocks", extra={"model": blocks.model_path, "threads": config.kv_threads})
    compiler = Compiler(store, embedder, tokenize, blocks)
    metrics = Metrics("compiler")

    async def warmup() -> None:
        await asyncio.to_thread(store.ping)
        await asyncio.to_thread(embedder.embed_one, "warm up")

    async def on_stop() -> None:
        if blocks is not None:
            blocks.close()
        store.close()

    await serve(
        [Registration(compiler_pb2_grpc.add_CompilerServiceServicer_to_server, CompilerServicer(compiler, metrics),
                      "nexus.v1.CompilerService")],
        host=config.host, port=config.port, max_message_bytes=config.max_message_bytes, grace_s=config.grace_s,
        warmup=warmup, on_stop=on_stop, ready=ready, stop_event=stop_event,
        metrics=metrics, metrics_port=config.metrics_port, security=ServerSecurity.from_config(config),
    )
