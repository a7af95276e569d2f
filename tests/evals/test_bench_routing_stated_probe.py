"""bench/routing_stated_probe.py: the probe's targets, its training step and its reader interface, with the real
MiniLM weights and real slot examples (the full training and its figures are the bench's)."""

import numpy as np
import pytest

from tests.conftest import load_bench


@pytest.fixture(scope="module")
def probe_parts(all_tools):
    from transformers import AutoTokenizer

    from services.common.models import resolve_embedder
    from services.training.data import QueryLine
    from services.training.slots import SlotHyperParams, make_examples

    sp = load_bench("routing_stated_probe")
    base = str(resolve_embedder(""))
    by_name = {t.name: t for t in all_tools}
    lines = [QueryLine(id="p1", server="kubernetes", tool="pods_list_in_namespace", query="list the pods in the kube-system namespace",
                       args={"namespace": "kube-system"}, history=()),
             QueryLine(id="p2", server="kubernetes", tool="pods_get", query="show me pod web-7f9 in namespace shop",
                       args={"name": "web-7f9", "namespace": "shop"}, history=())]
    examples = make_examples(lines, by_name, SlotHyperParams())
    return sp, AutoTokenizer.from_pretrained(base), sp.build_probe(base), examples, by_name


def test_span_targets_point_at_the_answer_or_cls(probe_parts):
    sp, tok, model, examples, _ = probe_parts
    groups = sp.by_context(examples)
    _, logits, cenc = sp.span_loss(model, tok, groups)
    targets = sp.span_targets(cenc, groups)
    flat = [e for _, x in groups for e in x]
    assert logits.shape[0] == len(flat) == len(targets)
    offsets = cenc["offset_mapping"].tolist()
    owner = [i for i, (_, x) in enumerate(groups) for _ in x]
    stated = [(e, t, i) for e, t, i in zip(flat, targets, owner, strict=True) if e.start >= 0]
    assert stated and all(t == 0 for e, t in zip(flat, targets, strict=True) if e.start < 0)
    for e, t, i in stated:
        a, b = offsets[i][t]
        assert t > 0 and a <= e.start < b  # the answer's first token
    assert (logits[:, 0] > -1e3).all()  # [CLS] stays a choice; [SEP] does not
    sep = cenc["input_ids"] == tok.sep_token_id
    assert (logits[sep[owner]] <= -1e3).all()


def test_training_steps_lower_the_loss_on_what_they_see(probe_parts):
    sp, tok, model, examples, _ = probe_parts
    import copy

    m = copy.deepcopy(model)
    groups = sp.by_context(examples)
    before = sp.span_loss(m, tok, groups)[0].item()
    sp.train_span(m, tok, groups * 4, epochs=3, bs=2, lr=1e-4, progress=False)
    assert sp.span_loss(m, tok, groups)[0].item() < before


def test_probe_reader_answers_each_question_and_caches_question_vectors(probe_parts):
    sp, tok, model, _, by_name = probe_parts
    from services.router.argevidence import read

    reader = sp.ProbeReader(model, tok, 0.0, {"format": "stated-probe/test", "data_hash": "x"})
    tools = [by_name["pods_list_in_namespace"], by_name["pods_list"], by_name["pods_get"]]
    readings = read(reader, "list the pods in the kube-system namespace", tools, required_only=False)
    from services.engine.slots import slot_params, slot_question

    assert [len(r) for r in readings] == [len(slot_params(t)) for t in tools]
    assert all(np.isfinite(s) for r in readings for _, _, s in r)
    n = len(reader._q)
    assert n == len({slot_question(t, p, prop) for t in tools for p, prop in slot_params(t)})
    again = read(reader, "list the pods in the kube-system namespace", tools, required_only=False)
    assert again == readings and len(reader._q) == n  # same scores, no new question encoded
    assert reader.score([], "anything") == []


def test_stated_figures_and_plot(tmp_path):
    sp = load_bench("routing_stated_probe")
    f = sp.stated_figures(np.array([-2.0, -1.0, 1.0, 3.0]), np.array([False, False, True, True]))
    assert f["auc"] == 1.0 and f["accuracy"] == 1.0 and -1.0 <= f["threshold"] < 1.0
    mixed = sp.stated_figures(np.array([-2.0, 1.0, -1.0, 3.0]), np.array([False, False, True, True]))
    assert mixed["auc"] == 0.75 and mixed["accuracy"] == 0.75
    lat = {"p50": 10.0, "p90": 20.0, "p95": 30.0, "p99": 40.0}
    report = {"stated": {"slot reader": f, "probe": mixed}, "read_ms_per_escalation": {"slot reader": lat,
                                                                                      "probe": lat}}
    sp.plot(report, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
