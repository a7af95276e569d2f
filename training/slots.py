"""Training of the slot reader (services/engine/slots.py): ``nexus train-slots``.

Examples come from query lines (``{"tool","query","args","history"}``): for each parameter of the line's tool
that a span can state, the question is ``slot_question`` and the answer is the gold value's span in the request
text (a positive), or "no span" (the [CLS] position) when the line does not set it or sets it to a value that
is not a span of the request (``Tokyo`` -> ``Asia/Tokyo``: the model maps it, the reader must not hint).

Data discipline: the reader trains on the *augment* lines (``data/routing_augment``, written from the schemas
alone) and picks its threshold on the **tune** split of the query file (``evals.args.tune_split``);
it never sees the held-out split that ``nexus eval args`` reports on. Deterministic for a seed on one machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.common.tools import Tool
from services.engine.slots import SLOTS_FORMAT, read_spans, slot_context, slot_params, slot_question
from services.runtime.prompt import Turn, copy_source, prune_history

log = logging.getLogger("nexus.engine.slots")


@dataclass(frozen=True)
class SlotHyperParams:
    # 2 over the three augment batches (11,907 questions: the steps of 3 epochs over batches 1-2, which keeps
    # `make setup` inside CI's budget); validation stated-exact 89.9 % vs 87.3 % for 3 epochs over batches 1-2
    epochs: int = 2
    lr: float = 5e-5
    batch_size: int = 16
    max_len: int = 192
    max_negatives: int = 2  # unstated parameters sampled per line
    warmup: float = 0.1
    seed: int = 0
    bucket: int = 50  # batches sorted by length within windows of this many batches (1 = plain shuffle)
    history_turns: int = 4  # the engine's pruned window (EngineConfig.history_turns / history_turn_chars)
    history_turn_chars: int = 400


@dataclass(frozen=True)
class SlotExample:
    line_id: str
    param: str
    question: str
    context: str
    start: int  # character span of the answer in context; -1 = not stated
    end: int


def request_source(query: str, history: Sequence[tuple[str, str]], hp: SlotHyperParams) -> str:
    """The text the engine copies from for this line (``copy_source`` over the engine's pruned window)."""
    window = prune_history([Turn(r, c) for r, c in history], hp.history_turns, hp.history_turn_chars)
    return copy_source(query, window)


def _value_text(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, str)):
        return str(v).strip() or None
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    return None


def find_value(context: str, value: str) -> tuple[int, int] | None:
    """Where ``value`` is stated in ``context``: an occurrence bounded by non-word characters if there is one
    (``octo-org`` in ``octo-org/web-app``, not ``org`` inside ``octo-org``), in the last line (the request)
    before the history, else any occurrence."""
    occ = []
    p = context.find(value)
    while p >= 0:
        occ.append(p)
        p = context.find(value, p + 1)
    if not occ:
        return None

    def word(ch: str) -> bool:
        return ch.isalnum() or ch in "-_"

    def bounded(p: int) -> bool:
        e = p + len(value)
        return (p == 0 or not word(context[p - 1])) and (e == len(context) or not word(context[e]))

    last_line = context.rfind("\n") + 1
    for pool in ([p for p in occ if bounded(p) and p >= last_line], [p for p in occ if bounded(p)], occ):
        if pool:
            return pool[0], pool[0] + len(value)
    return None


def make_examples(lines: Sequence[Any], tools: dict[str, Tool], hp: SlotHyperParams,
                  negatives: bool = True, source: Callable[[Any], str] | None = None) -> list[SlotExample]:
    """The reader's examples of ``lines``; ``source(line)``: the text a line's context is cut from (default: the
    engine's copy source, ``request_source``)."""
    rng = random.Random(hp.seed)
    out: list[SlotExample] = []
    for ln in lines:
        tool = tools.get(ln.tool)
        if tool is None:
            continue
        context, _ = slot_context(source(ln) if source else request_source(ln.query, ln.history, hp))
        unstated = []
        for name, prop in slot_params(tool):
            q = slot_question(tool, name, prop)
            if name not in ln.args:
                unstated.append(SlotExample(ln.id, name, q, context, -1, -1))
                continue
            text = _value_text(ln.args[name])
            if not text:
                continue  # a boolean, list or object: not a span's job
            span = find_value(context, text)
            # a stated value that is no span of the request (Tokyo -> "Asia/Tokyo") is answered "no span": the
            # reader must not hint "Tokyo" where the model has to map it
            out.append(SlotExample(ln.id, name, q, context, *(span or (-1, -1))))
        if negatives:
            rng.shuffle(unstated)
            out.extend(unstated[: hp.max_negatives])
    return out


