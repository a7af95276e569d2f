"""The compiler domain with the real embedder and tokenizer, into a real directory store."""

import numpy as np
import pytest

from services.common.embedder import Embedder
from services.common.store import LocalStore
from services.compiler.compiler import (
    KIND_EMBEDDING,
    KIND_GRAMMAR,
    KIND_SIGNATURE,
    Compiler,
    decode_embedding,
    embedding_key,
)
from services.compiler.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    store = LocalStore(tmp_path_factory.mktemp("cstore"))
    return Compiler(store, Embedder(), load_tokenizer(""))


def test_compile_writes_three_verified_artifacts(compiler, small_tools):
    tool = small_tools[0]
    res = compiler.compile(tool)
    assert not res.cached and res.signature.startswith(tool.name + "(")
    assert res.signature_tokens == len(compiler.tokenize(res.signature)) > 3
    kinds = {a.kind for a in res.artifacts}
    assert kinds == {KIND_SIGNATURE, KIND_GRAMMAR, KIND_EMBEDDING}
    for a in res.artifacts:
        data, info = compiler.get(a.info.key)
        assert info.sha256 == a.info.sha256 and len(data) == a.info.size
    vec = decode_embedding(compiler.store.get(embedding_key(tool, compiler.embedder.fingerprint)), 384)
    assert abs(float(np.linalg.norm(vec)) - 1.0) < 1e-4


def test_compile_is_idempotent_and_content_addressed(compiler, small_tools):
    tool = small_tools[1]
    a = compiler.compile(tool)
    b = compiler.compile(tool)
    assert b.cached and [x.info.key for x in a.artifacts] == [x.info.key for x in b.artifacts]
    assert b.signature == a.signature and b.signature_tokens == a.signature_tokens


class SlowBlocks:
    """A stand-in for ``kvblock.BlockCompiler``: a block is the signature's bytes, made once ``gate`` opens."""

    def __init__(self):
        import threading

        self.gate = threading.Event()
        self.compiled: list[str] = []

    def key(self, tool):
        from services.common.store import artifact_key

        return artifact_key("atb", "fake", tool.schema_hash)

    def compile(self, sig):
        assert self.gate.wait(60)
        self.compiled.append(sig)
        return sig.encode(), {"tokens": 1}


def test_a_deferred_kv_block_compiles_in_the_background_and_a_restart_backfills_it(tmp_path, small_tools):
    from services.compiler.compiler import KIND_KV_BLOCK

    store = LocalStore(tmp_path / "store")
    blocks = SlowBlocks()
    compiler = Compiler(store, Embedder(), load_tokenizer(""), blocks)
    try:
        tool, other = small_tools[2], small_tools[3]
        res = compiler.compile(tool, defer_kv=True)  # returns while the block is still to make
        assert res.kv_pending and not res.cached and KIND_KV_BLOCK not in {a.kind for a in res.artifacts}
        assert {a.kind for a in res.artifacts} == {KIND_SIGNATURE, KIND_GRAMMAR, KIND_EMBEDDING}
        assert not store.exists(blocks.key(tool)) and compiler.later.pending() == 1
        again = compiler.compile(tool, defer_kv=True)  # queued once only
        assert again.kv_pending and compiler.later.pending() == 1
        blocks.gate.set()
        assert compiler.later.wait_idle(60)
        assert store.get(blocks.key(tool)) == res.signature.encode() and blocks.compiled == [res.signature]
        done = compiler.compile(tool, defer_kv=True)
        assert done.cached and not done.kv_pending and KIND_KV_BLOCK in {a.kind for a in done.artifacts}
        # without deferral the block is made before compile returns
        now = compiler.compile(other)
        assert not now.kv_pending and store.exists(blocks.key(other))
    finally:
        compiler.close()
    # a block queued when the compiler stopped is dropped; the next compiler finds it missing and queues it
    store.delete(blocks.key(other))
    restarted = Compiler(store, Embedder(), load_tokenizer(""), SlowBlocks())
    try:
        restarted.blocks.gate.set()
        assert restarted.backfill([tool, other]) == 1
        assert restarted.later.wait_idle(60) and store.exists(blocks.key(other))
    finally:
        restarted.close()


def test_without_kv_blocks_deferral_changes_nothing(compiler, small_tools):
    res = compiler.compile(small_tools[4], defer_kv=True)
    assert not res.kv_pending and compiler.later is None and compiler.backfill(small_tools) == 0


def test_an_embedding_already_in_the_store_is_reused(tmp_path, small_tools):
    """The router stores a registration's embeddings in one batch before it calls Compile per tool: the compiler
    keeps them (same content-addressed key) rather than embedding each tool again."""
    from services.compiler.compiler import encode_embedding

    store = LocalStore(tmp_path / "store")
    emb = Embedder()
    compiler = Compiler(store, emb, load_tokenizer(""))
    tool = small_tools[5]
    vec = np.zeros(emb.dim, np.float32)
    vec[0] = 1.0
    store.put(embedding_key(tool, emb.fingerprint), encode_embedding(vec), {"tool": tool.name})
    res = compiler.compile(tool)
    assert not res.cached and {a.kind for a in res.artifacts} == {KIND_SIGNATURE, KIND_GRAMMAR, KIND_EMBEDDING}
    assert np.array_equal(decode_embedding(store.get(embedding_key(tool, emb.fingerprint)), emb.dim), vec)
