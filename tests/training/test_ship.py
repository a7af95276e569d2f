"""The shipped models (models/, issue 49): their manifest holds, each recipe's key is the current one, every recipe
trains end to end on a small subset into a serving form that ships and serves, and the serving form gives what the
training form gives.

The recipes run small here (two servers' lines, one epoch): the full ones are `make train`'s (~85 min).
"""

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, SMALL_SERVERS
from training import recipes, ship

sys.path.insert(0, str(REPO / "scripts"))
import models as shipped  # noqa: E402  scripts/models.py: what `make setup` runs


def test_every_shipped_model_matches_the_manifest_and_fits_the_budget():
    doc = shipped.load_manifest()
    assert set(doc["models"]) == set(ship.SHIPPERS) <= set(recipes.RECIPES)
    assert shipped.problems() == []
    total = sum(f["size"] for m in doc["models"].values() for f in m["files"].values())
    assert total <= ship.MAX_BYTES
    # the serving form only: no torch weights, no fp32 graph, no cross-encoder
    names = [p for m in doc["models"].values() for p in m["files"]]
    assert not any(n.endswith(("model.safetensors", "sentence_embedding.onnx", "states.onnx")) for n in names)
    assert not any(n.startswith("cross_encoder") for n in names)


@pytest.mark.parametrize("name", sorted(ship.SHIPPERS))
def test_the_shipped_model_is_the_current_recipes(name):
    entry = shipped.load_manifest()["models"][name]
    for recipe, want in {name: entry["recipe"], **entry.get("after", {})}.items():
        assert recipes.recipe_key(recipe) == want, (
            f"models/{name} was made by another {recipe} recipe ({want}) than the data, code and hyper-parameters of "
            f"this tree ({recipes.recipe_key(recipe)}): retrain with `make train` and commit models/")
    assert set(entry.get("after", {})) == set(recipes.RECIPES[name].after)


def _mini_repo(tmp_path):
    """A copy of what the recipes read (their data), to change one thing at a time."""
    dst = tmp_path / "repo"
    for r in recipes.RECIPES.values():
        for rel in r.data:
            src = REPO / rel
            if src.is_dir():
                shutil.copytree(src, dst / rel, dirs_exist_ok=True)
            else:
                (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst / rel)
    return dst


def test_a_recipe_key_follows_its_data_parameters_and_version_never_its_code(tmp_path, monkeypatch):
    repo = _mini_repo(tmp_path)
    keys = {n: recipes.recipe_key(n, repo) for n in recipes.RECIPES}
    assert keys == {n: recipes.recipe_key(n) for n in recipes.RECIPES}  # bytes, not where the clone lies, make the key
    # code is not hashed: moving or editing a trainer changes no key (RECIPE version bumps do)
    assert all(not rel.endswith(".py") for r in recipes.RECIPES.values() for rel in r.data)
    (repo / recipes.AUGMENT / "README.md").write_text("an edited note\n")  # not what a model learns from
    assert {n: recipes.recipe_key(n, repo) for n in recipes.RECIPES} == keys
    cal = sorted((repo / recipes.CALIBRATION).glob("*.jsonl"))[0]  # calibration data: the gate moves, not the slots
    cal.write_text(cal.read_text() + "\n")
    moved = {n: recipes.recipe_key(n, repo) for n in recipes.RECIPES}
    assert moved["gate"] != keys["gate"] and moved["slots"] == keys["slots"]
    aug = sorted((repo / recipes.AUGMENT).glob("*.jsonl"))[0]  # training data the gate and the slots read
    aug.write_text(aug.read_text() + "\n")
    assert recipes.recipe_key("gate", repo) != moved["gate"] and recipes.recipe_key("slots", repo) != moved["slots"]
    before = recipes.recipe_key("slots", repo)
    book = dict(recipes.RECIPES)
    book["slots"] = dataclasses.replace(recipes.RECIPES["slots"], params=lambda: {"epochs": 99})
    assert recipes.recipe_key("slots", repo, book) != before
    book["slots"] = dataclasses.replace(recipes.RECIPES["slots"], version=recipes.RECIPES["slots"].version + 1)
    assert recipes.recipe_key("slots", repo, book) != before
    # a recipe that builds on another moves with it
    book["after"] = recipes.Recipe("after", (recipes.QUERIES,), lambda: {}, version=1, after=("gate",))
    k = recipes.recipe_key("after", repo, book)
    book["gate"] = dataclasses.replace(recipes.RECIPES["gate"], version=recipes.RECIPES["gate"].version + 1)
    assert recipes.recipe_key("after", repo, book) != k


