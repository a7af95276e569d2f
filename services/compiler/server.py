"""Compiler server bootstrap: ``python -m services.compiler`` or ``nexus serve compiler``."""

from __future__ import annotations

import asyncio
import logging
import threading

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


def derive_worker(config: CompilerConfig, store, metrics):
    """The derived-requests worker of ``config`` (None, logged, when its generator model is not installed)."""
    from pathlib import Path

    from services.common.errors import FailedPrecondition
    from services.common.models import file_fingerprint, resolve_generator_gguf
    from services.compiler import derive

    try:
        model = resolve_generator_gguf(config.derive_model_path)
    except FailedPrecondition as e:
        log.error("derived requests are off: %s", e.message)
        return None
    # the default model's fingerprint is pinned (models/gguf.json): no need to hash 491 MB at every start
    fp = (derive.default_fingerprint() if not config.derive_model_path
          else derive.generator_fingerprint(file_fingerprint(model)))
    shipped_path = config.derive_shipped or str(Path(__file__).resolve().parents[2] / "data/derived/requests.jsonl")
    shipped: dict[str, list[str]] = {}
    if Path(shipped_path).is_file():
        header, reqs = derive.read_requests_file(shipped_path)
        if header.get("fingerprint") == fp:
            shipped = reqs
        else:
            log.info("shipped derived requests are of another generator: not used", extra={"file": shipped_path})
    log.info("derived requests on", extra={"model": str(model), "fingerprint": fp[:12], "shipped": len(shipped)})
    return derive.DeriveWorker(store, lambda: derive.RequestGenerator(str(model), threads=config.derive_threads,
                                                                     parallel=config.derive_parallel),
                               fp, shipped, metrics)


async def run(config: CompilerConfig, *, ready=None, stop_event: asyncio.Event | None = None) -> None:
    store = open_store(config.store_url)
    embedder = await asyncio.to_thread(Embedder, config.embedder_path)
    tokenize = await asyncio.to_thread(load_tokenizer, config.model_path)
    blocks = None
    if config.kv_blocks:
        from services.compiler.kvblock import BlockCompiler

        blocks = await asyncio.to_thread(BlockCompiler, config.model_path, n_threads=config.kv_threads)
        log.info("KV blocks", extra={"model": blocks.model_path, "threads": config.kv_threads})
    metrics = Metrics("compiler")
    compiler = Compiler(store, embedder, tokenize, blocks, metrics)
    worker = await asyncio.to_thread(derive_worker, config, store, metrics) if config.derive else None

    def backfill() -> None:
        try:
            tools, _ = store.registry_snapshot()
            n = compiler.backfill(tools.values())
        except Exception as e:  # noqa: BLE001 - best effort: those tools stay on the engine's text prefill
            log.warning("KV block backfill failed", extra={"error": str(e)})
            return
        if n:
            log.info("KV blocks missing for registered tools: compiling them in the background", extra={"tools": n})

    async def warmup() -> None:
        await asyncio.to_thread(store.ping)
        await asyncio.to_thread(embedder.embed_one, "warm up")
        if blocks is not None:
            from services.compiler.kvblock import announce_model

            # the model the blocks are for, in the store: an engine on another GGUF logs both fingerprints at start
            await asyncio.to_thread(announce_model, store, blocks.model)
            if config.kv_backfill:  # off the start-up path: serving does not wait for it
                threading.Thread(target=backfill, name="kv-backfill", daemon=True).start()

    async def on_stop() -> None:
        if worker is not None:
            await asyncio.to_thread(worker.close)
        await asyncio.to_thread(compiler.close)
        if blocks is not None:
            blocks.close()
        store.close()

    await serve(
        [Registration(compiler_pb2_grpc.add_CompilerServiceServicer_to_server, CompilerServicer(compiler, metrics, worker),
                      "nexus.v1.CompilerService")],
        host=config.host, port=config.port, max_message_bytes=config.max_message_bytes, grace_s=config.grace_s,
        warmup=warmup, on_stop=on_stop, ready=ready, stop_event=stop_event,
        metrics=metrics, metrics_port=config.metrics_port, security=ServerSecurity.from_config(config),
    )
