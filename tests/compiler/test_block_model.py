"""The model the compiler's KV blocks are for, announced in the store, and the engine's comparison with its own
(services/compiler/kvblock.py): a mismatch names both fingerprints and both GGUFs."""

from __future__ import annotations

import pytest

from services.common.errors import DataCorruption
from services.common.store import LocalStore
from services.compiler.kvblock import (
    KV_MODEL_KEY,
    BlockModel,
    announce_model,
    announced_model,
    model_mismatch,
)

SMOL = BlockModel("a" * 64, "1" * 64, "/models/SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN = BlockModel("b" * 64, "2" * 64, "/cache/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf")


def test_the_same_model_and_head_match():
    assert model_mismatch(SMOL, BlockModel(SMOL.model, SMOL.kv, "/elsewhere/on/the/compiler/host.gguf")) is None


def test_another_model_is_reported_with_both_fingerprints_and_both_files():
    why = model_mismatch(engine=SMOL, compiler=QWEN)
    assert why is not None
    for part in (SMOL.model, SMOL.path, QWEN.model, QWEN.path):
        assert part in why
    assert why.index(QWEN.model) < why.index(SMOL.model)  # "the compiler ... X, the engine ... Y"


def test_the_same_model_with_another_prompt_head_is_reported_with_both_kv_fingerprints():
    why = model_mismatch(SMOL, BlockModel(SMOL.model, "3" * 64, SMOL.path))
    assert why is not None and SMOL.kv in why and "3" * 64 in why and "prompt head" in why


def test_the_announcement_round_trips_through_the_store(tmp_path):
    store = LocalStore(tmp_path)
    assert announced_model(store) is None  # no compiler with KV blocks has started on this store
    announce_model(store, QWEN)
    assert announced_model(store) == QWEN
    announce_model(store, SMOL)  # a restarted compiler on another GGUF: the last start-up's model
    assert announced_model(store) == SMOL


def test_a_damaged_announcement_is_data_corruption(tmp_path):
    store = LocalStore(tmp_path)
    store.put(KV_MODEL_KEY, b"not json")
    with pytest.raises(DataCorruption):
        announced_model(store)
