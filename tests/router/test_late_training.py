"""services/training/late_reader.py: the head's targets, a real training step, the cached escalation path against the
batch path, its reader behind the argument-evidence stage, over the real MiniLM weights and real slot examples, and the
export `nexus train-late-reader` writes (the full training is `make setup`'s; its held-out figures
are `nexus eval routing`'s)."""

from pathlib import Path

import numpy as np
import pytest

from services.router.late_reader import LAYERS
from services.training import late_reader as late_training


@pytest.fixture(scope="module")
def late_parts(all_tools):
    import torch
    from sentence_transformers import SentenceTransformer

    from services.common.models import resolve_embedder
    from services.training.data import QueryLine

    lr = late_training
    st = SentenceTransformer(str(resolve_embedder("")), device="cpu")
    transformer, tok = st[0].auto_model.eval(), st.tokenizer
    by_name = {t.name: t for t in all_tools}
    lines = [QueryLine(id="p1", server="kubernetes", tool="pods_list_in_namespace",
                       query="list the pods in the kube-system namespace", args={"namespace": "kube-system"},
                       history=()),
             QueryLine(id="p2", server="kubernetes", tool="pods_get", query="show me pod web-7f9 in namespace shop",
                       args={"name": "web-7f9", "namespace": "shop"}, history=())]
    examples = lr.routing_examples(lines, by_name)
    cs = lr.encode_states(transformer, tok, [e.context for e in examples])
    qs = lr.encode_states(transformer, tok, [e.question for e in examples])
    torch.manual_seed(0)
    return lr, transformer, tok, lr.build_head().eval(), examples, qs, cs, by_name


def test_examples_are_cut_from_the_routing_text_and_answers_map_to_their_tokens(late_parts):
    lr, _, tok, _, examples, qs, cs, _ = late_parts
    from services.router.router import routing_text

    assert {e.context for e in examples} == {routing_text("list the pods in the kube-system namespace", [], 4),
                                              routing_text("show me pod web-7f9 in namespace shop", [], 4)}
    stated = [e for e in examples if e.start >= 0]
    assert {e.context[e.start:e.end] for e in stated} == {"kube-system", "web-7f9", "shop"}
    for e in examples:
        h, offsets = cs[e.context]
        assert h.shape == (LAYERS, len(offsets), 384) and qs[e.question][0].shape[0] == LAYERS
        s, t = lr.answer_tokens(offsets, e.start, e.end)
        if e.start < 0:
            assert (s, t) == (0, 0)
            continue
        assert 0 < s <= t < len(offsets) - 1  # inside the request, never [CLS] or [SEP]
        assert offsets[s][0] <= e.start < offsets[s][1] and offsets[t][0] < e.end <= offsets[t][1]
        ids = tok(e.context)["input_ids"]
        assert tok.decode(ids[s:t + 1]).replace(" ", "") == e.context[e.start:e.end].lower().replace(" ", "")
    assert lr.answer_tokens(cs[stated[0].context][1], 10_000, 10_005) == (0, 0)  # not found: not stated


def test_span_mask_keeps_the_request_without_cls_and_sep():
    import torch

    lr = late_training
    mc = torch.tensor([[True, True, True, True, False], [True, True, True, True, True]])
    assert lr.span_mask(mc).tolist() == [[False, True, True, False, False], [False, True, True, True, False]]
    h, m = lr.pad_states([torch.ones(LAYERS, 3, 4), torch.ones(LAYERS, 5, 4)])
    assert h.shape == (2, LAYERS, 5, 4) and m.sum(1).tolist() == [3, 5] and h[0, :, 3:].abs().sum() == 0


