"""The unseen-tools protocol (evals/unseen.py): folds by server, the arms' scoring, and a small real run
through ``nexus eval routing --protocol unseen``."""

import json
from pathlib import Path

import numpy as np
import pytest

from evals import unseen
from tests.conftest import QUERIES, TOOLS_DIR
from training.data import QueryLine, load_registry


def test_server_folds_keep_github_families_together_and_balance_tool_counts():
    reg = load_registry(TOOLS_DIR)
    folds = unseen.server_folds(reg, 4, seed=0)
    assert set(folds) == set(reg.servers())
    assert folds["github"] == folds["github-legacy"]
    assert folds == unseen.server_folds(reg, 4, seed=0)  # deterministic for a seed
    counts = [sum(len(v) for s, v in reg.servers().items() if folds[s] == g) for g in range(4)]
    others = sorted(c for g, c in enumerate(counts) if g != folds["github"])
    assert others[-1] - others[0] <= 5  # the largest family aside, the folds hold about as many tools
    assert {s for s, g in folds.items() if g == folds["github"]} == {"github", "github-legacy"}
    for seed in range(1, 6):  # another seed may move servers, never split the family
        f = unseen.server_folds(reg, 4, seed=seed)
        assert f["github"] == f["github-legacy"]
    with pytest.raises(ValueError):
        unseen.server_folds(reg, 1)


def test_the_scorer_ranks_in_the_lines_registry_and_exemplar_keys_move_it():
    names = ["a", "b", "c"]
    text = np.eye(3, 8, dtype=np.float32)
    q = np.zeros(8, np.float32)
    q[0], q[1] = 0.6, 0.8
    plain = unseen.Scorer(names, text)
    assert plain.top3(q, ["a", "b", "c"])[0] == "b"
    assert plain.top3(q, ["a", "c"])[0] == "a"  # b not in this registry
    ex = {"a": np.vstack([q / np.linalg.norm(q)])}  # a request of a's that is exactly the query
    # a: 0.6 + 2 x 1.0; b, without exemplars, is scored on its text key: 0.8 + 2 x 0.8
    assert unseen.Scorer(names, text, ex, weight=2.0).top3(q, names)[0] == "a"


def test_the_setting_is_chosen_on_the_given_lines_and_the_summary_pairs_with_dense():
    names = ["a", "b"]
    text = np.eye(2, 4, dtype=np.float32)
    qv = np.array([[1, 0, 0, 0], [0.9, 0.1, 0, 0]], np.float32)
    lines = [QueryLine(id="x", server="s", tool="a", query="q"), QueryLine(id="y", server="s", tool="b", query="q")]
    regs = [{"all": [["a", "b"], ["a", "b"]]}]
    lex = np.array([[0.0, 0.0], [0.0, 1.0]], np.float32)  # the second line names b's words

    def build(lexical_weight):
        return unseen.Scorer(names, text, lexical=lex, lexical_weight=lexical_weight)

    grid = [{"lexical_weight": 0.0}, {"lexical_weight": 1.0}]
    assert unseen.choose(build, grid, qv, lines, [0, 1], regs, "all")["setting"] == {"lexical_weight": 1.0}
    assert unseen.choose(build, grid, qv, lines, [0], regs, "all")["setting"] == {"lexical_weight": 0.0}  # a tie


def test_the_summary_pools_line_draws_and_pairs_with_dense():
    lines = [QueryLine(id=f"l{i}", server="s1" if i < 2 else "s2", tool=t, query="q")
             for i, t in enumerate(["a", "b", "a"])]
    hits = {"l0#0": (True, True), "l1#0": (False, True), "l2#0": (True, True), "l0#1": (False, False)}
    s = unseen.summarize_arm(hits, {ln.id: ln for ln in lines})
    assert s["n_lines"] == 3 and s["n_line_draws"] == 4 and s["top1"] == 0.5 and s["top3"] == 0.75
    assert s["top1_by_server"] == {"s1": {"n": 3, "top1": pytest.approx(1 / 3)}, "s2": {"n": 1, "top1": 1.0}}
    base = {"l0#0": (False, True), "l1#0": (True, True), "l2#0": (True, True), "l0#1": (False, False)}
    assert unseen.paired(hits, base) == {"fixed": 1, "broken": 1, "sign_test_p": 1.0}


