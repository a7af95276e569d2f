"""The gate models the routing evaluation needs, trained once and cached under ``var/models``.

* one per fold (k-fold over each tool's lines, ``data.assign_folds``): trained on the other folds' lines,
  so every evaluated line was never seen by the query encoder, the cross-encoder, tau or alpha;
* one with a whole server's lines held out (generalization to tools the router was never trained on).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from services.evals.data import QueryLine, Registry, equivalents, load_queries
from services.router.training import GateHyperParams, default_gate_dir, train_gate

log = logging.getLogger("nexus.evals.routing")


def prepare_training_env() -> None:
    """Before torch starts: idle OpenMP workers must yield on shared cores (spinning made 2-thread
    inference ~20x slower here while other jobs ran), and nothing may reach for a hub."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_augment(path: str | Path) -> list[QueryLine]:
    """Fit-only training lines (``data/routing_augment/*.jsonl``: requests written from the tool schemas
    alone, never from the evaluation's query file). A missing directory or '' means none."""
    if not path:
        return []
    root = Path(path)
    if root.is_file():
        return load_queries(root)
    if not root.is_dir():
        raise FileNotFoundError(f"augment data {root} does not exist")
    return [ln for f in sorted(root.glob("*.jsonl")) for ln in load_queries(f)]


def train_cached(lines: Sequence[QueryLine], registry: Registry, hp: GateHyperParams, models_root: str,
                 progress: bool = True, label: str = "", extra: Sequence[QueryLine] = (),
                 calibration: Sequence[QueryLine] = ()) -> Path:
    """The gate model of ``lines`` + ``extra`` under ``models_root`` (trained once per data hash), calibrated on
    its validation lines + ``calibration`` (a cached model is recalibrated in place when that set changed)."""
    out = default_gate_dir(lines, registry.tools, hp, root=models_root, equivalents=equivalents, extra=extra)
    if label:
        log.info("gate model for %s: %s", label, out)
    train_gate(lines, registry.tools, out, hp, equivalents=equivalents, progress=progress, extra=extra,
               calibration=calibration)
    return out


def fold_models(lines: Sequence[QueryLine], folds: Sequence[int], k: int, registry: Registry,
                hp: GateHyperParams, models_root: str, progress: bool = True,
                extra: Sequence[QueryLine] = (), calibration: Sequence[QueryLine] = ()) -> list[Path]:
    out = []
    for f in range(k):
        train = [ln for ln, g in zip(lines, folds, strict=True) if g != f]
        out.append(train_cached(train, registry, hp, models_root, progress, label=f"fold {f}", extra=extra,
                                calibration=calibration))
    return out


def holdout_model(lines: Sequence[QueryLine], server: str, registry: Registry, hp: GateHyperParams,
                  models_root: str, progress: bool = True, extra: Sequence[QueryLine] = (),
                  calibration: Sequence[QueryLine] = ()) -> Path:
    """Trained and calibrated without any line of ``server`` (its augment and calibration lines included): tools
    the router never saw."""
    train = [ln for ln in lines if registry.server_of.get(ln.tool) != server]
    extra = [ln for ln in extra if registry.server_of.get(ln.tool) != server]
    calibration = [ln for ln in calibration if registry.server_of.get(ln.tool) != server]
    return train_cached(train, registry, replace(hp), models_root, progress, label=f"held-out server {server}",
                        extra=extra, calibration=calibration)
