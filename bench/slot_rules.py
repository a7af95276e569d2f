"""Span rules for the slot reader, measured on its validation lines (the tune split of train.jsonl).

The reader proposes each parameter's span; a rule reshapes or re-chooses it. Inference only: the same model and
the same validation examples as ``nexus train-slots`` uses for its threshold, figures at the model's threshold.
Arms: ``free`` (any span of the context), ``one_line`` (no span crosses a line break), ``one_line+balance`` (the
reading: a span also closes what it opened, ``balance_span``), ``+numbers`` (the engine's hints: a number
parameter takes its best span that is a number among the reader's 10 best), and two rejected rules kept for the
record on top of the reading: ``whole_identifiers`` (grow a span that cuts an identifier word to the whole word) and
``longer_within_1`` (take a span containing the best one if it scores within 1.0 of it).

    .venv/bin/python bench/slot_rules.py --queries ../shared/data/queries/train.jsonl \\
        --tools ../shared/data/mcp_tools --model var/models/slots --json reports/slot_rules.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.engine.copybias import NUMBER, _identifier_like  # noqa: E402
from services.engine.slots import NUMBER_CANDIDATES, SlotModel, read_spans, slot_type  # noqa: E402
from services.evals.args import tune_split  # noqa: E402
from services.training.data import load_queries, load_registry  # noqa: E402
from services.training.slots import SlotHyperParams, make_examples  # noqa: E402


def whole_identifier(context: str, a: int, b: int) -> tuple[int, int]:
    """Grow [a, b) to the whitespace-delimited word it cuts when that word looks like an identifier."""
    ws, we = a, b
    while ws > 0 and not context[ws - 1].isspace():
        ws -= 1
    while we < len(context) and not context[we].isspace():
        we += 1
    while we > b and context[we - 1] in ".,;:!?)":
        we -= 1
    return (ws, we) if _identifier_like(context[ws:we]) else (a, b)


def longer(spans: list[tuple[int, int, float]], within: float) -> tuple[int, int, float]:
    a, b, sc = spans[0]
    wider = [(y - x, x, y) for x, y, s in spans if x <= a and y >= b and s >= sc - within]
    _, a, b = max(wider)
    return a, b, sc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", required=True)
    ap.add_argument("--tools", required=True)
    ap.add_argument("--model", default="var/models/slots")
    ap.add_argument("--json", default="reports/slot_rules.json")
    args = ap.parse_args()

    reg = load_registry(args.tools)
    tune, _ = tune_split(load_queries(args.queries))
    examples = make_examples(tune, {t.name: t for t in reg.tools}, SlotHyperParams(), negatives=True)
    model = SlotModel(args.model)

    def ranked(one_line: bool, balance: bool, k: int = 1) -> list[list[tuple[int, int, float]]]:
        out = []
        for i in range(0, len(examples), 64):
            batch = examples[i:i + 64]
            out += read_spans(model.model, model.tokenizer, [e.question for e in batch],
                              [e.context for e in batch], model.max_len, k, one_line=one_line, balance=balance)
        return out

    engine = ranked(True, True, 20)
    tools = {t.name: t for t in reg.tools}
    tool_of = {ln.id: ln.tool for ln in tune}

    def numeric(e) -> bool:
        prop = tools[tool_of[e.line_id]].input_schema["properties"][e.param]
        return slot_type(prop) in ("integer", "number")

    def best_number(e, spans):
        nums = [s for s in spans[:NUMBER_CANDIDATES] if NUMBER.fullmatch(e.context[s[0]:s[1]])]
        return nums[0] if nums else (0, 0, float("-inf"))

    arms = {
        "free": [s[0] for s in ranked(False, False)],
        "one_line": [s[0] for s in ranked(True, False)],
        "one_line+balance": [s[0] for s in engine],
        "one_line+balance+numbers": [best_number(e, s) if numeric(e) else s[0]
                                     for e, s in zip(examples, engine, strict=True)],
        "one_line+balance+whole_identifiers": [(*whole_identifier(e.context, s[0][0], s[0][1]), s[0][2])
                                               for e, s in zip(examples, engine, strict=True)],
        "one_line+balance+longer_within_1": [longer(s, 1.0) for s in engine],
    }
    t = model.threshold
    n_pos = sum(e.start >= 0 for e in examples)
    out = {"model": args.model, "threshold": t, "n": len(examples), "n_stated": n_pos, "arms": {}}
    for name, preds in arms.items():
        exact = hinted = right = correct = 0
        for e, (a, b, sc) in zip(examples, preds, strict=True):
            if numeric(e) and not NUMBER.fullmatch(e.context[a:b]):
                sc = float("-inf")  # the engine never hints a number parameter with words
            ok = e.start >= 0 and e.context[a:b].strip() == e.context[e.start:e.end].strip()
            if e.start >= 0:
                exact += ok
                hinted += sc > t
                right += ok and sc > t
            correct += (sc <= t) if e.start < 0 else (sc > t and ok)
        out["arms"][name] = {"stated_exact": exact / n_pos, "hint_precision": right / max(1, hinted),
                             "accuracy": correct / len(examples)}
        print(f"{name:36s} stated exact {exact / n_pos:.3f}  hint precision {right / max(1, hinted):.3f}  "
              f"accuracy {correct / len(examples):.3f}")
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    plot(out, Path(args.json).with_suffix(".png"))
    return 0


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(out["arms"])
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.27
    for j, (metric, label) in enumerate((("stated_exact", "stated exact"), ("hint_precision", "hint precision"),
                                         ("accuracy", "accuracy at threshold"))):
        vals = [100 * out["arms"][n][metric] for n in names]
        ax.bar([i + (j - 1) * width for i in range(len(names))], vals, width, label=label)
    ax.set_xticks(range(len(names)), [n.replace("+", "+\n") for n in names], fontsize=7)
    ax.set_ylim(40, 100)
    ax.set_ylabel("%")
    ax.set_title(f"slot reader span rules, validation (tune split): {out['n_stated']} stated of {out['n']} questions")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