@pytest.mark.integration
def test_nexus_eval_routing_protocol_unseen_writes_a_report_and_plot(tmp_path):
    """Three small servers, 2 folds by server, through the CLI: every arm and size reported, no line scored by a
    fold that holds its server, the choice of pooling made on the other fold's lines."""
    from cli.main import main

    tools = tmp_path / "tools"
    tools.mkdir()
    keep = ("time", "redis", "sqlite", "puppeteer")
    for s in keep:
        (tools / f"{s}.json").write_text((TOOLS_DIR / f"{s}.json").read_text())
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(x for x in QUERIES.read_text().splitlines(True) if json.loads(x)["server"] in keep))
    out = tmp_path / "unseen.json"
    assert main(["eval", "routing", "--protocol", "unseen", "--queries", str(queries), "--tools", str(tools),
                 "--sizes", "5,all", "--folds", "2", "--draws", "2", "--derived", "", "--no-gate-arm", "--json", str(out),
                 "--quiet"]) == 0
    rep = json.loads(out.read_text())
    assert (tmp_path / "unseen.png").stat().st_size > 0
    assert set(rep["arms"]) == {"dense", "alt_key", "lexical", "alt_key+lexical", "template"} and set(rep["arms"]["dense"]) == {"5", "all"}
    n = sum(1 for x in queries.read_text().splitlines() if x.strip())
    assert rep["arms"]["dense"]["all"]["n_lines"] == n and rep["arms"]["dense"]["all"]["n_line_draws"] == 2 * n
    folds = rep["protocol"]["folds"]
    assert sorted(s for v in folds.values() for s in v) == sorted(keep)
    assert set(rep["chosen"]["template"]) == {"0", "1"}
    assert set(rep["chosen"]["template"]["0"]["setting"]) == {"weight", "temperature"}
    assert len(rep["chosen"]["lexical"]["1"]["grid"]) == 8
    for arm in rep["arms"].values():
        assert 0.0 <= arm["all"]["top1"] <= arm["all"]["top3"] <= 1.0
    with pytest.raises(SystemExit, match="no derived requests"):
        main(["eval", "routing", "--protocol", "unseen", "--queries", str(queries), "--tools", str(tools),
              "--derived", str(tmp_path / "missing.jsonl"), "--json", str(out)])


@pytest.mark.integration
def test_the_gate_arms_train_each_fold_without_its_servers_and_read_derived_requests(tmp_path, monkeypatch):
    """Two folds of four small servers, a tiny gate recipe: each fold model's registry holds none of its fold's
    tools, its lines none of their lines; ``gate+derived`` reads derived requests from the store (a file written
    here, one request per tool: the mechanics, not the generator)."""
    from services.compiler.derive import encode_derived  # noqa: F401 - the artifact format the arm writes
    from training.gate import GateHyperParams

    keep = ("time", "redis", "sqlite", "puppeteer")
    tools = tmp_path / "tools"
    tools.mkdir()
    for s in keep:
        (tools / f"{s}.json").write_text((TOOLS_DIR / f"{s}.json").read_text())
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(x for x in QUERIES.read_text().splitlines(True) if json.loads(x)["server"] in keep))
    reg = load_registry(tools)
    derived = tmp_path / "derived.jsonl"
    derived.write_text(json.dumps({"generator": {"fingerprint": "e" * 64}}) + "\n" + "".join(
        json.dumps({"tool": t.name, "schema_hash": t.schema_hash, "requests": [t.description[:80]]}) + "\n"
        for t in reg.tools))
    hp = GateHyperParams(seed=3, q_epochs=1, ce_epochs=1, q_batch=16, ce_batch_groups=16, val_fraction=0.25,
                         threads=1, ce_top_k=3)
    out = tmp_path / "unseen.json"
    monkeypatch.setattr(unseen, "LEXICAL_GATE_GRID", (0.0, 0.5))  # two weights: the mechanics
    rep = unseen.evaluate(str(queries), str(tools), str(out), sizes="5,all", k=2, draws=1, derived=str(derived),
                          gate=True, models_root=str(tmp_path / "models"), hp=hp, progress=False)
    assert {"gate", "gate+lexical", "gate+derived", "derived", "alt_key+lexical(derived doc)"} <= set(rep["arms"])
    n = sum(1 for x in queries.read_text().splitlines() if x.strip())
    assert rep["arms"]["gate"]["all"]["n_line_draws"] == n == rep["arms"]["gate+derived"]["all"]["n_line_draws"]
    folds = rep["protocol"]["folds"]
    for meta in rep["gate_folds"]:
        held = set(folds[str(meta["fold"])])
        model = json.loads((Path(meta["model"]) / "gate.json").read_text())
        assert not {reg.server_of[t] for t in model["tool_schemas"]} & held
        assert meta["n_tools"] == sum(1 for t in reg.tools if reg.server_of[t.name] not in held)
        # the fold's lexical weight is the best of the *other* fold's own-line figures
        other = next(m for m in rep["gate_folds"] if m["fold"] != meta["fold"])["own_top1_by_lexical_weight"]
        assert other[str(meta["lexical_weight_chosen"])] == max(other.values())