def test_ship_only_keeps_the_other_models_while_they_are_current(tmp_path):
    """`make train ONLY=gate`: the other shipped models' entries are carried over, never a stale or missing one."""
    out = tmp_path / "models"
    shutil.copytree(REPO / "models", out)
    with pytest.raises(ValueError, match="no such shipped model"):
        ship.ship(tmp_path / "cache", out, only=["late_reader"])
    doc = json.loads((out / "manifest.json").read_text())
    doc["models"]["slots"]["recipe"] = "0" * 16
    (out / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="models/slots is stale: ship it too"):
        ship.ship(tmp_path / "cache", out, only=["gate"])


def test_verify_names_every_file_that_differs_and_links_what_holds(tmp_path):
    root = tmp_path / "models"
    shutil.copytree(REPO / "models", root)
    doc = shipped.load_manifest(root / "manifest.json")
    with open(root / "gate" / "gate.json", "ab") as f:
        f.write(b" ")
    (root / "gate" / "exemplars.npy").unlink()
    (root / "slots" / "stray.bin").write_bytes(b"x")
    onnx = root / "slots" / "reader" / "model.int8.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 1
    onnx.write_bytes(bytes(data))
    bad = shipped.problems(root, doc)
    assert any(b.startswith("gate/gate.json:") and "bytes" in b for b in bad)
    assert "gate/exemplars.npy: missing" in bad
    assert "slots/stray.bin: not in the manifest" in bad
    assert "slots/reader/model.int8.onnx: sha256 differs from the manifest's" in bad
    assert len(bad) == 4
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "models.py"), "verify", "--root", str(root),
                          "--link", str(tmp_path / "var")], capture_output=True, text=True)
    assert out.returncode == 1 and "model.int8.onnx" in out.stderr and not (tmp_path / "var").exists()
    shutil.rmtree(root)
    shutil.copytree(REPO / "models", root)
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "models.py"), "verify", "--root", str(root),
                          "--link", str(tmp_path / "var" / "models")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for name in doc["models"]:
        lnk = tmp_path / "var" / "models" / name
        assert lnk.is_symlink() and not lnk.readlink().is_absolute() and lnk.resolve() == (root / name).resolve()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Each recipe, small, into a cache laid out as `make train`'s: the router's encoder (one step on 24 public and
    24 shipped pairs of two servers), the gate model on it (the shipped recipe's settings: the encoder kept, no
    cross-encoder) over those servers' lines, the slot reader on their augment lines (one epoch); then shipped, the
    gate's parity measured on those servers' calibration lines."""
    from training import public
    from training.data import equivalents, load_augment, load_queries, load_registry, tune_split
    from training.gate import SHIPPED_GATE, train_gate
    from training.slots import SlotHyperParams, train_slots

    cache = tmp_path_factory.mktemp("cache")
    registry = load_registry(REPO / recipes.TOOLS)
    lines = [ln for ln in load_queries(REPO / recipes.QUERIES) if ln.server in SMALL_SERVERS]
    tools = [t for t in registry.tools if registry.server_of[t.name] in SMALL_SERVERS]
    augment = [ln for ln in load_augment(str(REPO / recipes.AUGMENT)) if ln.tool in {t.name for t in tools}][:120]
    seal = {t.name: t for t in public.load_seal_tools()}
    pairs = [*public.load_seal_pairs(known=set(seal))[:24],
             *public.load_shipped_pairs(public.SHIPPED_REQUESTS, [t.name for t in tools])[:24]]
    public.train(pairs, {**seal, **{t.name: t for t in tools}}, cache / "router_encoder",
                 public.PublicHyperParams(epochs=1, batch_size=48), progress=False)
    hp = dataclasses.replace(SHIPPED_GATE, encoder=str(cache / "router_encoder"), val_fraction=0.25, threads=1)
    train_gate(lines, tools, cache / "gate", hp, equivalents=equivalents, progress=False, extra=augment)
    tune, _ = tune_split(lines)
    train_slots(augment, tune, tools, cache / "slots", SlotHyperParams(epochs=1), progress=False)
    calibration = [ln for ln in load_augment(str(REPO / recipes.CALIBRATION)) if ln.server in SMALL_SERVERS]
    out = tmp_path_factory.mktemp("shipped")
    doc = ship.ship(cache, out, parity_lines=calibration, strict=False)
    return {"cache": cache, "out": out, "doc": doc, "tools": tools, "lines": lines}


def test_each_recipe_trains_small_and_ships_a_verified_serving_form(small):
    assert shipped.problems(small["out"], small["doc"]) == []
    assert json.loads((small["out"] / "manifest.json").read_text()) == small["doc"]
    for name, m in small["doc"]["models"].items():
        assert m["recipe"] == recipes.recipe_key(name) and m["files"]
    assert (small["out"] / "gate" / "exemplars.npy").is_file()
    assert np.load(small["out"] / "gate" / "exemplars.npy").dtype == np.float16


def test_a_model_not_made_by_its_recipe_does_not_ship(small, tmp_path):
    """The small models' recorded settings are not the recipe's: ship names each difference and ships nothing."""
    bad = ship.recipe_mismatch(small["cache"] / "gate", "gate")
    assert any(b.startswith("gate val_fraction:") for b in bad) and any(b.startswith("encoder epochs:") for b in bad)
    assert any("not trained on every public, written and shipped pair" in b for b in bad)
    assert not any(b.startswith(("gate q_epochs", "gate ce_epochs")) for b in bad)  # those are the recipe's
    out = tmp_path / "models"
    shutil.copytree(small["out"], out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="was not made by the gate recipe: .*val_fraction"):
        ship.ship(small["cache"], out, parity_lines=small["lines"][:5])
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_the_serving_form_routes_as_the_training_form(small):
    """The shipped gate (no torch weights) gives the training form's INT8 vectors and exemplar keys and routes the
    calibration lines as the fp32 model it was exported from (ship refuses it under MIN_PARITY); the shipped slot
    reader (INT8 ONNX) finds the spans the torch reader finds."""
    from services.engine.slots import SlotModel
    from services.router.gate import GateModel

    parity = small["doc"]["models"]["gate"]["parity"]
    assert parity["n"] >= 20 and parity["agree"] >= ship.MIN_PARITY

    trained = GateModel(small["cache"] / "gate", threads=1, precision="int8")
    served = GateModel(small["out"] / "gate", threads=1, precision="int8")
    assert served.query_encoder is None and trained.query_encoder is not None
    for ln in small["lines"][:10]:
        np.testing.assert_array_equal(served.embed_query(ln.query), trained.embed_query(ln.query))
    np.testing.assert_allclose(served.probe_vector(), trained.probe_vector(), atol=1e-6)
    a, b = trained.exemplar_keys(), served.exemplar_keys()
    assert a.keys() == b.keys() and all(np.abs(a[k] - b[k]).max() < 1e-3 for k in a)
    with pytest.raises(ValueError, match="INT8 graph only"):
        GateModel(small["out"] / "gate", threads=1, precision="fp32")
    torch_slots, onnx_slots = SlotModel(small["cache"] / "slots", threads=1), SlotModel(small["out"] / "slots", threads=1)
    tool = next(t for t in small["tools"] if t.name == "set")
    qs = [f"set the key {k} to {v}" for k, v in (("user:1", "alice"), ("config:max", "30"), ("session", "abc"))]
    same = [torch_slots.hints(tool, q).keys() == onnx_slots.hints(tool, q).keys() for q in qs]
    assert sum(same) >= 2


def test_a_tampered_probe_refuses_the_graph(small, tmp_path, caplog):
    from services.router.gate import PROBE_FILE, GateModel, load_gate

    dst = tmp_path / "gate"
    shutil.copytree(small["out"] / "gate", dst)
    probe = json.loads((dst / "query_encoder" / PROBE_FILE).read_text())
    probe["vector"] = list(-np.asarray(probe["vector"]))
    (dst / "query_encoder" / PROBE_FILE).write_text(json.dumps(probe))
    with pytest.raises(ValueError):
        GateModel(dst, threads=1, precision="int8")
    assert load_gate(str(dst), threads=1, precision="int8") is None


def test_the_slot_bench_compares_the_shipped_reader_with_its_training_form(small, tmp_path):
    """bench/slots_int8.py (make eval) on the small recipe's two forms: both arms read every example at the shipped
    threshold, the paired counts add up, the plot is written; a missing training form is a clear error."""
    bench = [sys.executable, str(REPO / "bench" / "slots_int8.py"), "--json", str(tmp_path / "s.json")]
    out = subprocess.run([*bench, "--trained", str(small["cache"] / "slots"), "--shipped", str(small["out"] / "slots"),
                          "--limit", "24", "--chunk", "8"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads((tmp_path / "s.json").read_text())
    assert rep["n"] == 24 and set(rep["arms"]) == {"torch", "int8-onnx"}
    assert all(0 <= a["accuracy"] <= 1 and a["seconds"] > 0 for a in rep["arms"].values())
    diff = rep["arms"]["int8-onnx"]["accuracy"] - rep["arms"]["torch"]["accuracy"]
    assert rep["paired"]["fixed"] - rep["paired"]["broken"] == round(diff * 24)
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = subprocess.run([*bench, "--trained", str(small["out"] / "slots")], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 2 and "no torch reader" in out.stderr


def test_a_failed_parity_check_ships_nothing(small, tmp_path, monkeypatch):
    """The serving forms are staged and checked before anything is replaced: a gate whose INT8 form disagrees with
    its training form leaves models/ (files and manifest) as they were."""
    out = tmp_path / "models"
    shutil.copytree(small["out"], out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(ship, "MIN_PARITY", 1.01)  # no serving form can agree more than always
    with pytest.raises(ValueError, match="nothing shipped"):
        ship.ship(small["cache"], out, parity_lines=small["lines"][:5], strict=False)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging directory left behind
