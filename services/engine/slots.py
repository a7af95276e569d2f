"""Slot hints: an extractive reader that proposes, for each parameter of the chosen tool, the span of the
request that states its value.

The 135M chat model copies spans well once the copy bias holds it to them, but it often picks the wrong span
for a key (``owner: "web-app", repo: "bug"`` for "label 'bug' details, octo-org/web-app"). Which span states
which parameter is a reading-comprehension question, so a MiniLM reader (all-MiniLM-L6-v2 weights with a
start/end head, fine-tuned by ``train_slots``) answers it per parameter:

    question: "<tool name as words> | <parameter as words> (<type>[: enum values]): <description start>"
    context:  the request text the copy bias copies from (pruned window + request)

Its answer is a *hint*: the copy bias favours that span while the model writes that key's value
(``CopyBias.begin(source, hints)``); the grammar and the model still decide, so a wrong hint costs a bias, not
validity. A parameter gets no hint when the reader prefers "not stated" by more than ``threshold`` (chosen on
validation lines by ``train_slots``).

A slot model directory holds ``slots.json`` (format, threshold, hyper-parameters, data hash, validation
figures) and ``reader/``: its tokenizer and either ``model.int8.onnx`` (the serving form that ships in models/slots:
the reader's start/end logits graph, dynamic INT8, run on onnxruntime; ``training.slots.export_onnx``) or a
transformers question-answering model (what training writes; torch runs it)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.common.tools import Tool
from services.engine.copybias import NUMBER, QUOTES, open_marks

log = logging.getLogger("nexus.engine.slots")

SLOTS_FORMAT = "nexus-slots-v1"
DESC_WORDS = 14
MAX_ANSWER_TOKENS = 24
CONTEXT_CHARS = 700  # the request is at the end of the source: keep its tail
NUMBER_CANDIDATES = 10  # spans a number parameter looks through for its best number (SlotModel.hints)


@dataclass(frozen=True)
class Hint:
    start: int  # character offsets into the source
    end: int
    score: float  # best span logit minus the "not stated" logit

    def text(self, source: str) -> str:
        return source[self.start:self.end]


def _words(name: str) -> str:
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return re.sub(r"[_\-.]+", " ", s).strip().lower()


def slot_type(prop: dict[str, Any]) -> str | None:
    """The parameter's value type when a span of the request can state it (string, integer, number; enums
    included), else None (booleans, objects, arrays)."""
    t = prop.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if t is None and isinstance(prop.get("enum"), list):
        t = "string"
    return t if t in ("string", "integer", "number") else None


def slot_params(tool: Tool) -> list[tuple[str, dict[str, Any]]]:
    props = (tool.input_schema or {}).get("properties") or {}
    return [(k, p) for k, p in props.items() if isinstance(p, dict) and slot_type(p)]


def slot_question(tool: Tool, name: str, prop: dict[str, Any]) -> str:
    desc = re.sub(r"\s+", " ", str(prop.get("description") or "")).strip()
    desc = " ".join(desc.split(" ")[:DESC_WORDS])
    kind = slot_type(prop) or "value"
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        kind += ": " + ", ".join(str(e) for e in enum[:8])
    return f"{_words(tool.name)} | {_words(name)} ({kind}): {desc}"


def slot_context(source: str) -> tuple[str, int]:
    """The tail of ``source`` the reader sees, and its offset in ``source``."""
    if len(source) <= CONTEXT_CHARS:
        return source, 0
    cut = len(source) - CONTEXT_CHARS
    space = source.find(" ", cut)
    cut = space + 1 if 0 <= space < cut + 40 else cut
    return source[cut:], cut


def top_spans(start_logits: np.ndarray, end_logits: np.ndarray, context_mask: np.ndarray, k: int = 1,
              max_tokens: int = MAX_ANSWER_TOKENS, lines: np.ndarray | None = None) -> list[tuple[int, int, float]]:
    """The ``k`` best (start, end, score) token spans inside the context (end >= start, at most ``max_tokens``
    long), best first; score = ``s + e - (s_cls + e_cls)``: > 0 means the reader prefers the span to
    "not stated". ``lines`` (each token's line of the context): a span never crosses a line break — the window's
    turns and the request are lines, and the reader otherwise answered ``shop.\nDeployments in shop``."""
    s = np.where(context_mask, start_logits, -np.inf)
    e = np.where(context_mask, end_logits, -np.inf)
    n = len(s)
    band = min(max_tokens, n)
    pair = np.full((n, band), -np.inf)  # pair[i, d]: span from token i to token i + d
    for d in range(band):
        pair[: n - d, d] = s[: n - d] + e[d:]
        if lines is not None and d:
            pair[: n - d, d][lines[: n - d] != lines[d:]] = -np.inf
    null = float(start_logits[0] + end_logits[0])
    flat = np.argsort(pair, axis=None)[::-1][:k]
    out = []
    for f in flat:
        i, d = divmod(int(f), band)
        if np.isfinite(pair[i, d]):
            out.append((i, i + d, float(pair[i, d]) - null))
    return out or [(0, 0, -np.inf)]


URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def clean_span(context: str, a: int, b: int) -> tuple[int, int]:
    """A span that opens right after a quote mark ends at the closing one (the reader sometimes runs a quoted
    value on: ``bug' details``), one that opens with a URL ends with it (a URL holds no whitespace; the reader
    answered ``https://example.com/data/large.csv into large.csv.gz``), and either loses surrounding whitespace."""
    if 0 < a < b and context[a - 1] in QUOTES:
        close = context.find(context[a - 1], a, b)
        if close > a:
            b = close
    while a < b and context[a].isspace():
        a += 1
    url = URL.match(context, a, b)
    if url:
        b = url.end()
    while b > a and context[b - 1].isspace():
        b -= 1
    return a, b


def balance_span(context: str, a: int, b: int) -> tuple[int, int]:
    """Grow a span to close what it opened: the reader's word-piece answers stop before punctuation
    (``a[href='/signup`` of ``a[href='/signup']``, ``localStorage.clear`` of ``localStorage.clear()``).
    Only on syntactic evidence: closers that follow at once, a call's parentheses right after a name, and a
    semicolon that ends the text (``... FROM invoices;``, as the copy bias reads it)."""
    end = context.find("\n", b)
    end = len(context) if end < 0 else end
    if a < b < end and context[b] == "(" and (context[b - 1].isalnum() or context[b - 1] == "_"):
        depth, j = 0, b
        while j < end:
            depth += {"(": 1, ")": -1}.get(context[j], 0)
            j += 1
            if depth == 0:
                b = j
                break
    need = open_marks(context[a:b])
    while need and b < end and context[b] == need[-1]:
        b += 1
        need.pop()
    if a < b and context[b:].strip() == ";":
        b = context.index(";", b) + 1
    return a, b


def read_spans(model, tokenizer, questions: list[str], contexts: list[str], max_len: int, k: int = 1,
               one_line: bool = True, balance: bool = True) -> list[list[tuple[int, int, float]]]:
    """For each (question, context): its ``k`` best answers as character spans of the context with their scores
    (see top_spans, clean_span, balance_span), best first; ``one_line``: none crosses a line break. One batch;
    training's validation and the engine both read so."""
    onnx = isinstance(model, OnnxReader)
    enc = tokenizer(questions, contexts, truncation="only_second", max_length=max_len, padding=True,
                    return_offsets_mapping=True, return_tensors="np" if onnx else "pt")
    offsets = np.asarray(enc.pop("offset_mapping"))
    if onnx:
        starts, ends = model(enc)
    else:
        import torch

        with torch.inference_mode():
            out = model(**enc)
        starts, ends = out.start_logits.numpy(), out.end_logits.numpy()
    res = []
    for i, context in enumerate(contexts):
        mask = np.array([sid == 1 for sid in enc.sequence_ids(i)], dtype=bool)
        breaks = np.cumsum([ch == "\n" for ch in context])  # line breaks up to and including each character
        lines = np.where(mask, breaks[np.minimum(offsets[i][:, 0], len(context) - 1)] if context else 0, -1)
        spans = [(*clean_span(context, int(offsets[i][a][0]), int(offsets[i][b][1])), sc)
                 for a, b, sc in top_spans(starts[i], ends[i], mask, k, lines=lines if one_line else None)]
        res.append([(*balance_span(context, a, b), sc) if balance else (a, b, sc) for a, b, sc in spans])
    return res


# words that put a parameter first or second of a pair of numbers a request states in that order
FIRST_WORDS = frozenset({"start", "begin", "from", "min", "first", "low", "lower", "x", "width", "lat", "latitude",
                         "src", "source", "origin", "old"})
SECOND_WORDS = frozenset({"end", "to", "max", "last", "high", "upper", "y", "height", "lng", "lon", "longitude",
                          "dst", "dest", "destination", "target", "new"})


def _ordinal(name: str) -> tuple[int, ...]:
    """(0 | 1 per pair word of the name): ``startX`` (0, 0) < ``startY`` (0, 1) < ``endX`` (1, 0) < ``endY``."""
    return tuple(0 if w in FIRST_WORDS else 1 for w in _words(name).split() if w in FIRST_WORDS | SECOND_WORDS)


def order_numbers(hints: dict[str, Hint], numbers: dict[str, list[tuple[int, int, float]]], order: list[str],
                  off: int, threshold: float) -> dict[str, Hint]:
    """Number parameters whose hints share one span ("x=640, y=360" -> x 360, y 360; "add 3.5 and 8.25" -> a 8.25,
    b 8.25): the distinct numbers among their candidates (``numbers``: each parameter's numeric spans, best first,
    offsets in the context; those above ``threshold``, not another parameter's hint) go to them in the order the
    request states them, the parameters taken by their pair words (start before end, x before y, width before
    height: ``_ordinal``), then in ``order`` (the schema's: ``a`` before ``b``). A number inside a better one is not
    another (``25`` of ``8.25``). A group keeps its hints when there are fewer such numbers than parameters.
    Returns the hints that change."""
    by_span: dict[tuple[int, int], list[str]] = {}
    for name, h in hints.items():
        if name in numbers:
            by_span.setdefault((h.start, h.end), []).append(name)
    out: dict[str, Hint] = {}
    for span, group in by_span.items():
        if len(group) < 2:
            continue
        others = {(h.start - off, h.end - off) for n, h in hints.items() if (h.start, h.end) != span}
        pool: dict[tuple[int, int], float] = {}
        for name in group:
            for a, b, sc in numbers[name]:
                if sc > threshold and (a, b) not in others and not any(a < y and x < b for x, y in others):
                    pool[a, b] = max(sc, pool.get((a, b), sc))
        distinct: list[tuple[int, int]] = []
        for a, b in sorted(pool, key=lambda s: -pool[s]):  # "8.25", not also its "25" or "8"
            if not any(a < y and x < b for x, y in distinct):
                distinct.append((a, b))
        if len(distinct) < len(group):
            continue
        chosen = sorted(distinct[:len(group)])
        for name, (a, b) in zip(sorted(group, key=lambda n: (_ordinal(n), order.index(n))), chosen, strict=True):
            sc = next((s for x, y, s in numbers[name] if (x, y) == (a, b)), pool[a, b])
            out[name] = Hint(off + a, off + b, sc)
    return out


ONNX_FILE = "model.int8.onnx"


class OnnxReader:
    """The reader's exported graph (``reader/model.int8.onnx``) on onnxruntime: token ids in, (start, end) logits
    out, as numpy arrays. Each row runs alone, unpadded: the graph quantizes its activations with one scale per
    tensor, so a row read in a batch would depend on the other rows (up to ~1 logit here)."""

    def __init__(self, path: str | Path, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(0, threads)
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, enc) -> tuple[np.ndarray, np.ndarray]:
        feeds = {n: np.asarray(enc[n], np.int64) for n in self.inputs}
        lengths = feeds["attention_mask"].sum(1)
        starts = np.full(feeds["attention_mask"].shape, -1e4, np.float32)
        ends = starts.copy()
        for i, n in enumerate(lengths):
            s, e = self.session.run(None, {k: v[i:i + 1, :n] for k, v in feeds.items()})
            starts[i, :n], ends[i, :n] = s[0], e[0]
        return starts, ends


class SlotModel:
    """A loaded slot reader. ``hints`` is thread-safe."""

    def __init__(self, path: str | Path, threads: int = 2, candidates: int = 0, order: bool = True):
        from transformers import AutoTokenizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        root = Path(path)
        doc = json.loads((root / "slots.json").read_text())
        if doc.get("format") != SLOTS_FORMAT:
            raise ValueError(f"{root}/slots.json: format {doc.get('format')!r}, expected {SLOTS_FORMAT!r}")
        self.meta = doc
        self.threshold = float(doc["threshold"])
        self.max_len = int(doc.get("max_len", 192))
        self.tokenizer = AutoTokenizer.from_pretrained(str(root / "reader"))
        if (root / "reader" / ONNX_FILE).is_file():
            self.model: Any = OnnxReader(root / "reader" / ONNX_FILE, threads)
        else:
            from transformers import AutoModelForQuestionAnswering

            self.model = AutoModelForQuestionAnswering.from_pretrained(str(root / "reader"))
            self.model.eval()
        self.threads = threads
        # spans per parameter considered when spans are shared out (``hints``); 0: each parameter's best span,
        # overlaps allowed
        self.candidates = candidates
        # number parameters that share one span are given the numbers the reader found for them in the order the
        # request states them (``order_numbers``)
        self.order_numbers = order
        self._lock = threading.Lock()

    @staticmethod
    def exists(path: str | Path) -> bool:
        root = Path(path)
        return (root / "slots.json").is_file() and (root / "reader").is_dir()

    def score(self, questions: list[str], context: str, k: int = 1) -> list[list[tuple[int, int, float]]]:
        """For each question: its ``k`` best answers in ``context`` (see read_spans)."""
        if not questions:
            return []
        with self._lock:
            if not isinstance(self.model, OnnxReader):
                import torch

                if torch.get_num_threads() != self.threads and self.threads > 0:
                    torch.set_num_threads(self.threads)
            return read_spans(self.model, self.tokenizer, questions, [context] * len(questions), self.max_len, k)

    def hints(self, tool: Tool, source: str) -> dict[str, Hint]:
        """Parameter name -> the span of ``source`` that states it, for the parameters the reader finds.

        ``candidates`` = 0 (default): each parameter's best span above the threshold. k > 0: each parameter's
        best k spans are taken best first and a span overlapping one already taken is passed over (one phrase,
        one parameter); on the tune split this did not help (64.5 % vs 66.0 %), so it is off. A number
        parameter takes its best span that is a number among the reader's ``NUMBER_CANDIDATES`` best (the reader
        answers ``150,220`` for x and ``50,50 -> 300,260`` for startX; validation stated-exact 91.0 -> 92.3 %)."""
        params = slot_params(tool)
        if not params or not source.strip():
            return {}
        context, off = slot_context(source)
        k = max(1, self.candidates)
        scored = self.score([slot_question(tool, n, p) for n, p in params], context, k=max(k, NUMBER_CANDIDATES))
        cands = []
        numbers: dict[str, list[tuple[int, int, float]]] = {}
        for (name, prop), spans in zip(params, scored, strict=True):
            if slot_type(prop) in ("integer", "number"):
                # a number parameter is stated by a number, not by the reader's nearest words
                spans = numbers[name] = [s for s in spans if NUMBER.fullmatch(context[s[0]:s[1]])]
            for a, b, sc in spans[:k]:
                if sc > self.threshold and b > a:
                    cands.append((sc, name, a, b))
        out: dict[str, Hint] = {}
        taken: list[tuple[int, int]] = []
        for sc, name, a, b in sorted(cands, key=lambda c: -c[0]):
            if name in out or (self.candidates and any(a < y and x < b for x, y in taken)):
                continue
            out[name] = Hint(off + a, off + b, sc)
            taken.append((a, b))
        if self.order_numbers:
            out.update(order_numbers(out, numbers, [n for n, _ in params], off, self.threshold))
        return out


_loaded: dict[tuple[str, int, int, float], SlotModel] = {}
_loaded_lock = threading.Lock()


def load_slots(path: str, threads: int = 2, candidates: int = 0) -> SlotModel | None:
    """The slot reader at ``path``, or None (logged) when there is none or it cannot be read. One instance per
    model directory and version in a process (engines in one process share it; it is read-only)."""
    if not path:
        return None
    doc = Path(path) / "slots.json"
    key = (str(Path(path).resolve()), threads, candidates, doc.stat().st_mtime if doc.is_file() else 0.0)
    with _loaded_lock:
        if key in _loaded:
            return _loaded[key]
    if not SlotModel.exists(path):
        log.warning("no slot model at %s: arguments are generated without slot hints; train one with "
                    "`nexus train-slots`", path)
        return None
    try:
        model = SlotModel(path, threads=threads, candidates=candidates)
    except (OSError, ValueError, KeyError) as e:
        log.error("slot model at %s unreadable (%s): no slot hints", path, e)
        return None
    with _loaded_lock:
        _loaded[key] = model
    log.info("slot reader loaded from %s (threshold %.3f)", path, model.threshold)
    return model
