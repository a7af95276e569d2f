"""The gate models the routing evaluation needs, trained once and cached under ``var/models``.

* one per fold (k-fold over each tool's lines, ``data.assign_folds``): trained on the other folds' lines,
  so every evaluated line was never seen by the query encoder, the cross-encoder, tau or alpha;
* one with a whole server's lines held out (generalization to tools the router was never trained on).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from services.evals.data import QueryLine, Registry, equivalents, load_queries
from services.router.argevidence import CLIP
from services.router.training import GateHyperParams, default_gate_dir, train_gate

log = logging.getLogger("nexus.evals.routing")


def prepare_training_env() -> None:
    """Before torch starts: idle OpenMP workers must yield on shared cores (spinning made 2-thread
    inference ~20x slower here while other jobs ran), and nothing may reach for a hub."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def jsonl_files(path: str | Path) -> list[Path]:
    """The files of a JSONL file or a directory of them (sorted; '' = none)."""
    if not path:
        return []
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"augment data {root} does not exist")
    return sorted(root.glob("*.jsonl"))


def load_augment(path: str | Path) -> list[QueryLine]:
    """Fit-only training lines (``data/routing_augment/*.jsonl``: requests written from the tool schemas
    alone, never from the evaluation's query file). '' means none."""
    return [ln for f in jsonl_files(path) for ln in load_queries(f)]


def train_cached(lines: Sequence[QueryLine], registry: Registry, hp: GateHyperParams, models_root: str,
                 progress: bool = True, label: str = "", extra: Sequence[QueryLine] = (),
                 calibration: Sequence[QueryLine] = (), slots: str = "") -> Path:
    """The gate model of ``lines`` + ``extra`` under ``models_root`` (trained once per data hash), calibrated on
    its validation lines + ``calibration`` (a cached model is recalibrated in place when that set changed);
    ``slots``: a slot reader to calibrate the argument-evidence stage for (``calibrate_arg_evidence``)."""
    out = default_gate_dir(lines, registry.tools, hp, root=models_root, equivalents=equivalents, extra=extra)
    if label:
        log.info("gate model for %s: %s", label, out)
    train_gate(lines, registry.tools, out, hp, equivalents=equivalents, progress=progress, extra=extra,
               calibration=calibration)
    if slots:
        calibrate_arg_evidence(out, lines, registry, calibration, slots, progress=progress)
    return out


