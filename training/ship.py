"""Ship the trained models: their serving form into models/, with models/manifest.json.

    python -m training.ship --cache ~/.cache/nexus/models [--out models]     (the last step of `make train`)

Training writes full model directories (torch weights, fp32 graphs, the cross-encoder) into a cache outside the
clone. What ships is what the services run, nothing else (~52 MB):

    gate/         gate.json, exemplars.jsonl, exemplars.npy (float16: the SLB scans INT8), query_encoder/ (tokenizer,
                  onnx/sentence_embedding.int8.onnx, probe.json: the truncation length and the torch vector of
                  onnx_encoder.PROBE the graph is checked against at load). No cross-encoder: alpha is 0.
    slots/        slots.json, reader/ (tokenizer, model.int8.onnx: ``training.slots.export_onnx``)

The manifest lists every file (size, sha256) and each model's recipe key (``training.recipes``);
``scripts/models.py verify`` checks it in `make setup`, tests/training/test_ship.py keeps the keys current.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from training.recipes import RECIPES, REPO, recipe_key

FORMAT = "nexus-models-v1"
MAX_BYTES = 80_000_000  # the budget: every retrain adds this much to the repo's history at most
MIN_PARITY = 0.99  # the shipped INT8 gate must route the calibration lines as the model it was exported from

TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "config.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def ship_gate(src: Path, dst: Path) -> None:
    from services.router import onnx_encoder
    from services.router.gate import PROBE_FILE, GateModel

    for f in ("gate.json", "exemplars.jsonl"):
        _copy(src / f, dst / f)
    np.save(dst / "exemplars.npy", np.load(src / "exemplars.npy").astype(np.float16))
    q, out = src / "query_encoder", dst / "query_encoder"
    for f in TOKENIZER:
        _copy(q / f, out / f)
    _copy(onnx_encoder.onnx_path(q, "int8"), onnx_encoder.onnx_path(out, "int8"))
    gate = GateModel(src, threads=2, precision="fp32")
    if gate.query_stack is None:
        raise ValueError(f"the query encoder of {src} is not Transformer + mean pooling: its graph cannot ship")
    probe = {"max_len": gate.query_stack[2], "text": onnx_encoder.PROBE,
             "vector": [float(x) for x in gate.probe_vector()]}
    (out / PROBE_FILE).write_text(json.dumps(probe) + "\n")


def ship_slots(src: Path, dst: Path) -> None:
    from services.engine.slots import ONNX_FILE
    from training.slots import export_onnx

    _copy(src / "slots.json", dst / "slots.json")
    for f in TOKENIZER:
        _copy(src / "reader" / f, dst / "reader" / f)
    export_onnx(src / "reader", dst / "reader" / ONNX_FILE)


SHIPPERS = {"gate": ship_gate, "slots": ship_slots}


def gate_parity(trained: Path, served: Path, tools: Path, lines) -> dict[str, Any]:
    """Route ``lines`` over the whole registry at ``tools`` with two production routers: the gate model as trained
    (torch weights, fp32) and its shipped serving form (INT8 graph, float16 exemplar keys). ``agree`` is the share
    of lines both send to the same tool (``make train`` refuses to ship under ``MIN_PARITY``)."""
    import asyncio

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.common.tools import load_registry_dir
    from services.router.config import RouterConfig
    from services.router.router import HistoryTurn, Router

    embedder = Embedder("")
    picks = {}
    with tempfile.TemporaryDirectory(prefix="nexus-parity-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(load_registry_dir(str(tools)))
        for arm, gdir, precision in (("trained", trained, "fp32"), ("served", served, "int8")):
            router = Router(RouterConfig(store_url=tmp, gate_model_dir=str(gdir), torch_threads=1,
                                         query_encoder_precision=precision), store, embedder)
            if router.gate is None:
                raise ValueError(f"parity: the gate model at {gdir} did not load")
            asyncio.run(router.sync(force=True))
            picks[arm] = [router.route(ln.query, [HistoryTurn(r, c) for r, c in ln.history]).tool for ln in lines]
    same = sum(a == b for a, b in zip(picks["trained"], picks["served"], strict=True))
    return {"n": len(lines), "agree": same / max(len(lines), 1),
            "right_trained": sum(p == ln.tool for p, ln in zip(picks["trained"], lines, strict=True)),
            "right_served": sum(p == ln.tool for p, ln in zip(picks["served"], lines, strict=True))}


def ship(cache: Path, out: Path = REPO / "models", repo: Path = REPO, parity_lines=None,
         only: Sequence[str] = (), strict: bool = True) -> dict[str, Any]:
    """Write each model's serving form from ``cache/<model>`` into ``out/<model>`` and the manifest
    ``out/manifest.json`` (other files of ``out``, e.g. gguf.json, are left alone). Atomic per model. The gate's
    ``gate_parity`` on ``parity_lines`` (default: the calibration lines) is recorded and must reach ``MIN_PARITY``;
    every form is staged and checked first, so a failed check ships nothing.
    ``only``: ship these models and keep the others' entries of the existing manifest, which must still be current
    (their recipe key the tree's). ``strict``: refuse a model whose recorded settings are not its recipe's
    (``recipe_mismatch``; tests ship small models with ``strict=False``)."""
    manifest: dict[str, Any] = {"format": FORMAT, "models": {}}
    out.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(only) - set(SHIPPERS))
    if unknown:
        raise ValueError(f"no such shipped model: {', '.join(unknown)} (of {', '.join(SHIPPERS)})")
    old = json.loads((out / "manifest.json").read_text()) if (out / "manifest.json").is_file() else {"models": {}}
    for name in SHIPPERS:  # what is kept is checked before anything is replaced
        if only and name not in only:
            entry = old["models"].get(name)
            if entry is None or entry["recipe"] != recipe_key(name, repo):
                raise ValueError(f"models/{name} is {'not shipped' if entry is None else 'stale'}: ship it too")
    staged: dict[str, Path] = {}
    try:  # every serving form is made and checked in a staging directory; nothing shipped changes unless all pass
        for name, fn in SHIPPERS.items():
            if only and name not in only:
                manifest["models"][name] = old["models"][name]
                continue
            src = cache / name
            if not src.is_dir():
                raise FileNotFoundError(f"no trained {name} at {src}: `make train` trains it")
            mismatch = recipe_mismatch(src, name) if strict else []
            if mismatch:
                raise ValueError(f"{src} was not made by the {name} recipe: {'; '.join(mismatch)}")
            tmp = staged[name] = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out))
            tmp.chmod(0o755)  # mkdtemp makes it private
            fn(src, tmp)
            entry = manifest["models"][name] = {
                "recipe": recipe_key(name, repo), "trained": _trained(src, name),
                "files": {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": sha256(p)}
                          for p in sorted(tmp.rglob("*")) if p.is_file()}}
            if RECIPES[name].after:
                entry["after"] = {a: recipe_key(a, repo) for a in RECIPES[name].after}
            if name == "gate":
                if parity_lines is None:
                    from training.data import load_augment
                    from training.recipes import CALIBRATION

                    parity_lines = load_augment(str(repo / CALIBRATION))
                parity = entry["parity"] = gate_parity(src, tmp, repo / "data" / "mcp_tools", parity_lines)
                if parity["agree"] < MIN_PARITY:
                    raise ValueError(f"the gate's serving form routes {parity['agree']:.1%} of {parity['n']} lines "
                                     f"as its training form, under {MIN_PARITY:.0%}: nothing shipped ({parity})")
        total = sum(f["size"] for m in manifest["models"].values() for f in m["files"].values())
        if total > MAX_BYTES:
            raise ValueError(f"the shipped models take {total / 1e6:.1f} MB, over the {MAX_BYTES / 1e6:.0f} MB budget")
        for name, tmp in staged.items():
            if (out / name).exists():
                shutil.rmtree(out / name)
            tmp.rename(out / name)
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    finally:
        for tmp in staged.values():
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def recipe_mismatch(src: Path, name: str) -> list[str]:
    """What the trained model at ``src`` records of its making that differs from recipe ``name`` in this tree
    (hyper-parameters; for the gate, also its encoder's). [] when it is the recipe's: ``ship`` refuses otherwise,
    so a model trained with other settings cannot ship under the recipe's key."""
    if name != "gate":
        return []
    from training.public import ROUTER_ENCODER

    want = json.loads(json.dumps(RECIPES["gate"].params()))
    got = json.loads((src / "gate.json").read_text()).get("hyperparams") or {}
    bad = [f"gate {k}: {got.get(k)!r}, the recipe's {v!r}" for k, v in want.items() if k != "encoder" and got.get(k) != v]
    enc = Path(got.get("encoder") or "")
    meta = json.loads((enc / "public_meta.json").read_text()) if (enc / "public_meta.json").is_file() else None
    if meta is None:
        return [*bad, f"gate encoder {str(enc)!r}: not a training.public encoder (no public_meta.json)"]
    want_enc = json.loads(json.dumps(asdict(ROUTER_ENCODER)))
    bad += [f"encoder {k}: {meta['hp'].get(k)!r}, the recipe's {v!r}" for k, v in want_enc.items()
            if meta["hp"].get(k) != v]
    if not (meta.get("with_shipped") and meta.get("with_written")) or meta.get("holdout_servers") \
            or meta.get("limit_pairs"):
        bad.append("encoder: not trained on every public, written and shipped pair (--with-shipped --with-written, "
                   "no holdout, no limit)")
    return bad


def _trained(src: Path, name: str) -> dict[str, Any]:
    """What the training record says of the model (for people: the recipe key is what tests check)."""
    meta = json.loads((src / {"gate": "gate.json", "slots": "slots.json"}[name]).read_text())
    keys = ("data_hash", "train_seconds", "n_fit", "n_val", "n_train", "val_accuracy", "threshold")
    return {k: meta[k] for k in keys if k in meta}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.ship", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True, help="the trained models (make train's MODEL_CACHE)")
    ap.add_argument("--out", default=str(REPO / "models"))
    ap.add_argument("--only", default="", help=f"comma-separated, of {', '.join(SHIPPERS)}: ship these and keep the "
                                               "others (which must still be current)")
    args = ap.parse_args(argv)
    doc = ship(Path(args.cache).expanduser(), Path(args.out), only=[x for x in args.only.split(",") if x])
    for name, m in doc["models"].items():
        size = sum(f["size"] for f in m["files"].values())
        print(f"{name}: {len(m['files'])} files, {size / 1e6:.1f} MB, recipe {m['recipe']}")
    print(f"wrote {Path(args.out) / 'manifest.json'}: commit models/ (one set of weights per retrain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