def test_length_batches_hold_every_item_once_in_batches_of_like_length():
    import random

    lr = late_training
    rng = random.Random(0)
    items = [rng.randint(5, 150) for _ in range(1000)]
    got = lr.length_batches(list(enumerate(items)), 32, random.Random(1), lambda x: x[1], pool=10)
    assert sorted(i for b in got for i, _ in b) == list(range(1000))
    assert [len(b) for b in got].count(32) == 1000 // 32 and all(0 < len(b) <= 32 for b in got)

    def padded(batches):  # what a batch costs: its longest item per row
        return sum(max(n for _, n in b) * len(b) for b in batches)

    shuffled = list(enumerate(items))
    random.Random(1).shuffle(shuffled)
    plain = [shuffled[b:b + 32] for b in range(0, 1000, 32)]
    assert padded(got) < 0.7 * padded(plain)
    again = lr.length_batches(list(enumerate(items)), 32, random.Random(1), lambda x: x[1], pool=10)
    assert got == again  # the seed decides
    assert got != lr.length_batches(list(enumerate(items)), 32, random.Random(2), lambda x: x[1], pool=10)


def test_logits_read_each_distinct_question_and_request_once_with_the_same_result(late_parts):
    import torch

    lr, _, _, head, examples, qs, cs, _ = late_parts
    rows = examples * 2
    q = [qs[x.question][0] for x in rows]
    c = [cs[x.context][0] for x in rows]
    uq, qi = lr.distinct_rows(q)
    uc, ci = lr.distinct_rows(c)
    assert len(uq) == len({x.question for x in examples}) and len(uc) == len({x.context for x in examples})
    assert all(q[i] is uq[j] for i, j in enumerate(qi.tolist())) and all(c[i] is uc[j] for i, j in enumerate(ci.tolist()))
    with torch.no_grad():
        shared = lr.logits(head, q, c)
        own = lr.logits(head, [t.clone() for t in q], [t.clone() for t in c])  # every row distinct
    for a, b in zip(shared, own, strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-5)