def calibrate_arg_evidence(gate_dir: str | Path, lines: Sequence[QueryLine], registry: Registry,
                           calibration: Sequence[QueryLine], slots: str, progress: bool = False,
                           force: bool = False, reader: Any = None, write: bool = True,
                           clip: float = CLIP, enum_words: bool = False) -> dict[str, Any]:
    """Choose the gate model's argument-evidence stage (``services.router.argevidence.calibrate``) for the slot
    reader at ``slots`` (or ``reader``, any object with the slot reader's interface) on the model's validation lines
    (ids in gate.json, drawn from its training ``lines``) + ``calibration``, ranked by a real router over the whole
    ``registry``; stored in gate.json unless not ``write`` (a bench asking what a reader would gain). Kept as it is
    when gate.json already holds a choice for this reader and SLB calibration, unless ``force``. ``clip``: the
    features' (``argevidence.candidate_feature``); ``enum_words``: ``argevidence.read``'s."""
    import tempfile

    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.engine.slots import SlotModel
    from services.evals.routing import _open_router
    from services.router import argevidence
    from services.router.training import make_examples

    if reader is None:
        if not SlotModel.exists(slots):
            raise FileNotFoundError(f"no slot reader at {slots}: train one with `nexus train-slots` (make models)")
        reader = SlotModel(slots, threads=1)
    meta = json.loads((Path(gate_dir) / "gate.json").read_text())
    if not force and argevidence.is_current(meta, reader):
        log.info("gate model %s: argument evidence is current (%s)", gate_dir, meta["arg_evidence"]["feature"])
        return meta["arg_evidence"]
    known, max_turns = set(registry.names), int(meta.get("max_turns", 4))
    examples = {e.id: e for e in make_examples(lines, known, equivalents, max_turns)}
    missing = [i for i in meta.get("val_ids", []) if i not in examples]
    if missing:
        raise ValueError(f"{len(missing)} validation ids of {gate_dir} are not among the given lines (e.g. "
                         f"{missing[0]}): pass the lines the model was trained on")
    choose = [examples[i] for i in meta.get("val_ids", [])] + make_examples(calibration, known, equivalents, max_turns)
    by_name = {t.name: t for t in registry.tools}
    with tempfile.TemporaryDirectory(prefix="nexus-arg-evidence-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(registry.tools))
        router = _open_router(store, Embedder(""), gate_dir, slots="")  # the SLB as the router ranks, no 2nd stage

        def decide(text: str, n: int) -> list[tuple[str, float]]:
            return router.decide(text, n).slb_candidates[:n]

        section = argevidence.calibrate(decide, choose, by_name.get, reader, meta, progress=progress,
                                        clip=clip, enum_words=enum_words)
    if not write:
        return section
    argevidence.write(gate_dir, section)
    log.info("gate model %s: argument evidence %s (alpha %s, tau %.4f): choosing top-1 %.3f -> %.3f, escalating "
             "%.1f %%; cross-fit (each half at the other's choice) %.3f -> %.3f", gate_dir, section["feature"],
             section["alpha"], section["tau"], section["choose_top1_slb"], section["choose_top1"],
             100 * section["choose_escalation_rate"], section["crossfit"]["slb_top1"], section["crossfit"]["top1"])
    return section


def fold_models(lines: Sequence[QueryLine], folds: Sequence[int], k: int, registry: Registry,
                hp: GateHyperParams, models_root: str, progress: bool = True,
                extra: Sequence[QueryLine] = (), calibration: Sequence[QueryLine] = (), slots: str = "") -> list[Path]:
    out = []
    for f in range(k):
        train = [ln for ln, g in zip(lines, folds, strict=True) if g != f]
        out.append(train_cached(train, registry, hp, models_root, progress, label=f"fold {f}", extra=extra,
                                calibration=calibration, slots=slots))
    return out


def holdout_model(lines: Sequence[QueryLine], server: str, registry: Registry, hp: GateHyperParams,
                  models_root: str, progress: bool = True, extra: Sequence[QueryLine] = (),
                  calibration: Sequence[QueryLine] = (), slots: str = "") -> Path:
    """Trained and calibrated without any line of ``server`` (its augment and calibration lines included): tools
    the router never saw."""
    train = [ln for ln in lines if registry.server_of.get(ln.tool) != server]
    extra = [ln for ln in extra if registry.server_of.get(ln.tool) != server]
    calibration = [ln for ln in calibration if registry.server_of.get(ln.tool) != server]
    return train_cached(train, registry, replace(hp), models_root, progress, label=f"held-out server {server}",
                        extra=extra, calibration=calibration, slots=slots)


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
        from services.router.training import _encode_eval

        return _encode_eval(self.qenc, list(texts))

    def scores(self, texts: Sequence[str], keys: np.ndarray, leave_out: np.ndarray | None = None) -> np.ndarray:
        """The SLB's float scores of ``texts`` over the tools of ``keys`` (no tool bias): ``float_tool_scores`` at
        the model's calibrated exemplar weight, temperature and gap; ``leave_out``: each text's own exemplar row
        (-1: none)."""
        from services.router.training import float_tool_scores

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
    """What the float-score benches (bench/routing_aggregate, _rescore, _residual_ce, _arg_evidence) set up alike: the
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

    from services.common.models import default_embedder_path
    from services.evals.routing import load_protocol
    from services.router.training import _encode_eval, make_examples, tool_text

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
    from services.router.training import make_examples

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
