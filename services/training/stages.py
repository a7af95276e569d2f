"""Choosing the router's argument-evidence stage for a gate model, and a gate model's SLB in float (both used by
training: ``nexus train-gate --slots``, the late reader's ``nexus train-late-reader``; the evaluation re-exports
them from services.evals.routing_models)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.router.argevidence import CLIP
from services.training.data import QueryLine, Registry, equivalents

log = logging.getLogger("nexus.evals.routing")


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
    from services.router import argevidence
    from services.router.config import RouterConfig
    from services.router.router import Router
    from services.training.gate import make_examples

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
        # the SLB as the router ranks, no second stage
        router = Router(RouterConfig(store_url=str(store.root), gate_model_dir=str(gate_dir), torch_threads=1,
                                     arg_evidence=False, query_encoder_precision="fp32", derived_keys=False), store,
                        Embedder(""))
        asyncio.run(router.sync(force=True))

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
        from services.training.gate import _encode_eval

        return _encode_eval(self.qenc, list(texts))

    def scores(self, texts: Sequence[str], keys: np.ndarray, leave_out: np.ndarray | None = None) -> np.ndarray:
        """The SLB's float scores of ``texts`` over the tools of ``keys`` (no tool bias): ``float_tool_scores`` at
        the model's calibrated exemplar weight, temperature and gap; ``leave_out``: each text's own exemplar row
        (-1: none)."""
        from services.training.gate import float_tool_scores

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
