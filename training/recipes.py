"""What makes each shipped model: its recipe and the recipe's key.

A recipe names the data a model trains and calibrates on, its hyper-parameters and a version. Its key is a hash of
the three (file names and bytes, the hyper-parameters as JSON, the version) and of the keys of the recipes it builds
on. The version is bumped by hand when the training code changes what it produces: the code itself is not hashed,
so moving or editing code that leaves the weights alone never forces a retrain (each retrain adds its weights to the
repository's history). ``training.ship`` records each shipped model's key in models/manifest.json;
tests/training/test_ship.py fails when a recipe's key no longer matches the shipped model's, so a model made from
other data or settings cannot ship unnoticed: retrain it with `make train`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

QUERIES = "data/queries/train.jsonl"
TOOLS = "data/mcp_tools"
AUGMENT = "data/routing_augment"
CALIBRATION = "data/routing_calibration"
PUBLIC = ("data/public_tools/seal_tool.jsonl", "data/public_tools/seal_dev.jsonl",
          "data/public_tools/seal_test_in_domain.jsonl", "data/public_tools/dropped.json", "data/public_tools/written")


def _encoder_params() -> dict[str, Any]:
    """The router's encoder (DESIGN §7): all-MiniLM-L6-v2 fine-tuned on the public tools' requests, the written
    servers' and the shipped registry's own (train.jsonl + routing_augment), `make train`'s ``python -m
    training.public --with-shipped --with-written``."""
    from training.public import ROUTER_ENCODER

    return {**asdict(ROUTER_ENCODER), "with_shipped": True, "with_written": True}


def _gate_params() -> dict[str, Any]:
    """The gate model on the router's encoder: its weights kept (q_epochs 0), no cross-encoder (ce_epochs 0); what
    it fits is the SLB's calibration (exemplar weight and pooling, lexical weight, tool bias, tau)."""
    from training.gate import SHIPPED_GATE

    # a switch added at its default leaves the key (and so the committed model) as it was
    hp = {k: v for k, v in asdict(SHIPPED_GATE).items() if not (k == "tool_text" and not v)}
    return {**hp, "encoder": "recipe:encoder"}


def _slot_params() -> dict[str, Any]:
    from training.slots import SlotHyperParams

    return asdict(SlotHyperParams())


@dataclass(frozen=True)
class Recipe:
    name: str
    data: tuple[str, ...]  # repo-relative files or directories (every file under one)
    params: Callable[[], dict[str, Any]]
    # RECIPE_VERSION: bump it by hand in the commit that changes what the training code produces
    version: int
    after: tuple[str, ...] = ()  # recipes whose output this one reads


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("encoder", (*PUBLIC, QUERIES, TOOLS, AUGMENT), _encoder_params, version=1),
    Recipe("gate", (QUERIES, TOOLS, AUGMENT, CALIBRATION), _gate_params, version=3, after=("encoder",)),
    Recipe("slots", (QUERIES, TOOLS, AUGMENT), _slot_params, version=1),
)}


DATA_SUFFIXES = (".json", ".jsonl")  # what a model learns from: a directory's README or script changes no key


def _files(rel: str, repo: Path) -> list[Path]:
    p = repo / rel
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in DATA_SUFFIXES
                      and not f.name.startswith("."))
    if not p.is_file():
        raise FileNotFoundError(f"recipe input {p} is missing")
    return [p]


def recipe_key(name: str, repo: Path = REPO, recipes: dict[str, Recipe] | None = None) -> str:
    """The key of recipe ``name`` over the data files of ``repo`` as they are now."""
    book = RECIPES if recipes is None else recipes
    r = book[name]
    h = hashlib.sha256(json.dumps({"recipe": name, "version": r.version, "params": r.params(),
                                   "after": {a: recipe_key(a, repo, book) for a in r.after}},
                                  sort_keys=True).encode())
    for rel in r.data:
        for f in _files(rel, repo):
            h.update(str(f.relative_to(repo)).encode() + b"\0")
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]
