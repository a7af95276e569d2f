"""The router's derived keys (services/compiler/derive.py artifacts in the store): read by schema hash for tools
with no trained exemplar keys, embedded once, pooled into the SLB score, picked up by ``sync`` when they arrive."""

import asyncio

import numpy as np
import pytest

from services.common.embedder import Embedder
from services.common.store import LocalStore
from services.common.tools import Tool
from services.compiler.derive import derived_key, encode_derived
from services.router.config import RouterConfig
from services.router.router import Router

FP = "d" * 64
A = Tool("box_open", "Open a box.", {"type": "object"})
B = Tool("box_close", "Close a box.", {"type": "object"})


@pytest.fixture(scope="module")
def embedder():
    return Embedder("")


def _router(store, embedder, **kw):
    kw = {"derived_keys": True, **kw}
    cfg = RouterConfig(store_url=str(store.root), gate_model_dir="", native_scan=False, derived_fingerprint=FP, **kw)
    r = Router(cfg, store, embedder)
    asyncio.run(r.sync(force=True))
    return r


def test_derived_requests_become_exemplar_keys_by_schema_and_arrive_without_a_new_registration(embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put([A, B])
    r = _router(store, embedder, derived_weight=1.0, derived_temperature=0.0)
    assert {n: e.keys for n, e in r.view.tools.items()} == {"box_open": "pending", "box_close": "pending"}
    assert r.index._snap.n_exemplars == 0
    before = dict(r.route("shut the lid of the crate", top_k=2).candidates)
    assert not asyncio.run(r.sync())  # nothing arrived: no reload
    reqs = ["shut the lid of the crate", "seal the carton"]
    store.put(derived_key(B, FP), encode_derived(B, reqs, {"fingerprint": FP}))
    assert asyncio.run(r.sync())  # same registry version, but a pending tool's keys arrived
    assert r.view.tools["box_close"].keys == "derived" and r.view.tools["box_open"].keys == "pending"
    assert r.index._snap.n_exemplars == 2
    after = dict(r.route("shut the lid of the crate", top_k=2).candidates)
    # box_close's exemplar is the query itself: text + 1.0 x 1.0; box_open, still without keys, text + 1.0 x text
    q = embedder.embed_one("shut the lid of the crate")
    text_b = float(np.dot(q, embedder.embed_one("box close: Close a box.")))
    assert after["box_close"] == pytest.approx(text_b + 1.0, abs=0.03)
    assert after["box_close"] > before["box_close"]
    # a tool re-described is another schema: its old derived requests are not its keys
    B2 = Tool(B.name, B.description + " Slowly.", B.input_schema)
    store.registry_put([B2])
    asyncio.run(r.sync())
    assert r.view.tools["box_close"].keys == "pending"
    # derived keys off: text keys only, whatever the store holds
    off = _router(store, embedder, derived_keys=False)
    assert {e.keys for e in off.view.tools.values()} == {"text"} and off.index._snap.n_exemplars == 0


def test_an_unreadable_derived_artifact_leaves_the_tool_on_its_text_key(embedder, tmp_path):
    store = LocalStore(tmp_path / "store")
    store.registry_put([A])
    store.put(derived_key(A, FP), b'{"requests": "not a list"}')
    r = _router(store, embedder)
    assert r.view.tools["box_open"].keys == "text" and r.route("open it").tool == "box_open"


def test_a_configured_lexical_weight_adds_the_bm25_score_without_a_gate_model(embedder, tmp_path):
    from services.router.keys import LexicalIndex

    store = LocalStore(tmp_path / "store")
    store.registry_put([A, B])
    plain = dict(_router(store, embedder, derived_keys=False).route("close the box", top_k=2).candidates)
    lex = _router(store, embedder, derived_keys=False, lexical_weight=0.5)
    got = dict(lex.route("close the box", top_k=2).candidates)
    bm25 = dict(zip(sorted(["box_open", "box_close"]),
                    LexicalIndex.of_tools(sorted([A, B], key=lambda t: t.name)).scores("close the box"), strict=True))
    for n in plain:
        assert got[n] == pytest.approx(plain[n] + 0.5 * bm25[n], abs=1e-4)
    assert bm25["box_close"] == 1.0 and got["box_close"] > plain["box_close"]
