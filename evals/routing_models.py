"""The gate models the routing evaluation needs, trained once and cached under ``var/models``.

* one per fold (k-fold over each tool's lines, ``data.assign_folds``): trained on the other folds' lines,
  so every evaluated line was never seen by the query encoder, the cross-encoder, tau or alpha;
* one with a whole server's lines held out (generalization to tools the router was never trained on).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from evals.routing import fold_models, holdout_model, train_cached  # noqa: F401 - re-exported
from training.data import (  # noqa: F401 - re-exported
    QueryLine,
    Registry,
    equivalents,
    jsonl_files,
    load_augment,
    load_queries,
    prepare_training_env,
)
from training.gate import GateHyperParams

log = logging.getLogger("nexus.evals.routing")


@dataclass
class GateScorer:
    """A gate model directory's SLB in float, as the benches score with it: its query encoder, its exemplar rows
    and their vectors, and gate.json's calibrated exemplar weight, temperature, gap and tool bias (``load_scorer``)."""

    dir: Path
    meta: dict[str, Any]
    qenc: Any
    rows: list[dict[str, Any]]
    ex_v: np.ndarray
    tool_of_row: np.ndarray

    @property
    def w(self) -> float:
        return float(self.meta["slb"]["exemplar_weight"])

    @property
    def temp(self) -> float:
        return float(self.meta["slb"].get("exemplar_temperature", 0.0))

    @property
    def gap(self) -> float:
        return float(self.meta["slb"].get("exemplar_gap", 0.0))

    def bias(self, names: Sequence[str]) -> np.ndarray:
        """The calibrated tool bias of each of ``names`` (0 for a tool without one)."""
        tb = self.meta["slb"].get("tool_bias") or {}
        return np.array([float(tb.get(n, 0.0)) for n in names], np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from training.gate import _encode_eval

        return _encode_eval(self.qenc, list(texts))

    def scores(self, texts: Sequence[str], keys: np.ndarray, leave_out: np.ndarray | None = None) -> np.ndarray:
        """The SLB's float scores of ``texts`` over the tools of ``keys`` (no tool bias): ``float_tool_scores`` at
        the model's calibrated exemplar weight, temperature and gap; ``leave_out``: each text's own exemplar row
        (-1: none)."""
        from training.gate import float_tool_scores

        return float_tool_scores(self.embed(texts), keys, self.ex_v, self.tool_of_row, self.w, self.temp, self.gap,
                                 leave_out=leave_out)


def load_scorer(gdir: Path, names: Sequence[str]) -> GateScorer:
    """``GateScorer`` of the gate model at ``gdir`` over the registry ``names`` (the exemplar rows' tools by index)."""
    from sentence_transformers import SentenceTransformer

    pos = {n: i for i, n in enumerate(names)}
    rows = [json.loads(x) for x in (gdir / "exemplars.jsonl").read_text().splitlines() if x.strip()]
    return GateScorer(dir=gdir, meta=json.loads((gdir / "gate.json").read_text()),
                      qenc=SentenceTransformer(str(gdir / "query_encoder"), device="cpu"), rows=rows,
                      ex_v=np.load(gdir / "exemplars.npy").astype(np.float32),
                      tool_of_row=np.array([pos[r["tool"]] for r in rows]))


@dataclass
class FoldModel(GateScorer):
    """One fold of the evaluation's protocol as the float-score benches read it: the fold's cached gate model
    (``train_cached``) as a ``GateScorer``, the lines that choose a bench's parameters (the model's validation lines
    + ``choose_extra``) and the fold's held-out lines (``idxs`` into the protocol's lines)."""

    choose: list[Any] = field(default_factory=list)
    held: list[Any] = field(default_factory=list)
    idxs: list[int] = field(default_factory=list)


@dataclass
class FloatBench:
    """What the float-score benches (retired: docs/experiments/README.md) set up alike: the
    protocol, the registry's names in order (``pos``: name -> index, ``by_name``: name -> Tool), the augment and
    calibration lines (``calib_ex``: the latter's examples), the hyper-parameters and the base embedder's description
    keys of every tool (``keys``, registry order)."""

    proto: Any
    names: list[str]
    pos: dict[str, int]
    by_name: dict[str, Any]
    extra: list[QueryLine]
    calib: list[QueryLine]
    calib_ex: list[Any]
    hp: GateHyperParams
    keys: np.ndarray

    def fold(self, fold: int, models_root: str) -> FoldModel:
        """``load_fold`` of ``fold``, the calibration lines choosing."""
        return load_fold(self.proto, fold, self.hp, models_root, self.extra, self.calib, self.calib_ex)


def float_bench(args: Any) -> FloatBench:
    """``FloatBench`` of a bench's parsed ``add_protocol_args(..., calibration=True)`` flags (+ ``--draws``)."""
    from sentence_transformers import SentenceTransformer

    from evals.routing import load_protocol
    from services.common.models import default_embedder_path
    from training.gate import _encode_eval, make_examples, tool_text

    proto = load_protocol(args.queries, args.tools, args.sizes, draws=args.draws)
    names = list(proto.registry.names)
    by_name = {t.name: t for t in proto.registry.tools}
    extra, calib = proto.extra_lines(args.augment), proto.extra_lines(args.calibration)
    hp = GateHyperParams(seed=0)
    base = SentenceTransformer(str(default_embedder_path()), device="cpu")
    keys = _encode_eval(base, [tool_text(by_name[n]) for n in names])
    del base
    return FloatBench(proto=proto, names=names, pos={n: i for i, n in enumerate(names)}, by_name=by_name,
                      extra=extra, calib=calib, calib_ex=make_examples(calib, set(names), equivalents, hp.max_turns),
                      hp=hp, keys=keys)


def load_fold(proto: Any, fold: int, hp: GateHyperParams, models_root: str, extra: Sequence[QueryLine] = (),
              calibration: Sequence[QueryLine] = (), choose_extra: Sequence[Any] = ()) -> FoldModel:
    """``FoldModel`` of ``fold`` of ``proto`` (a ``routing.Protocol``): trained once (cached) on the other folds +
    ``extra``, calibrated on its validation lines + ``calibration``; ``choose_extra``: examples that join its
    validation lines as the bench's choosing lines (usually the calibration lines' examples)."""
    from training.gate import make_examples

    registry, known = proto.registry, set(proto.registry.names)
    train, idxs = proto.split(fold)
    gdir = train_cached(train, registry, hp, models_root, False, label=f"fold {fold}", extra=extra,
                        calibration=calibration)
    sc = load_scorer(gdir, registry.names)
    examples = {e.id: e for e in make_examples(train, known, equivalents, hp.max_turns)}
    return FoldModel(**{f.name: getattr(sc, f.name) for f in fields(GateScorer)},
                     choose=[examples[i] for i in sc.meta["val_ids"]] + list(choose_extra),
                     held=make_examples([proto.lines[i] for i in idxs], known, equivalents, hp.max_turns),
                     idxs=list(idxs))
