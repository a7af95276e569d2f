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