def length_batches(lengths: Sequence[int], batch_size: int, bucket: int, rng: random.Random) -> list[list[int]]:
    """One epoch's batches: shuffle, sort by length inside windows of ``bucket`` batches, shuffle the batches.
    Padding to the longest of a batch of random lengths costs ~1.9x the real tokens here; this costs ~1.03x,
    and every batch is still a random draw from a window of ``bucket * batch_size`` examples."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * max(1, bucket)
    batches = []
    for w in range(0, len(order), window):
        part = order[w:w + window]
        if bucket > 1:
            part.sort(key=lambda i: lengths[i])
        batches.extend(part[k:k + batch_size] for k in range(0, len(part), batch_size))
    if bucket > 1:
        rng.shuffle(batches)
    return batches


def _encode(tokenizer, batch: Sequence[SlotExample], max_len: int):
    """Token tensors and the answer's token positions (0 = [CLS] = not stated, also when truncated away)."""
    import torch

    enc = tokenizer([e.question for e in batch], [e.context for e in batch], truncation="only_second",
                    max_length=max_len, padding=True, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping").tolist()
    starts, ends = [], []
    for i, ex in enumerate(batch):
        s = t = 0
        if ex.start >= 0:
            sids = enc.sequence_ids(i)
            for j, (a, b) in enumerate(offsets[i]):
                if sids[j] != 1:
                    continue
                if s == 0 and a <= ex.start < b:
                    s = j
                if a < ex.end <= b:
                    t = j
            if not (s and t and t >= s):
                s = t = 0
        starts.append(s)
        ends.append(t)
    return enc, torch.tensor(starts), torch.tensor(ends)


def predict(model, tokenizer, examples: Sequence[SlotExample], max_len: int, bs: int = 64
            ) -> list[tuple[int, int, float]]:
    """(start char, end char, score) of each example's best answer, as the engine reads it (``model``: the torch
    reader or its ONNX graph, ``services.engine.slots.OnnxReader``)."""
    if hasattr(model, "train"):
        model.eval()
    res = []
    for k in range(0, len(examples), bs):
        batch = examples[k:k + bs]
        res.extend(spans[0] for spans in read_spans(model, tokenizer, [e.question for e in batch],
                                                    [e.context for e in batch], max_len))
    return res


def choose_threshold(examples: Sequence[SlotExample], preds: Sequence[tuple[int, int, float]]
                     ) -> tuple[float, dict[str, float]]:
    """The score threshold that maximises the reader's accuracy on validation (a stated parameter is right
    when its span is hinted exactly, an unstated one when it gets no hint), with the figures at it."""
    cands = sorted({round(p[2], 3) for p in preds} | {0.0})
    best_t, best_acc = 0.0, -1.0
    for t in cands:
        acc = np.mean([_correct(e, p, t) for e, p in zip(examples, preds, strict=True)]) if examples else 0.0
        if acc > best_acc:
            best_t, best_acc = t, float(acc)
    pos = [(e, p) for e, p in zip(examples, preds, strict=True) if e.start >= 0]
    hinted = [(e, p) for e, p in pos if p[2] > best_t]
    return best_t, {
        "val_accuracy": best_acc,
        "val_stated": len(pos),
        "val_stated_exact": float(np.mean([_span_ok(e, p) for e, p in pos])) if pos else 0.0,
        "val_stated_hinted": len(hinted) / len(pos) if pos else 0.0,
        "val_hint_precision": float(np.mean([_span_ok(e, p) for e, p in hinted])) if hinted else 0.0,
        "val_unstated": len(examples) - len(pos),
    }


def _span_ok(e: SlotExample, p: tuple[int, int, float]) -> bool:
    return e.context[p[0]:p[1]].strip() == e.context[e.start:e.end].strip()


def _correct(e: SlotExample, p: tuple[int, int, float], t: float) -> bool:
    if e.start < 0:
        return p[2] <= t
    return p[2] > t and _span_ok(e, p)


def data_hash(train: Sequence[SlotExample], val: Sequence[SlotExample], hp: SlotHyperParams, base: Path) -> str:
    h = hashlib.sha256()
    h.update(SLOTS_FORMAT.encode())
    h.update(json.dumps(asdict(hp), sort_keys=True).encode())
    h.update((base / "config.json").read_bytes())
    for part in (train, val):
        for e in part:
            h.update(json.dumps(asdict(e), sort_keys=True).encode())
        h.update(b"|")
    return h.hexdigest()[:16]


def adamw_schedule(model, lr: float, steps: int, warmup: float):
    """AdamW (weight decay 0.01) with a linear schedule warming up over ``warmup`` of ``steps``."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    return opt, get_linear_schedule_with_warmup(opt, int(warmup * steps), steps)


def optimizer_step(model, opt, sched, loss, losses: list[float], bar, shown: float | None = None) -> None:
    """One step on ``loss`` (gradients clipped to norm 1); ``shown`` (default: the loss) is appended to ``losses``
    and the last 20's mean shown on the progress ``bar``."""
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(loss.item() if shown is None else shown)
    bar.update(1)
    bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")


def train_slots(train_lines: Sequence[Any], val_lines: Sequence[Any], tools: Sequence[Tool], out: str | Path,
                hp: SlotHyperParams = SlotHyperParams(), base: str | Path = "", progress: bool = True,
                force: bool = False) -> dict[str, Any]:
    """Fine-tune the reader on ``train_lines``, choose its threshold on ``val_lines``, write ``out``.
    Keeps an existing model whose data hash matches (unless ``force``)."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    from services.common.models import resolve_embedder

    base_dir = resolve_embedder(str(base))
    by_name = {t.name: t for t in tools}
    train = make_examples(train_lines, by_name, hp)
    val = make_examples(val_lines, by_name, hp, negatives=True)
    if not train:
        raise ValueError("no slot examples in the training lines (do their tools exist in the registry?)")
    digest = data_hash(train, val, hp, base_dir)
    root = Path(out)
    doc_path = root / "slots.json"
    if not force and doc_path.is_file():
        doc = json.loads(doc_path.read_text())
        if doc.get("data_hash") == digest and (root / "reader").is_dir():
            log.info("slot model at %s is up to date (%s)", root, digest)
            return doc

    t0 = time.time()
    random.seed(hp.seed)
    np.random.seed(hp.seed)
    torch.manual_seed(hp.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    model = AutoModelForQuestionAnswering.from_pretrained(str(base_dir))
    lengths = [len(ids) for ids in tokenizer([e.question for e in train], [e.context for e in train],
                                             truncation="only_second", max_length=hp.max_len)["input_ids"]]
    steps = hp.epochs * ((len(train) + hp.batch_size - 1) // hp.batch_size)
    opt, sched = adamw_schedule(model, hp.lr, steps, hp.warmup)
    loss_fn = torch.nn.CrossEntropyLoss()
    bar = tqdm(total=steps, desc="slot reader", unit="step", disable=not progress, file=sys.stderr)
    losses: list[float] = []
    model.train()
    rng = random.Random(hp.seed)
    padded = 0
    for _ in range(hp.epochs):
        for idx in length_batches(lengths, hp.batch_size, hp.bucket, rng):
            batch = [train[i] for i in idx]
            enc, s, e = _encode(tokenizer, batch, hp.max_len)
            padded += enc["input_ids"].numel()
            o = model(**enc)
            loss = (loss_fn(o.start_logits, s) + loss_fn(o.end_logits, e)) / 2
            optimizer_step(model, opt, sched, loss, losses, bar)
    bar.close()

    preds = predict(model, tokenizer, val, hp.max_len)
    threshold, figures = choose_threshold(val, preds)
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp / "reader"))
    tokenizer.save_pretrained(str(tmp / "reader"))
    doc = {"format": SLOTS_FORMAT, "threshold": threshold, "max_len": hp.max_len, "data_hash": digest,
           "hyper_params": asdict(hp), "n_train": len(train), "n_train_lines": len(train_lines),
           "n_val": len(val), "n_val_lines": len(val_lines), "train_loss_last": float(np.mean(losses[-20:])),
           "train_seconds": round(time.time() - t0, 1),
           "train_padding": round(padded / max(1, hp.epochs * sum(lengths)), 3), **figures}
    (tmp / "slots.json").write_text(json.dumps(doc, indent=2) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    log.info("slot model written to %s: threshold %.3f, validation %s", root, threshold, figures)
    return doc


def export_onnx(reader_dir: str | Path, out: str | Path) -> Path:
    """Write ``out``: the INT8 graph of the trained reader at ``reader_dir`` (a transformers question-answering
    model), token ids -> (start, end) logits, exported at fp32 then dynamically quantized (per-channel signed int8
    weights of every MatMul, onnxruntime's quantizer). The serving
    form ``models/slots`` ships (``training.ship``); ``SlotModel`` runs it on onnxruntime."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            o = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return o.start_logits, o.end_logits

    reader_dir, out = Path(reader_dir), Path(out)
    model = AutoModelForQuestionAnswering.from_pretrained(str(reader_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(reader_dir))
    # two pairs of different lengths: the traced graph takes the padded-mask path, valid for any batch
    feats = tokenizer(["what is the owner?", "the repo?"], ["octo-org/web-app label bug", "hi"], padding=True,
                      return_tensors="pt")
    names = ("input_ids", "attention_mask", "token_type_ids")
    out.parent.mkdir(parents=True, exist_ok=True)
    fp32, pre, tmp = (out.with_name(f".{out.name}.{os.getpid()}.{x}") for x in ("fp32", "pre", "tmp"))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's shape-condition warnings: constant over lengths here
            torch.onnx.export(Logits(model), tuple(feats[n].to(torch.int64) for n in names), str(fp32), dynamo=False,
                              opset_version=17, input_names=list(names), output_names=["start_logits", "end_logits"],
                              dynamic_axes={**{n: {0: "batch", 1: "seq"} for n in names},
                                            "start_logits": {0: "batch", 1: "seq"},
                                            "end_logits": {0: "batch", 1: "seq"}})
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
        quantize_dynamic(str(pre), str(tmp), per_channel=True, weight_type=QuantType.QInt8)
        os.replace(tmp, out)
    finally:
        for f in (fp32, pre, tmp):
            f.unlink(missing_ok=True)
    log.info("slot reader %s exported to %s", reader_dir, out)
    return out


def add_train_slots_parser(sub) -> None:
    p = sub.add_parser("train-slots", help="fine-tune the engine's slot reader (argument span hints)")
    p.add_argument("--queries", required=True, help="query lines (JSONL); their tune split picks the threshold")
    p.add_argument("--tools", required=True, help="registry directory (MCP tool schemas)")
    p.add_argument("--augment", required=True, help="training lines: a JSONL file or a directory of them")
    p.add_argument("--out", default="var/models/slots")
    p.add_argument("--epochs", type=int, default=SlotHyperParams.epochs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="retrain even when the cached model's data matches")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    def run(args) -> int:
        from training.data import load_augment, prepare_training_env

        prepare_training_env()  # before torch runs: passive OpenMP waits (spinning: 5.3 vs 1.1 s/step beside a job)
        from training.data import load_queries, load_registry, tune_split

        registry = load_registry(args.tools)
        tune, _ = tune_split(load_queries(args.queries))
        doc = train_slots(load_augment(args.augment), tune, registry.tools, args.out,
                          SlotHyperParams(epochs=args.epochs, seed=args.seed), progress=not args.quiet,
                          force=args.force)
        keys = ("threshold", "n_train", "n_val", "val_accuracy", "val_stated_exact", "val_stated_hinted",
                "val_hint_precision", "train_seconds")
        print(json.dumps({k: doc.get(k) for k in keys}, indent=2))
        return 0

    p.set_defaults(fn=run)
