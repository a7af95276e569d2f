"""Compiler configuration (defaults < TOML file < NEXUS_COMPILER_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import MiB, TransportSecurity


@dataclass(frozen=True)
class CompilerConfig(TransportSecurity):
    host: str = "127.0.0.1"
    port: int = 50052
    grace_s: float = 5.0
    max_message_bytes: int = 16 * MiB
    store_url: str = "var/store"
    # GGUF the KV blocks are compiled with (the engine's: a path, a models/gguf.json entry or smollm2-135m); empty =
    # the engine's default, Qwen2.5-Coder-1.5B-Instruct.
    model_path: str = ""
    embedder_path: str = ""
    # Also compile each tool's KV block (.atb) with that model, for the engine's splice path (costs the
    # model in memory and ~230 ms of decode per tool on one core of this VM, ~140 ms on two; blocks are
    # bit-identical at any thread count). kv_threads: llama.cpp threads for it (`nexus up`: the host's, up to 4).
    kv_blocks: bool = True
    kv_threads: int = 1
    # At start, compile in the background the KV blocks registered tools lack (blocks deferred by RegisterTools'
    # defer_kv_blocks that a restart dropped from the queue); until then the engine prefills those tools as text.
    kv_backfill: bool = True
    # Derived requests (services/compiler/derive.py): after a tool compiles, a background worker writes the requests
    # an instruct LLM derives from it, which the router uses as the tool's keys; the tool is routable at once on
    # its text key. derive_model_path: the generator GGUF ('' = the installed Qwen2.5-Coder-0.5B-Instruct of
    # models/gguf.json; the router reads the requests of that default generator unless its derived_fingerprint is
    # set). derive_shipped: the default registry's requests by the default generator ('' = data/derived/requests.jsonl
    # of the checkout), written without loading any model. derive_parallel: tools generated per pass.
    derive: bool = True
    derive_model_path: str = ""
    derive_threads: int = 1
    derive_parallel: int = 8
    derive_shipped: str = ""
    # Prometheus /metrics HTTP port (0 disables the endpoint).
    metrics_port: int = 9102
    log_level: str = "INFO"
