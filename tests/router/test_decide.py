"""``Router.decide`` as a unit: no trained model, no MiniLM: a tiny bag-of-words encoder is injected, so what the
SLB scan, the margin, the top-k, the lexical addend and the empty-registry error do is checked exactly."""

import asyncio
import hashlib

import numpy as np
import pytest

from services.common.errors import FailedPrecondition
from services.common.store import LocalStore
from services.common.tools import Tool
from services.router.config import RouterConfig
from services.router.router import Router

DIM = 64


class BagOfWords:
    """A deterministic toy encoder with the Embedder interface: each word hashes to one of DIM axes."""

    dim = DIM
    fingerprint = "bow-" + "0" * 60

    def embed(self, texts, batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(":", " ").replace(".", " ").replace("_", " ").split():
                out[i, int(hashlib.sha256(w.encode()).hexdigest(), 16) % DIM] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


TOOLS = [Tool("weather_now", "Current weather for a city.", {"type": "object"}),
         Tool("time_now", "Current time in a timezone.", {"type": "object"}),
         Tool("file_read", "Read a file from disk.", {"type": "object",
                                                      "properties": {"path": {"type": "string"}}})]


def router(tmp_path, tools=TOOLS, **kw) -> Router:
    store = LocalStore(tmp_path / "store")
    if tools:
        store.registry_put(tools)
    cfg = RouterConfig(store_url=str(store.root), gate_model_dir="", native_scan=False, **kw)
    r = Router(cfg, store, BagOfWords())
    asyncio.run(r.sync(force=True))
    return r


def test_decide_ranks_by_the_scan_and_reports_the_margin_and_top_k(tmp_path):
    r = router(tmp_path)
    d = r.decide("current weather for paris city", k=2)
    assert d.tool == "weather_now" and d.gate == "slb-only" and not d.escalated
    assert [n for n, _ in d.candidates] == [n for n, _ in d.slb_candidates[:2]] and len(d.candidates) == 2
    assert d.margin == pytest.approx(d.slb_candidates[0][1] - d.slb_candidates[1][1], abs=1e-6)
    # the INT8 scan's score is the cosine of the toy vectors, to quantization error
    q = BagOfWords().embed_one("current weather for paris city")
    t = BagOfWords().embed_one("weather now: Current weather for a city.")
    assert d.score == pytest.approx(float(q @ t), abs=0.03)
    assert r.decide("read the file notes.txt from disk", k=1).tool == "file_read"


def test_allowed_restricts_the_candidates_to_a_subset(tmp_path):
    r = router(tmp_path)
    names = r.index.names()
    allowed = np.array([n != "weather_now" for n in names])
    d = r.decide("current weather for paris city", k=3, allowed=allowed)
    assert d.tool != "weather_now" and "weather_now" not in dict(d.candidates)


def test_the_lexical_addend_moves_a_tool_whose_name_words_the_request_uses(tmp_path):
    plain = dict(router(tmp_path / "a").decide("file path please", k=3).candidates)
    lex = dict(router(tmp_path / "b", lexical_weight=1.0).decide("file path please", k=3).candidates)
    # file_read's BM25 document holds "file" (its name) and "path" (its parameter): its score rises the most
    gains = {n: lex[n] - plain[n] for n in plain}
    assert max(gains, key=gains.get) == "file_read" and gains["file_read"] > 0.5


def test_an_empty_registry_is_a_clear_error(tmp_path):
    r = router(tmp_path, tools=[])
    with pytest.raises(FailedPrecondition, match="RegisterTools"):
        r.decide("anything", k=1)
