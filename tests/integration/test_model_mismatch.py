"""A compiler and an engine started on two different GGUFs (the compiler on Qwen2.5-Coder-0.5B, the engine on its
default SmolLM2-135M) over one store: the engine reports the mismatch at start-up, naming both fingerprints and both
files, and a splice it is asked for is refused with that reason, instead of every tool silently missing its block."""

from __future__ import annotations

import logging

import grpc
import pytest

from nexus.v1 import engine_pb2, engine_pb2_grpc
from services.common.models import (
    GENERATOR_MODEL,
    file_fingerprint,
    gguf_manifest,
    resolve_generator_gguf,
    small_gguf_path,
)
from services.common.store import LocalStore
from tests.conftest import start_compiler, start_engine

pytestmark = pytest.mark.integration


def test_an_engine_on_another_gguf_than_the_compiler_reports_both(tmp_path, small_tools, caplog):
    qwen = resolve_generator_gguf("")  # installed by `make setup` (scripts/install_gguf.py)
    qwen_fp = gguf_manifest()[GENERATOR_MODEL]["sha256"]
    smol = small_gguf_path()
    smol_fp = file_fingerprint(smol)
    store_url = str(tmp_path / "store")
    # the compiler compiles no block here (no tool registered while it starts, no backfill): only its model counts
    compiler = start_compiler(store_url, model_path=str(qwen), kv_backfill=False)
    engine = None
    try:
        with caplog.at_level(logging.INFO, logger="nexus.engine"):
            engine = start_engine(store_url, n_threads=1)
        errors = [r.getMessage() for r in caplog.records if r.name == "nexus.engine" and r.levelno == logging.ERROR]
        assert errors, "the engine started on another model than the compiler's without an error"
        for part in (qwen_fp, str(qwen), smol_fp, str(smol)):
            assert part in errors[0]

        LocalStore(store_url).registry_put([t for t in small_tools if t.name == "get_current_time"])
        with grpc.insecure_channel(engine.addr) as ch:
            stub = engine_pb2_grpc.EngineServiceStub(ch)
            req = engine_pb2.GenerateRequest(query="what time is it in Tokyo", tool="get_current_time",
                                             prefill=engine_pb2.PREFILL_PATH_SPLICE)
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(req, timeout=120))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert qwen_fp in e.value.details() and smol_fp in e.value.details()
    finally:
        if engine is not None:
            engine.stop()
        compiler.stop()


def test_an_engine_on_the_compilers_gguf_reports_no_mismatch(tmp_path, caplog):
    store_url = str(tmp_path / "store")
    compiler = start_compiler(store_url, kv_backfill=False)  # both on the default model (the tests': SmolLM2-135M)
    engine = None
    try:
        with caplog.at_level(logging.INFO, logger="nexus.engine"):
            engine = start_engine(store_url, n_threads=1)
        ours = [r for r in caplog.records if r.name == "nexus.engine"]
        assert not [r for r in ours if r.levelno >= logging.ERROR]
        assert any("the compiler's model is the engine's" in r.getMessage() for r in ours)
    finally:
        if engine is not None:
            engine.stop()
        compiler.stop()
