"""A gate model built on a given encoder (GateHyperParams.encoder: the public-trained one in production): the encoder
keeps its weights (q_epochs = 0: nothing of the registry's lines in them), no cross-encoder is trained (ce_epochs =
0), the exemplar keys and SLB weights are still calibrated, and a real router keys every tool with the model's own
graph (gate.json tool_keys), cached in the store under that graph's fingerprint."""

import asyncio
import json

import numpy as np
import pytest

from tests.conftest import QUERIES, REPO, SMALL_SERVERS, TOOLS_DIR


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from services.common.models import default_embedder_path
    from training.data import equivalents, load_augment, load_queries, load_registry
    from training.gate import GateHyperParams, train_gate

    registry = load_registry(TOOLS_DIR)
    names = {t.name for t in registry.tools if registry.server_of[t.name] in SMALL_SERVERS}
    lines = [ln for ln in load_queries(QUERIES) if ln.server in SMALL_SERVERS]
    augment = [ln for ln in load_augment(str(REPO / "data" / "routing_augment")) if ln.tool in names][:60]
    # a copy of the wheel's MiniLM stands in for the public encoder: another directory, another fingerprint
    import shutil

    encoder = tmp_path_factory.mktemp("encoder") / "enc"
    shutil.copytree(default_embedder_path(), encoder)
    (encoder / "public_meta.json").write_text("{}")
    hp = GateHyperParams(seed=1, q_epochs=0, ce_epochs=0, val_fraction=0.25, threads=1, encoder=str(encoder))
    out = tmp_path_factory.mktemp("gate-on-encoder") / "gate"
    doc = train_gate(lines, [t for t in registry.tools if t.name in names], out, hp, equivalents=equivalents,
                     progress=False, extra=augment)
    return out, doc, [t for t in registry.tools if t.name in names]


def test_the_encoder_keeps_its_weights_and_no_cross_encoder_is_trained(built):
    from sentence_transformers import SentenceTransformer

    from services.common.models import default_embedder_path

    out, doc, _ = built
    assert doc["tool_keys"] == "query_encoder" and doc["alpha"] == 0.0
    assert doc["query_encoder"]["best_epoch"] == 0 and not (out / "cross_encoder").exists()
    assert doc["slb"]["n_exemplars"] > 0  # exemplar keys and the SLB weights are calibrated all the same
    text = "set the key session:42 to active"
    a = SentenceTransformer(str(out / "query_encoder"), device="cpu").encode([text], normalize_embeddings=True)
    b = SentenceTransformer(str(default_embedder_path()), device="cpu").encode([text], normalize_embeddings=True)
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_router_keys_the_tools_with_the_gate_models_own_graph(built, tmp_path):
    from services.common.embedder import Embedder
    from services.common.store import LocalStore, artifact_key
    from services.compiler.compiler import KIND_EMBEDDING
    from services.router.config import RouterConfig
    from services.router.router import Router

    out, _, tools = built
    store = LocalStore(str(tmp_path / "store"))
    store.registry_put(tools)
    router = Router(RouterConfig(store_url=str(tmp_path / "store"), gate_model_dir=str(out), native_scan=False),
                    store, Embedder(""))
    # built on another encoder than the router's base embedder: loaded all the same (it keys the tools itself)
    assert router.gate is not None and router.gate.info.meta["tool_keys"] == "query_encoder"
    assert router.gate.info.meta["base_embedder_fingerprint"] != router.embedder.fingerprint
    asyncio.run(router.sync(force=True))
    fp = router.gate.fingerprint
    assert fp != router.embedder.fingerprint
    for t in tools:  # every text key is the gate graph's vector of the tool text, cached under its fingerprint
        key = artifact_key(KIND_EMBEDDING, fp, t.schema_hash)
        assert store.exists(key)
        v = np.frombuffer(store.get(key), "<f4")
        from services.common.embedder import tool_text

        np.testing.assert_allclose(v, router.gate.embed_query(tool_text(t)), atol=1e-5)
    d = router.route("what time is it in Tokyo right now?")
    assert d.tool == "get_current_time" and not d.escalated
    meta = json.loads((out / "gate.json").read_text())
    assert meta["hyperparams"]["encoder"]


def test_a_gate_that_names_the_document_form_keys_its_tools_by_it(built, tmp_path):
    """gate.json tool_text = the public encoders' document form: the router embeds ``tool_doc`` (name as words,
    description, parameter names), cached under a key of its own so vectors of the other form are never reused."""
    import shutil

    from services.common.embedder import DOC_VERSION, Embedder, tool_doc, tool_text
    from services.common.store import LocalStore, artifact_key
    from services.compiler.compiler import KIND_EMBEDDING
    from services.router.config import RouterConfig
    from services.router.router import Router

    out, _, tools = built
    gate = tmp_path / "gate"
    shutil.copytree(out, gate)
    meta = json.loads((gate / "gate.json").read_text())
    (gate / "gate.json").write_text(json.dumps({**meta, "tool_text": DOC_VERSION}))
    store = LocalStore(str(tmp_path / "store"))
    store.registry_put(tools)
    router = Router(RouterConfig(store_url=str(tmp_path / "store"), gate_model_dir=str(gate), native_scan=False),
                    store, Embedder(""))
    asyncio.run(router.sync(force=True))
    fp, served = router.gate.fingerprint, store.registry_snapshot()[0]
    assert set(served) == {t.name for t in tools}
    for t in served.values():  # the registry's form of each tool (its schema as stored) is what is keyed
        assert tool_doc(t) != tool_text(t)
        assert not store.exists(artifact_key(KIND_EMBEDDING, fp, t.schema_hash))
        v = np.frombuffer(store.get(artifact_key(KIND_EMBEDDING, router._key_encoder()[0], t.schema_hash)), "<f4")
        np.testing.assert_allclose(v, router.gate.embed_query(tool_doc(t)), atol=1e-5)
    assert router.route("what time is it in Tokyo right now?").tool == "get_current_time"


def test_a_gate_keys_tools_in_its_encoders_own_document_form_unless_told(tmp_path):
    from services.common.embedder import DOC_VERSION, NAME_DESC
    from training.gate import GateHyperParams, key_form

    enc = tmp_path / "enc"
    enc.mkdir()
    assert key_form(GateHyperParams()) == NAME_DESC  # base MiniLM
    assert key_form(GateHyperParams(encoder=str(enc))) == NAME_DESC  # an encoder that names no form
    (enc / "public_meta.json").write_text(json.dumps({"doc": DOC_VERSION}))
    assert key_form(GateHyperParams(encoder=str(enc))) == DOC_VERSION  # a training.public encoder
    assert key_form(GateHyperParams(encoder=str(enc), tool_text=NAME_DESC)) == NAME_DESC
    with pytest.raises(ValueError, match="unknown tool key text"):
        key_form(GateHyperParams(tool_text="name-only"))