def test_training_steps_lower_the_loss_on_what_they_see(late_parts):
    import copy

    import torch

    lr, _, _, head, examples, qs, cs, _ = late_parts
    h = copy.deepcopy(head)

    def loss():
        with torch.no_grad():
            h.eval()
            s, e, _ = lr.logits(h, [qs[x.question][0] for x in examples], [cs[x.context][0] for x in examples])
            ans = [lr.answer_tokens(cs[x.context][1], x.start, x.end) for x in examples]
            ce = torch.nn.functional.cross_entropy
            return float(ce(s, torch.tensor([a for a, _ in ans])) + ce(e, torch.tensor([b for _, b in ans])))

    before = loss()
    losses = lr.train_head(h, examples * 4, qs, cs, epochs=3, bs=4, lr=1e-3, progress=False)
    assert len(losses) == 3 * ((len(examples) * 4 + 3) // 4) and all(np.isfinite(losses))
    assert loss() < before
    assert not h.training


def test_a_heads_seed_decides_its_training_and_its_cache(late_parts, tmp_path):
    """`nexus train-late-reader --seed`: the same seed trains the same head (reused from the cache the second time),
    another seed another head under another cache key; seed 0 keeps the product's key."""
    import torch

    from services.common.models import resolve_embedder

    lr, _, _, _, examples, _, _, _ = late_parts
    gate = tmp_path / "gate-x"
    gate.mkdir()
    (gate / "query_encoder").symlink_to(Path(resolve_embedder("")).resolve())
    heads = {}
    for seed in (0, 7, 7):
        reader, rec, _ = lr.head_for(gate, examples, examples, tmp_path / "heads", epochs=1, retrain=False,
                                     progress=False, seed=seed)
        heads.setdefault(seed, []).append((reader.head.state_dict(), rec))
    (s0, r0), = heads[0]
    (s7, r7), (s7b, r7b) = heads[7]
    assert r0["seed"] == 0 and r7["seed"] == 7 and "reused" in r7b and "reused" not in r7
    assert r0["stated"] and sorted(p.name for p in (tmp_path / "heads" / "gate-x").iterdir()) != []
    assert all(torch.equal(a, b) for a, b in zip(s7.values(), s7b.values(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(s0.values(), s7.values(), strict=True))
    assert len(list((tmp_path / "heads" / "gate-x").glob(f"head-*{lr.HEAD_SUFFIX}"))) == 2
    assert lr.seed_settings([8, 2], 0) == [8, 2] and lr.seed_settings([8, 2], 3) == [8, 2, {"seed": 3}]


def test_span_stated_is_the_readers_score_and_has_gradients(late_parts):
    import torch

    lr, _, _, head, examples, qs, cs, _ = late_parts
    s, e, mc = lr.logits(head, [qs[x.question][0] for x in examples], [cs[x.context][0] for x in examples])
    with torch.no_grad():
        assert np.allclose(lr.span_stated(s, e, mc).numpy(), lr.stated_scores(head, examples, qs, cs), atol=1e-4)
    # a span longer than max_tokens is not a candidate: one token allowed can only score less or equal
    assert (lr.span_stated(s, e, mc, max_tokens=1) <= lr.span_stated(s, e, mc) + 1e-6).all()
    lr.span_stated(s, e, mc).sum().backward()
    assert head.qa.weight.grad is not None and head.qa.weight.grad.abs().sum() > 0
    head.zero_grad()


def test_distillation_moves_the_heads_scores_to_the_teachers(late_parts):
    import copy
    from dataclasses import replace

    import torch

    lr, _, _, head, examples, qs, cs, _ = late_parts
    h = copy.deepcopy(head)
    ctx = sorted({e.context for e in examples})
    questions = sorted({e.question for e in examples})
    # the teacher says: every question stated in the first request, none in the second
    teacher = [(ctx[0], questions, [6.0] * len(questions)), (ctx[1], questions, [-6.0] * len(questions))]

    def error():
        with torch.no_grad():
            got = [lr.stated_scores(h, [replace(examples[0], context=c, question=q) for q in qq], qs, cs)
                   for c, qq, _ in teacher]
        return float(np.mean([np.abs(g - np.array(y)).mean() for g, (_, _, y) in zip(got, teacher, strict=True)]))

    before = error()
    losses = lr.distill_head(h, teacher * 8, examples, qs, cs, epochs=3, bs=2, lr=2e-3, progress=False)
    assert len(losses) == 3 * 8 and all(np.isfinite(losses))
    assert error() < before / 2
    assert not h.training


def test_cached_escalation_path_matches_the_batch_path(late_parts):
    lr, transformer, tok, head, examples, qs, cs, _ = late_parts
    reader = lr.torch_reader(head, transformer, tok, 0.0, {"format": "late-reader/test", "data_hash": "x"})
    ctx = examples[0].context
    mine = [e for e in examples if e.context == ctx]
    batch = lr.stated_scores(head, mine, qs, cs)
    cached = [r[0][2] for r in reader.score([e.question for e in mine], ctx)]
    assert len(mine) >= 2 and np.allclose(batch, cached, atol=1e-4)


def test_reader_answers_each_question_and_caches_question_keys(late_parts):
    lr, transformer, tok, head, _, _, _, by_name = late_parts
    from services.engine.slots import slot_params, slot_question
    from services.router.argevidence import read

    reader = lr.torch_reader(head, transformer, tok, 0.0, {"format": "late-reader/test", "data_hash": "x"})
    tools = [by_name["pods_list_in_namespace"], by_name["pods_list"], by_name["pods_get"]]
    text = "list the pods in the kube-system namespace"
    readings = read(reader, text, tools, required_only=False)
    assert [len(r) for r in readings] == [len(slot_params(t)) for t in tools]
    assert all(np.isfinite(s) for r in readings for _, _, s in r)
    n = len(reader._q)
    assert n == len({slot_question(t, p, prop) for t in tools for p, prop in slot_params(t)})
    assert len(reader._q[next(iter(reader._q))]) == len(head.layers)  # keys and values at every layer
    assert read(reader, text, tools, required_only=False) == readings and len(reader._q) == n
    assert reader.score([], "anything") == []


def test_states_graph_gives_the_router_vector_and_the_heads_states(late_parts, tmp_path):
    import onnxruntime as ort
    import torch

    lr, transformer, tok, _, _, _, cs, _ = late_parts
    graph = tmp_path / "with_states.onnx"
    lr.export_states_graph(transformer, tok, graph)
    sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    text = next(iter(cs))
    feats = tok([text], return_tensors="np")
    vec, states = sess.run(None, {i.name: feats[i.name].astype(np.int64) for i in sess.get_inputs()})
    with torch.inference_mode():
        out = transformer(**tok([text], return_tensors="pt"))
    mean = out.last_hidden_state[0].mean(0)
    assert not transformer.training  # the export leaves the encoder as it found it
    assert np.allclose(vec[0], (mean / mean.norm()).numpy(), atol=1e-4)
    assert states.shape == (1, LAYERS, len(cs[text][1]), 384)
    assert np.allclose(states[0], cs[text][0].float().numpy(), atol=2e-2)  # the bench keeps them in float16


def test_route_loss_is_the_listwise_loss_of_the_fused_scores():
    import torch

    lr = late_training
    # two candidates: the first states both of its parameters (one required), the second its one required one not
    g = {"slb": [0.50, 0.52], "right": [True, False],
         "questions": [[("a?", True), ("b?", False)], [("c?", True)]]}
    scores = torch.tensor([8.0, 3.0, -6.0])
    alphas = torch.tensor([0.05, 0.1])
    got = lr.route_loss(scores, [g], beta=10.0, alphas=alphas, threshold=0.0)
    stated = [torch.sigmoid(torch.tensor(8.0)) + torch.sigmoid(torch.tensor(3.0)), torch.sigmoid(torch.tensor(-6.0))]
    rmin = [-0.1 * torch.logsumexp(torch.tensor([-0.8 / 0.1]), 0), torch.tensor(-0.6)]  # one required each: itself
    z = 10.0 * torch.stack([0.50 + 0.05 * stated[0] + 0.1 * rmin[0], 0.52 + 0.05 * stated[1] + 0.1 * rmin[1]])
    assert torch.allclose(got, -torch.log_softmax(z, 0)[0], atol=1e-5)
    # the evidence turns the SLB's wrong order: the loss is below the SLB's own
    assert got < lr.route_loss(scores, [g], beta=10.0, alphas=torch.zeros(2), threshold=0.0)
    # equivalents: every right candidate counts; a candidate with nothing to read adds nothing
    g2 = {"slb": [0.5, 0.5, 0.4], "right": [True, True, False], "questions": [[], [], [("x?", True)]]}
    two = lr.route_loss(torch.tensor([-10.0]), [g2], beta=1.0, alphas=alphas, threshold=0.0)
    z2 = torch.tensor([0.5, 0.5, 0.4 + 0.05 * torch.sigmoid(torch.tensor(-10.0)) + 0.1 * -1.0])
    assert torch.allclose(two, torch.logsumexp(z2, 0) - torch.logsumexp(z2[:2], 0), atol=1e-5)


def test_fit_beta_prefers_sharper_scores_when_the_slb_is_right():
    lr = late_training
    right = [{"slb": [0.6, 0.4], "right": [True, False]}] * 9
    wrong = [{"slb": [0.4, 0.6], "right": [True, False]}]
    assert lr.fit_beta(right + wrong) > lr.fit_beta(right + wrong * 4) >= 1.0


def test_route_tuning_moves_the_decision_to_the_right_candidate(late_parts):
    import copy

    import torch

    lr, _, _, head, examples, qs, cs, by_name = late_parts
    from services.engine.slots import slot_params, slot_question

    h = copy.deepcopy(head)
    ctx = {e.context for e in examples}
    c1 = next(c for c in ctx if "kube-system" in c)
    # the SLB prefers pods_list, the request states the namespace only pods_list_in_namespace asks for
    t1, t2 = by_name["pods_list_in_namespace"], by_name["pods_list"]
    qq = [[(slot_question(t, n, p), n in set(t.input_schema.get("required") or [])) for n, p in slot_params(t)]
          for t in (t1, t2)]
    qs.update(lr.encode_states(*late_parts[1:3], [q for x in qq for q, _ in x]))
    g = {"id": "p1", "context": c1, "cand": [t1.name, t2.name], "slb": [0.50, 0.51], "right": [True, False],
         "questions": qq}

    # easy decisions with nothing to read: the SLB is right on them, so beta comes out sharp
    easy = [{"id": f"e{i}", "context": c1, "cand": ["x", "y"], "slb": [0.6, 0.4], "right": [True, False],
             "questions": [[], []]} for i in range(24)]
    beta = lr.fit_beta([g] * 8 + easy)
    assert beta > 10

    def loss():  # the hard decision's loss at the starting weights: lower when the head's evidence favours t1 more
        pairs = [q for x in qq for q, _ in x]
        with torch.no_grad():
            s, e, mc = lr.logits(h, [qs[q][0] for q in pairs], [cs[c1][0]] * len(pairs))
            return float(lr.route_loss(lr.span_stated(s, e, mc), [g], beta, torch.tensor([0.05, 0.1]), 0.0))

    before = loss()
    losses, w = lr.route_tune(h, [g] * 8 + easy, examples, qs, cs, 0.0, epochs=3, bs=8, lr=2e-3, progress=False)
    assert len(losses) == 3 * 4 and all(np.isfinite(losses)) and not h.training
    assert w["beta"] == beta and w["a_stated"] > 0 and w["a_req_min"] > 0
    assert loss() < before


def test_route_groups_leave_each_line_out_of_the_production_slb(tools_dir):
    """``route_groups`` on real augment lines under the production gate model: the line's own exemplar row is out
    (its tool scores no higher than with it), the right tool is among the candidates, and only the parameters that
    not every candidate has are asked."""
    from services.engine.slots import slot_params
    from services.evals.routing_models import load_augment
    from services.router.argevidence import shared_names
    from services.training.data import load_registry
    from tests.conftest import REPO

    lr = late_training
    registry = load_registry(tools_dir)
    by_name = {t.name: t for t in registry.tools}
    lines = [ln for ln in load_augment(REPO / "data" / "routing_augment") if ln.tool.startswith("pods_")][:6]
    gate = REPO / "var" / "models" / "gate"
    groups = lr.route_groups(gate, lines, registry)
    kept = lr.route_groups(gate, [replace_id(ln) for ln in lines], registry)  # ids no row has: nothing left out
    assert groups and len(groups) == len(kept)
    for g, k in zip(groups, kept, strict=True):
        assert len(g["cand"]) == 4 and any(g["right"]) and g["context"] == k["context"]
        t = g["cand"][g["right"].index(True)]
        if t in k["cand"]:
            assert g["slb"][g["cand"].index(t)] <= k["slb"][k["cand"].index(t)] + 1e-6
        shared = shared_names([[n for n, _ in slot_params(by_name[c])] for c in g["cand"]])
        for c, qq in zip(g["cand"], g["questions"], strict=True):
            assert len(qq) == len([n for n, _ in slot_params(by_name[c]) if n not in shared])
    assert any(g["slb"][g["cand"].index(t)] < k["slb"][k["cand"].index(t)] - 1e-4
               for g, k in zip(groups, kept, strict=True)
               for t in [g["cand"][g["right"].index(True)]] if t in k["cand"])


def replace_id(ln):
    from dataclasses import replace

    return replace(ln, id=f"not-a-row-{ln.id}")


def test_export_key_follows_every_input_and_a_current_export_is_kept(tmp_path):
    """`make setup` runs the export on every fresh clone: the same settings, gate model, data and code give the same
    key (the reader is kept), any change gives another; a partial or foreign directory is never current."""
    import json

    lr = late_training
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "gate.json").write_text(json.dumps({"tau": 0.1}))
    data = tmp_path / "data"
    (data / "aug").mkdir(parents=True)
    (data / "aug" / "x.jsonl").write_text("{}\n")
    (data / "q.jsonl").write_text("{}\n")

    def key(settings=(8, 2, 2, 2.0, True), extra=b""):
        return lr.export_key(gate, [data / "q.jsonl", data / "aug" / "x.jsonl"], list(settings), extra)

    k = key()
    assert key() == k and len(k) == 16
    assert key((3, 2, 2, 2.0, True)) != k and key((8, 1, 2, 2.0, True)) != k and key(extra=b"fold 0") != k
    (data / "aug" / "x.jsonl").write_text('{"id": "changed"}\n')
    assert key() != k
    k = key()
    (gate / "gate.json").write_text(json.dumps({"tau": 0.2}))  # recalibrated in place
    assert key() != k
    out = tmp_path / "late_reader"
    assert not lr.export_current(str(out), k)  # nothing there
    out.mkdir()
    for f in ("head.safetensors", "states.onnx", "states.int8.onnx"):
        (out / f).write_bytes(b"x")
    (out / "late_reader.json").write_text(json.dumps({"export_key": k, "arg_evidence": {"feature": "req_min"}}))
    assert lr.export_current(str(out), k) and not lr.export_current(str(out), "another")
    (out / "states.int8.onnx").unlink()  # half an export
    assert not lr.export_current(str(out), k)
    (out / "late_reader.json").write_text("{not json")
    assert not lr.export_current(str(out), k)


def test_an_export_is_swapped_in_whole(tmp_path):
    lr = late_training
    out, new = tmp_path / "late_reader", tmp_path / ".late_reader.tmp"
    out.mkdir()
    (out / "old").write_text("old")
    new.mkdir()
    (new / "new").write_text("new")
    lr.swap_in(new, out)
    assert [p.name for p in out.iterdir()] == ["new"] and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late_reader"]  # the old one is gone
    fresh = tmp_path / ".fresh"
    fresh.mkdir()
    lr.swap_in(fresh, tmp_path / "first")  # nothing to replace
    assert (tmp_path / "first").is_dir()


def test_a_failed_export_leaves_the_old_reader_and_nothing_beside_it(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    from services.router import late_reader

    lr = late_training
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "gate.json").write_text(json.dumps({"hyperparams": {"q_max_len": 96}}))
    out = tmp_path / "models" / "late_reader"
    out.mkdir(parents=True)
    (out / "late_reader.json").write_text('{"old": true}')

    def half_written(path, *args, **kw):  # writes part of a reader, then fails (a full disk, Ctrl-C)
        path.mkdir(parents=True)
        (path / "head.safetensors").write_bytes(b"part")
        raise KeyboardInterrupt

    monkeypatch.setattr(late_reader, "save", half_written)
    reader = SimpleNamespace(head=None, transformer=None, tokenizer=None, threshold=0.0, meta={})
    with pytest.raises(KeyboardInterrupt):
        lr.export(reader, gate, [], None, [], str(out), key="k")
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["late_reader"]
    assert (out / "late_reader.json").read_text() == '{"old": true}'


def test_train_late_reader_names_a_missing_input_before_loading_anything(tmp_path, capsys):
    from services.cli import main
    from services.common.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="gate model: no .*make setup"):
        late_training.train_late_reader(tmp_path / "out", gate=tmp_path / "nogate", tools=tmp_path, queries=tmp_path,
                                        augment=tmp_path, calibration=tmp_path, heads=tmp_path / "heads")
    assert main(["train-late-reader", "--gate", str(tmp_path / "nogate"), "--queries", str(tmp_path / "q.jsonl"),
                 "--tools", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "gate model: no" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_train_late_reader_takes_a_seed_and_refuses_a_negative_one(tmp_path, monkeypatch, capsys):
    from services.cli import main

    got = {}

    def fake(out, **kw):
        got.update(kw)
        return {"kept": True, "export_key": "k"}

    monkeypatch.setattr(late_training, "train_late_reader", fake)
    args = ["train-late-reader", "--queries", "q.jsonl", "--tools", "t", "--out", str(tmp_path / "out")]
    assert main(args) == 0 and got["seed"] == 0
    assert main([*args, "--seed", "4"]) == 0 and got["seed"] == 4
    with pytest.raises(SystemExit) as e:
        main([*args, "--seed", "-1"])
    assert e.value.code == 2 and "must be >= 0" in capsys.readouterr().err


def test_make_setups_late_reader_is_the_one_the_commands_defaults_describe():
    """The production late reader (`make setup`: `nexus train-late-reader` with the Makefile's flags) carries the key
    the command's defaults give for the checkout's data and gate model: a rerun keeps it, and the code that made it
    is this code."""
    import json

    from services.router.late_reader import META_FILE, K
    from tests.conftest import REPO

    out = REPO / "var" / "models" / "late_reader"
    doc = json.loads((out / META_FILE).read_text())
    lt = late_training
    key = lt.files_key(REPO / "var" / "models" / "gate", REPO / "data" / "mcp_tools",
                       REPO / "data" / "queries" / "train.jsonl", REPO / "data" / "routing_augment",
                       REPO / "data" / "routing_calibration",
                       [lt.EPOCHS, lt.ROUTE_EPOCHS, K, lt.EXPORT_CLIP, lt.EXPORT_ENUM_WORDS])
    assert doc["export_key"] == key and lt.export_current(str(out), key)
    assert doc["arg_evidence"]["feature"] != "none"  # the calibration kept the stage: on by default, not in name


def test_a_fold_models_late_reader_is_built_from_its_folds_lines_and_kept_by_them(tmp_path, monkeypatch, all_tools):
    """`nexus eval routing --late-reader`: each fold model's reader goes to <root>/late-readers/<model>, heads to
    <root>/late-reader-heads, with the fold's own lines (its threshold and calibration never see the held-out
    fold); its key follows those lines, the registry and the model (the build itself is `make setup`'s, above)."""
    import json
    from types import SimpleNamespace

    from services.training.data import QueryLine

    calls = []

    def fake_build(gate, registry, lines, augment, calibration, out, heads, *, key, progress, **s):
        calls.append({"gate": gate, "lines": [ln.id for ln in lines], "out": out, "heads": heads, "key": key, **s})
        return {"feature": "stated", "export_key": key}

    monkeypatch.setattr(late_training, "build", fake_build)
    gate = tmp_path / "gate-abc"
    gate.mkdir()
    (gate / "gate.json").write_text(json.dumps({"tau": 0.1}))
    reg = SimpleNamespace(tools=all_tools[:3])

    def line(i):
        return QueryLine(id=f"l{i}", server="s", tool=all_tools[0].name, query=f"request {i}", args={}, history=())

    train, aug = [line(1), line(2)], [line(9)]
    out, summary = late_training.fold_late_reader(gate, reg, train, aug, [], tmp_path, progress=False)
    assert out == tmp_path / "late-readers" / "gate-abc" and summary["feature"] == "stated"
    c = calls[-1]
    assert c["lines"] == ["l1", "l2"] and c["out"] == out and c["heads"] == tmp_path / "late-reader-heads"
    assert (c["epochs"], c["route_epochs"]) == (late_training.EPOCHS, late_training.ROUTE_EPOCHS)
    key = c["key"]
    late_training.fold_late_reader(gate, reg, train, aug, [], tmp_path, progress=False)
    assert calls[-1]["key"] == key  # the same fold: the same reader
    late_training.fold_late_reader(gate, reg, [line(1)], aug, [], tmp_path, progress=False)
    assert calls[-1]["key"] != key  # another fold's lines
    late_training.fold_late_reader(gate, SimpleNamespace(tools=all_tools[:4]), train, aug, [], tmp_path,
                                   progress=False)
    assert calls[-1]["key"] != key  # another registry
    late_training.fold_late_reader(gate, reg, train, aug, [], tmp_path, progress=False, epochs=3)
    assert calls[-1]["key"] != key and calls[-1]["epochs"] == 3
    out, _ = late_training.fold_late_reader(gate, reg, train, aug, [], tmp_path, progress=False, seed=2)
    assert out == tmp_path / "late-readers" / "gate-abc-seed2"  # beside seed 0's, not over it
    assert calls[-1]["key"] != key and calls[-1]["seed"] == 2 and calls[0]["seed"] == 0


def test_cached_heads_are_safetensors_written_whole(tmp_path):
    import torch

    from services.router.late_reader import build_head

    torch.manual_seed(1)
    a, b = build_head(), build_head()
    path = tmp_path / "gate" / f"head-x{late_training.HEAD_SUFFIX}"
    late_training.save_weights(a, path)
    assert path.read_bytes()[8:9] == b"{" and [p.name for p in path.parent.iterdir()] == [path.name]
    late_training.load_weights(b, path)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
