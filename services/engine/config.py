"""Engine configuration (defaults < TOML file < NEXUS_ENGINE_* env < flags)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import MiB, TransportSecurity


@dataclass(frozen=True)
class EngineConfig(TransportSecurity):
    host: str = "127.0.0.1"
    port: int = 50053
    grace_s: float = 10.0
    max_message_bytes: int = 16 * MiB
    store_url: str = "var/store"
    # Any GGUF chat model (a path, a models/gguf.json entry or smollm2-135m); empty = the default chosen by
    # measurement, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (installed by make setup; reports/models.json).
    model_path: str = ""
    n_ctx: int = 4096
    n_threads: int = 2
    n_batch: int = 512
    seed: int = 0
    # Layers offloaded to a GPU (0: CPU). A discrete GPU makes the engine decline splices (path B).
    n_gpu_layers: int = 0
    # Path A: splice the tool's compiled KV block instead of prefilling its signature (when the compiler
    # made one for this model). R(n) repair: R_base % up to M positions, rising to 100 % at K * M.
    splice: bool = True
    splice_M: int = 256
    splice_R_base: float = 5.0
    splice_K: float = 4.0
    # Fraction of splices checked against a text prefill in the sidecar sequence (0 = only on request).
    splice_validate_rate: float = 0.0
    # Model profile (services/engine/profiles.py): "auto" turns off the decoding rules below that did not pay for
    # the model's family on held-out lines (`nexus eval rules`); "none" runs what this configuration says; or a
    # family name (smollm2, qwen2, default).
    profile: str = "auto"
    # Copy bias (services/engine/copybias.py): nudges string values toward spans of the request.
    copy_bias: bool = True
    copy_start_bias: float = 2.0
    copy_close_bias: float = 3.0
    # Inside a value that is a span of the request, tokens that neither continue the span nor end it at a word
    # boundary lose this much (0 = off): stated values are copied whole, not run on or invented mid-way.
    copy_span_penalty: float = 30.0
    # A value starting where an earlier value of the same call started loses this much (0 = off).
    copy_reuse_penalty: float = 4.0
    # Continuing a copied value onto the next word of unquoted text costs this much (0 = off).
    copy_word_penalty: float = 3.0
    # Slot reader (services/engine/slots.py, `nexus train-slots` / `make train`; shipped in models/slots): per parameter, the span of the
    # request that states it; the copy bias favours that span by this much while the value is written (0 = off;
    # tune split with the session-5 reader: 10 -> 74.5 %, 6 -> 73.0 %).
    slot_model: str = "var/models/slots"
    slot_hint_bias: float = 10.0
    # While a top-level key is written: keys of hinted parameters not yet written gain this, keys of parameters
    # the reader found no span for (enums left out) lose it (0 = off; 6 measured 73.8 % vs 74.5 % off: the
    # model then closes the object before mapped optional values such as orderBy).
    slot_key_bias: float = 0.0
    # While a hinted parameter is not written yet, tokens that close the top-level object lose this (0 = off;
    # tune split, 240 lines: 427 -> 437/533 = 82.0 % at 8, 10 arguments gained, none lost: the 135M model closed
    # before stated values such as run_id, commit_title, mode).
    slot_pending_bias: float = 8.0
    # Inside a hinted value still on its span, tokens that do not continue the span lose this (0 = off; tune
    # split, 240 lines: +1 argument at 10, none lost, measured twice: "ci" was written "c12").
    slot_hint_penalty: float = 10.0
    # Enum and boolean parameters whose value the request names in its words (services/engine/choices.py): the
    # copy bias favours that value by ``slot_hint_bias`` and holds it pending until it is written (tune split:
    # with number ordering 444 -> 452, docs/experiments/args_experiments.md rows 44-45).
    enum_choices: bool = True
    slot_threads: int = 1
    # 0: each parameter's own best span (overlaps allowed); k > 0: each parameter's best k spans are shared out
    # best first without overlaps (tune split: 64.5 % at k = 3 vs 66.0 % at 0, docs/experiments/args_experiments.md)
    slot_candidates: int = 0
    # Recent prompt heads (prelude + conversation window) kept decoded in their own sequences, found by exact
    # tokens through the native radix arena (0 disables).
    warm_heads: int = 4
    # Decoded KV blocks kept in memory (LRU).
    block_cache: int = 64
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
