"""The margin gate's second stage: argument-level evidence from the slot reader.

The data's close neighbours differ in what a request *states* rather than in what it is about: a namespace
(``pods_list`` vs ``pods_list_in_namespace``), a local path (``git_*`` vs GitHub), a CSS selector vs a snapshot ref,
an id (get vs list). Cross-encoders over name + description stayed at chance on the lines the gate escalates
(docs/experiments/routing_experiments.md §18). The engine's slot reader (``services/engine/slots.py``: a MiniLM
question-answering cross-encoder fine-tuned from the all-MiniLM-L6-v2 weights on the augment lines) answers, per
parameter of a tool, "where does the request state it?" with a score (best-span logit minus "not stated"). On an
escalated request the router reads the parameters of its SLB's top ``top_k`` candidates and re-ranks them by

    slb_score + alpha * feature(candidate)

with ``feature`` one of

* ``req_min``: the weakest of the candidate's required span parameters' scores, clipped to +-``clip`` and scaled to
  +-1 (0 when it requires none): a tool whose required argument the request does not state loses. ``clip`` is the
  section's: ``CLIP`` (10) for the slot reader, 2 for the late reader, whose scores past a couple of logits are
  confidence, not more evidence (docs/experiments/routing_experiments.md §26);
* ``req_mean``: their mean;
* ``stated``: how many of its span parameters (required or not) the reader finds stated (score above its threshold).

``calibrate`` chooses the feature, ``alpha`` and the escalation threshold ``tau`` (a quantile of the choosing lines'
SLB margins, as the router computes them) on the gate model's validation + calibration lines, keeping the second
stage only when it gains ``MIN_GAIN`` top-1 over the SLB alone. The choice lives in ``gate.json`` under
``arg_evidence`` with the reader it was made for and the SLB calibration it was made under; a router whose reader or
gate differs ignores it (logged) and does not escalate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.common.tools import Tool
from services.router.keys import query_part

log = logging.getLogger("nexus.router.argevidence")

ARG_EVIDENCE_VERSION = "arg-evidence-v1"
FEATURES = ("req_min", "req_mean", "stated")
# the features that read required parameters only: on the folds' held-out lines as accurate as all three
# (bench/routing_arg_evidence.py, retired: docs/experiments/README.md; N = 250: 91.7 vs 91.5 %) with ~230 instead of up to ~840 padded reader tokens per
# escalation, but on the production model's choosing lines they gain 0.2 points, below MIN_GAIN, where `stated`
# gains 0.7: the product still chooses from all three (docs/experiments/routing_experiments.md §19)
REQUIRED_FEATURES = ("req_min", "req_mean")
ALPHAS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
ESCALATE_Q = (0.1, 0.2, 0.3)
CLIP = 10.0
TOP_K = 4
# the product reads only what tells the candidates apart (``drop_shared``): as accurate on the held-out lines as
# reading every parameter (bench/routing_arg_evidence.py, retired: docs/experiments/README.md; N = 250 91.5 vs 91.6 %) with 30-45 % fewer questions, and
# the reader's time is the escalated request's latency
DISTINCT = True
# top-1 the second stage must gain on the choosing lines to be kept (0.5 points: ~7 of ~1,450 lines; it costs a
# reader pass per escalated request). bench/routing_arg_evidence.py (retired: docs/experiments/README.md): +0.7 / +1.2 / +1.1 on the folds' choosing
# lines, each confirmed on their held-out lines.
MIN_GAIN = 0.005

# one candidate's reading: (parameter, required, score) per span parameter read
Reading = Sequence[tuple[str, bool, float]]


def candidate_feature(reading: Reading, kind: str, threshold: float, clip: float = CLIP) -> float:
    """The argument evidence of one candidate tool (see the module doc); ``clip``: where a required parameter's score
    saturates (the section's ``clip``)."""
    if kind == "stated":
        return float(sum(s >= threshold for _, _, s in reading))
    req = [max(-clip, min(clip, s)) / clip for _, r, s in reading if r]
    if kind not in ("req_min", "req_mean"):
        raise ValueError(f"unknown argument-evidence feature {kind!r} (expected one of {FEATURES})")
    if not req:
        return 0.0
    return float(min(req)) if kind == "req_min" else float(np.mean(req))


def rerank(slb: np.ndarray, feats: np.ndarray, alpha: float) -> np.ndarray:
    """The candidates' order by ``slb + alpha * feats``, best first (ties keep the SLB's order)."""
    z = np.asarray(slb, np.float64) + alpha * np.asarray(feats, np.float64)
    return np.argsort(-z, kind="stable")


def margins(scores: np.ndarray) -> np.ndarray:
    """Top-1 minus top-2 score per row (-inf entries are tools outside the registry)."""
    t = -np.sort(-scores, axis=1)[:, :2]
    return t[:, 0] - t[:, 1]


def reader_key(reader) -> dict[str, Any]:
    """What identifies a slot reader's scores: its training data and threshold."""
    return {"data_hash": reader.meta.get("data_hash"), "threshold": float(reader.threshold),
            "format": reader.meta.get("format")}


def slb_key(meta: dict[str, Any]) -> dict[str, Any]:
    """What identifies the SLB scoring of a gate model: its data and its SLB calibration."""
    slb = meta.get("slb") or {}
    bias = json.dumps(slb.get("tool_bias") or {}, sort_keys=True)
    return {"data_hash": meta.get("data_hash"), "slb_version": slb.get("version"),
            "calibration_hash": slb.get("calibration_hash", ""),
            "tool_bias": hashlib.sha256(bias.encode()).hexdigest()[:16]}


def shared_names(param_names: Sequence[Sequence[str] | None]) -> set[str]:
    """The parameter names every candidate has (None: a tool that is gone; ignored). With fewer than two
    candidates nothing is shared."""
    sets = [set(p) for p in param_names if p is not None]
    return set.intersection(*sets) if len(sets) > 1 else set()


def drop_shared(readings: Sequence[Reading]) -> list[list[tuple[str, bool, float]]]:
    """``readings`` without the parameters every candidate has: what tells the candidates apart."""
    shared = shared_names([[n for n, _, _ in r] for r in readings])
    return [[x for x in r if x[0] not in shared] for r in readings]


# Enum parameters stated in words ("close it without merging" states state=closed): a span reader reads them as not
# stated. With enum words on, a parameter one of whose enum values the request's words name (``enum_stated``) reads
# at +CLIP: the late reader's held-out gain at N = 250 +0.62 -> +1.11 (docs/experiments/routing_experiments.md §28). A
# section records whether it was calibrated with them (``enum_words``; absent: off); ENUM_WORDS is what ``read``
# and ``calibrate`` use when not told (a bench's --enum-words turns it on).
ENUM_WORDS = False


def _words_match(a: str, b: str) -> bool:
    """The same word up to a short inflection ("close" / "closed", "merge" / "merging"); words under 4 letters exactly."""
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    if len(short) < 4:
        return False
    stem = short[:-1] if short.endswith("e") else short
    return long_.startswith(stem) and len(long_) - len(stem) <= 3


def enum_stated(prop: dict[str, Any], query: str) -> bool:
    """Whether ``query``'s words name one of ``prop``'s string enum values (every word of a value like
    ``not_planned``)."""
    values = [v for v in prop.get("enum") or [] if isinstance(v, str) and v]
    if not values:
        return False
    words = re.findall(r"[a-z0-9]+", query.lower())
    for v in values:
        parts = re.findall(r"[a-z0-9]+", v.lower())
        if parts and all(any(_words_match(p, w) for w in words) for p in parts):
            return True
    return False


def read(reader, text: str, tools: Sequence[Tool | None], required_only: bool,
         distinct: bool = False, states: Any = None, enum_words: bool | None = None) -> list[list[tuple[str, bool, float]]]:
    """The reader's score of every span parameter of each tool (``required_only``: its required ones) in ``text``:
    one batch. A tool that is None (unregistered meanwhile) reads as no parameters. ``distinct``: parameters every
    tool has (by name, e.g. owner and repo of GitHub twins) are not read (``drop_shared``). ``states``: ``text``'s
    token states from the router's own pass, for a reader that reads them (services.router.late_reader); used when
    the reader's context is the whole text. ``enum_words``: enum parameters the request names in words read at +CLIP
    (None: ``ENUM_WORDS``)."""
    from services.engine.slots import slot_context, slot_params, slot_question

    ctx, _ = slot_context(text)
    params = [slot_params(t) if t is not None else None for t in tools]
    shared = shared_names([[n for n, _ in p] if p is not None else None for p in params]) if distinct else set()
    questions: list[str] = []
    owners: list[tuple[int, str, bool]] = []
    stated_enums: set[tuple[int, str]] = set()
    enum_words = ENUM_WORDS if enum_words is None else enum_words
    query = query_part(text) if enum_words else ""
    for j, tool in enumerate(tools):
        if tool is None:
            continue
        req = set((tool.input_schema or {}).get("required") or [])
        for name, prop in params[j]:
            if (required_only and name not in req) or name in shared:
                continue
            questions.append(slot_question(tool, name, prop))
            owners.append((j, name, name in req))
            if enum_words and enum_stated(prop, query):
                stated_enums.add((j, name))
    out: list[list[tuple[str, bool, float]]] = [[] for _ in tools]
    given = {"states": states} if states is not None and ctx == text else {}
    spans = reader.score(questions, ctx, k=1, **given) if questions else []
    for (j, name, req), s in zip(owners, spans, strict=True):
        score = float(s[0][2]) if s else -CLIP
        out[j].append((name, req, max(score, CLIP) if (j, name) in stated_enums else score))
    return out


def questions_of(tools: Sequence[Tool]) -> list[str]:
    """Every question ``read`` may ask of ``tools``: one per span parameter (what a reader can cache per registry)."""
    from services.engine.slots import slot_params, slot_question

    return [slot_question(t, name, prop) for t in tools for name, prop in slot_params(t)]


@dataclass(frozen=True)
class ArgEvidence:
    """A calibrated second stage: the reader and the choice ``calibrate`` made."""

    reader: Any
    feature: str
    alpha: float
    tau: float
    top_k: int = TOP_K
    distinct: bool = False  # only the parameters that not every candidate has are read (``drop_shared``)
    clip: float = CLIP  # where a required parameter's score saturates (``candidate_feature``)
    enum_words: bool = False  # enum parameters named in the request's words read as stated (``enum_stated``)

    def features(self, text: str, tools: Sequence[Tool | None], states: Any = None) -> np.ndarray:
        readings = read(self.reader, text, tools, required_only=self.feature != "stated", distinct=self.distinct,
                        states=states, enum_words=self.enum_words)
        return np.array([candidate_feature(r, self.feature, self.reader.threshold, self.clip) for r in readings],
                        np.float64)

    def rescore(self, text: str, slb: Sequence[tuple[str, float]],
                tool_of: Callable[[str], Tool | None], states: Any = None) -> list[tuple[str, float]]:
        """``slb`` (the top ``top_k`` (name, score) candidates) re-ranked, each with its fused score
        ``slb + alpha * feature``, best first. ``states``: ``text``'s, for a reader of the router's states."""
        feats = self.features(text, [tool_of(n) for n, _ in slb], states)
        scores = np.array([s for _, s in slb], np.float64)
        fused = scores + self.alpha * feats
        return [(slb[i][0], float(fused[i])) for i in rerank(scores, feats, self.alpha)]


def from_gate(meta: dict[str, Any], reader) -> ArgEvidence | None:
    """The second stage ``meta`` (a gate.json) chose, when it chose one for this ``reader`` under its own SLB
    calibration; else None (logged when it is stale)."""
    doc = meta.get("arg_evidence")
    if not doc or reader is None:
        return None
    if doc.get("version") != ARG_EVIDENCE_VERSION:
        log.warning("gate.json arg_evidence is of version %s, not %s: no escalation (`make models` or `nexus "
                    "train-gate --slots DIR` calibrates it)", doc.get("version"), ARG_EVIDENCE_VERSION)
        return None
    if doc.get("reader") != reader_key(reader) or doc.get("slb") != slb_key(meta):
        log.warning("gate.json arg_evidence was calibrated for another slot reader or SLB calibration: no escalation "
                    "(`make models` or `nexus train-gate --slots DIR` calibrates it)")
        return None
    if doc.get("feature") in (None, "none"):
        return None
    try:
        alpha, tau, top_k = float(doc["alpha"]), float(doc["tau"]), int(doc.get("top_k", TOP_K))
        clip = float(doc.get("clip", CLIP))  # sections written before it was recorded used CLIP
    except (KeyError, TypeError, ValueError):
        alpha, tau, top_k, clip = float("nan"), float("nan"), 0, float("nan")
    if (doc["feature"] not in FEATURES or not (np.isfinite(alpha) and np.isfinite(tau) and np.isfinite(clip))
            or alpha <= 0 or top_k < 2 or clip <= 0):
        log.error("gate.json arg_evidence unusable (%s): no escalation",
                  {k: doc.get(k) for k in ("feature", "alpha", "tau", "top_k", "clip")})
        return None
    return ArgEvidence(reader, doc["feature"], alpha, tau, top_k, bool(doc.get("distinct")), clip,
                       doc.get("enum_words") is True)


def is_current(meta: dict[str, Any], reader, distinct: bool = DISTINCT) -> bool:
    """Whether ``meta`` holds a choice (any, "none" included) made for ``reader`` under its SLB calibration, reading
    as ``distinct`` says."""
    doc = meta.get("arg_evidence") or {}
    return (doc.get("version") == ARG_EVIDENCE_VERSION and doc.get("reader") == reader_key(reader)
            and doc.get("slb") == slb_key(meta) and bool(doc.get("distinct")) == distinct)


def calibrate(decide: Callable[[str, int], Sequence[tuple[str, float]]], choose: Sequence[Any],
              tool_of: Callable[[str], Tool | None], reader, meta: dict[str, Any], top_k: int = TOP_K,
              distinct: bool = DISTINCT, progress: bool = False, features: Sequence[str] = FEATURES,
              read_all: Callable[[str, list[str]], list[Reading]] | None = None,
              alphas: Sequence[float] = ALPHAS, clip: float = CLIP, enum_words: bool | None = None) -> dict[str, Any]:
    """Choose the feature (of ``features``), alpha and tau on ``choose`` (examples with ``.text`` and
    ``.positives``): ``decide(text, n)`` gives the SLB's top ``n`` (name, score) as the router ranks them over the
    full registry; ``distinct``: the features read only what tells the candidates apart (``drop_shared``);
    ``read_all(text, names)``: every span parameter's reading per tool (default: the reader's, now; a bench passes
    its cache). Returns the ``arg_evidence`` section of gate.json (``feature`` "none" when nothing gains
    ``MIN_GAIN``), with what the choice gains on lines it was not made on (``crossfit``, ``_crossfit``). ``alphas``:
    the grid alpha is chosen from (a bench widening it); ``clip``: ``candidate_feature``'s, recorded; ``enum_words``:
    ``read``'s (None: ``ENUM_WORDS``; a ``read_all`` reads as the module says), recorded."""
    from tqdm import tqdm

    if not choose:
        raise ValueError("no choosing lines to calibrate the argument evidence on")
    enum_words = ENUM_WORDS if enum_words is None else enum_words
    tops = [list(decide(e.text, max(top_k, 2))) for e in choose]
    m = np.array([t[0][1] - t[1][1] if len(t) > 1 else np.inf for t in tops], np.float64)
    base = np.array([bool(t) and t[0][0] in e.positives for t, e in zip(tops, choose, strict=True)])
    finite = m[np.isfinite(m)]
    # a registry of one tool has no margins: nothing ever escalates
    thrs = {q: float(np.quantile(finite, q)) for q in ESCALATE_Q} if len(finite) else {}
    esc = [i for i in range(len(choose)) if thrs and m[i] < max(thrs.values())]
    feats: dict[int, dict[str, np.ndarray]] = {}
    for i in tqdm(esc, desc="argument evidence (reading candidates)", disable=not progress):
        cands = tops[i][:top_k]
        if read_all is None:
            readings = read(reader, choose[i].text, [tool_of(n) for n, _ in cands], "stated" not in features,
                            distinct, enum_words=enum_words)
        else:
            readings = read_all(choose[i].text, [n for n, _ in cands])
            readings = drop_shared(readings) if distinct else readings
        feats[i] = {f: np.array([candidate_feature(r, f, reader.threshold, clip) for r in readings])
                    for f in features}
    none = float(base.mean())
    grid, rights = [], []
    for q, thr in thrs.items():
        for feat in features:
            for alpha in alphas:
                right = base.copy()
                for i in esc:
                    if m[i] < thr:
                        cands = tops[i][:top_k]
                        pick = cands[int(rerank(np.array([s for _, s in cands]), feats[i][feat], alpha)[0])][0]
                        right[i] = pick in choose[i].positives
                grid.append({"q": q, "feature": feat, "alpha": alpha, "top1": round(float(right.mean()), 5)})
                rights.append(({"feature": feat, "alpha": alpha, "tau": thr, "q": q}, right))
    best = _best(rights, base, np.ones(len(choose), bool))
    keep = best["top1"] >= none + MIN_GAIN
    chosen = best if keep else {"top1": none, **NO_STAGE}
    return {"version": ARG_EVIDENCE_VERSION, "reader": reader_key(reader), "slb": slb_key(meta),
            "feature": chosen["feature"], "alpha": chosen["alpha"], "tau": chosen["tau"], "quantile": chosen["q"],
            "top_k": top_k, "distinct": distinct, "clip": clip, "enum_words": enum_words, "min_gain": MIN_GAIN,
            "n_choose": len(choose),
            "choose_top1_slb": none, "choose_top1": chosen["top1"],
            "best_if_kept": {k: best[k] for k in ("feature", "alpha", "tau", "q", "top1")},
            "choose_escalation_rate": float(np.mean(m < chosen["tau"])) if keep else 0.0,
            "crossfit": _crossfit(rights, base, [e.text for e in choose]), "grid": grid}


NO_STAGE = {"feature": "none", "alpha": 0.0, "tau": 0.0, "q": 0.0}


def _best(rights: Sequence[tuple[dict[str, Any], np.ndarray]], base: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """The setting of ``rights`` (each with its lines' correctness) most accurate on the lines in ``mask`` (the
    first of equals; none unless one beats the SLB alone), with that accuracy as ``top1``."""
    best = {"top1": float(base[mask].mean()), **NO_STAGE}
    for setting, right in rights:
        acc = float(right[mask].mean())
        if acc > best["top1"] + 1e-12:
            best = {"top1": acc, **setting}
    return best


# the cross-fit's random halvings of the choosing lines: one halving moves the figure by ~0.3 points (§23)
CROSSFIT_SPLITS = 10


def halves(texts: Sequence[str], split: int) -> np.ndarray:
    """Which half (0 or 1) of halving ``split`` each line falls in: a hash of its text (salted by the split after
    the first)."""
    salt = f"{split}\n" if split else ""
    return np.array([int(hashlib.sha256((salt + t).encode()).hexdigest(), 16) % 2 for t in texts])


def _crossfit(rights: Sequence[tuple[dict[str, Any], np.ndarray]], base: np.ndarray, texts: Sequence[str],
              splits: int = CROSSFIT_SPLITS) -> dict[str, Any]:
    """What the stage gains on lines it was not chosen on: the choosing lines halved (``halves``), the setting
    chosen on each half as ``calibrate`` chooses (none below ``MIN_GAIN``) and scored on the other, over ``splits``
    halvings; ``top1`` is their mean. The whole set's choice is the best of the grid's settings on the very lines it
    is scored on, optimistic by about as much as it gains (docs/experiments/routing_experiments.md §23); this is its honest
    counterpart. tau stays the whole set's quantile (the margins carry no labels)."""
    by = {(s["feature"], s["alpha"], s["q"]): r for s, r in rights}
    out = []
    for split in range(splits):
        half = halves(texts, split)
        masks = [half == h for h in (0, 1)]
        right, choices = base.copy(), []
        for h in (0, 1) if all(mk.any() for mk in masks) else ():  # all lines on one side: the SLB's answers
            b = _best(rights, base, masks[h])
            c = b if b["top1"] >= float(base[masks[h]].mean()) + MIN_GAIN else {**NO_STAGE, "top1": b["top1"]}
            choices.append({k: c[k] for k in ("feature", "alpha", "q")})
            other = masks[1 - h]
            right[other] = base[other] if c["feature"] == "none" else by[c["feature"], c["alpha"], c["q"]][other]
        out.append({"n": [int(mk.sum()) for mk in masks], "top1": float(right.mean()), "choices": choices})
    return {"slb_top1": float(base.mean()), "top1": float(np.mean([o["top1"] for o in out])), "splits": out}


def write(gate_dir: str | Path, section: dict[str, Any]) -> None:
    """Store ``section`` as gate.json's ``arg_evidence`` (atomically: a router loading meanwhile reads either)."""
    path = Path(gate_dir) / "gate.json"
    doc = json.loads(path.read_text())
    doc["arg_evidence"] = section
    fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc, indent=2, sort_keys=True))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
