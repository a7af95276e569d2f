"""Mapped values and number pairs, measured against the gold arguments of the team's data (no chat model).

Two rules of the argument engine that choose a value without the 135M model:

* ``choices`` (services/engine/choices.py): an enum option or a boolean the request names in its words. Per kind:
  how many stated values the rule chooses (coverage), how many of those are right (precision), and how often it
  fires on a parameter the request does not state. On the tune split of train.jsonl and, separately, on the
  hand-written augment lines (``data/routing_augment``; no model is involved, so they are fair here).
* ``order_numbers`` (services/engine/slots.py): number parameters whose reader hints share one span take the
  numbers in the order stated. Number hints of lines with two or more number parameters, with and without the rule,
  against the gold (the reader never trained on the tune split; it did train on the augment lines, listed apart).

    .venv/bin/python bench/choice_rules.py --queries ../shared/data/queries/train.jsonl \\
        --tools ../shared/data/mcp_tools --augment data/routing_augment --json reports/choice_rules.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.engine.choices import enum_choices  # noqa: E402
from services.engine.slots import SlotModel, slot_type  # noqa: E402
from services.evals.args import tune_split  # noqa: E402
from services.evals.stats import wilson  # noqa: E402
from services.training.data import load_queries, load_registry  # noqa: E402


def choice_stats(lines, tools) -> dict:
    out = {k: {"stated": 0, "chosen": 0, "right": 0, "unstated": 0, "chosen_unstated": 0} for k in ("enum", "boolean")}
    for ln in lines:
        tool = tools.get(ln.tool)
        if tool is None:
            continue
        got = enum_choices(tool.input_schema, ln.query)
        for name, prop in ((tool.input_schema or {}).get("properties") or {}).items():
            if not isinstance(prop, dict):
                continue
            kind = "enum" if isinstance(prop.get("enum"), list) else "boolean" if prop.get("type") == "boolean" else ""
            if not kind:
                continue
            s = out[kind]
            if name in ln.args:
                s["stated"] += 1
                if name in got:
                    s["chosen"] += 1
                    s["right"] += json.loads(got[name]) == ln.args[name]
            else:
                s["unstated"] += 1
                s["chosen_unstated"] += name in got
    for s in out.values():
        s["coverage"] = s["chosen"] / max(1, s["stated"])
        s["precision"] = s["right"] / max(1, s["chosen"])
        s["precision_ci95"] = list(wilson(s["right"], s["chosen"]))
        s["fires_unstated"] = s["chosen_unstated"] / max(1, s["unstated"])
    return out


def number_stats(lines, tools, model: SlotModel) -> dict:
    res = {}
    for arm, flag in (("reader", False), ("reader+order_numbers", True)):
        model.order_numbers = flag
        stated = hinted = right = 0
        for ln in lines:
            tool = tools.get(ln.tool)
            if tool is None:
                continue
            nums = [k for k, p in ((tool.input_schema or {}).get("properties") or {}).items()
                    if isinstance(p, dict) and slot_type(p) in ("integer", "number")]
            if len(nums) < 2 or not any(k in ln.args for k in nums):
                continue
            hints = model.hints(tool, ln.query)
            for k in nums:
                if k not in ln.args:
                    continue
                stated += 1
                if k in hints:
                    hinted += 1
                    try:
                        right += float(hints[k].text(ln.query)) == float(ln.args[k])
                    except (TypeError, ValueError):
                        pass
        res[arm] = {"stated": stated, "hinted": hinted, "right": right, "precision": right / max(1, hinted)}
    model.order_numbers = True
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", required=True)
    ap.add_argument("--tools", required=True)
    ap.add_argument("--augment", default="data/routing_augment")
    ap.add_argument("--model", default="var/models/slots")
    ap.add_argument("--json", default="reports/choice_rules.json")
    args = ap.parse_args()

    tools = load_registry(args.tools).by_name()
    tune, _ = tune_split(load_queries(args.queries))
    augment = [ln for f in sorted(Path(args.augment).glob("*.jsonl")) for ln in load_queries(f)]
    model = SlotModel(args.model, threads=2)
    out = {"n_tune_lines": len(tune), "n_augment_lines": len(augment),
           "choices": {"tune": choice_stats(tune, tools), "augment": choice_stats(augment, tools)},
           "numbers": {"tune": number_stats(tune, tools, model), "augment": number_stats(augment, tools, model)}}
    for split, kinds in out["choices"].items():
        for kind, s in kinds.items():
            print(f"choices {split:8s} {kind:8s} chosen {s['chosen']}/{s['stated']} stated, right {s['right']} "
                  f"({100 * s['precision']:.1f} %), fires on {s['chosen_unstated']}/{s['unstated']} unstated")
    for split, arms in out["numbers"].items():
        for arm, s in arms.items():
            print(f"numbers {split:8s} {arm:22s} right {s['right']}/{s['hinted']} hinted of {s['stated']} stated")
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    plot(out, Path(args.json).with_suffix(".png"))
    return 0


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    labels, cov, prec, fire = [], [], [], []
    for split, kinds in out["choices"].items():
        for kind, s in kinds.items():
            labels.append(f"{kind}\n{split}")
            cov.append(100 * s["coverage"])
            prec.append(100 * s["precision"])
            fire.append(100 * s["fires_unstated"])
    w = 0.27
    for j, (vals, name) in enumerate(((cov, "stated values chosen"), (prec, "chosen right"),
                                      (fire, "fires on unstated"))):
        a1.bar([i + (j - 1) * w for i in range(len(labels))], vals, w, label=name)
    a1.set_xticks(range(len(labels)), labels, fontsize=8)
    a1.set_ylabel("%")
    a1.set_title("enum / boolean choices vs gold", fontsize=10)
    a1.legend(fontsize=7)
    names, vals = [], []
    for split, arms in out["numbers"].items():
        for arm, s in arms.items():
            names.append(arm.replace("+", "+\n") + "\n" + split)
            vals.append(100 * s["right"] / max(1, s["stated"]))
    a2.bar(range(len(names)), vals, color=["tab:gray", "tab:blue"] * (len(names) // 2))
    a2.set_xticks(range(len(names)), names, fontsize=7)
    a2.set_ylabel("% of stated numbers hinted right")
    a2.set_title("lines with 2+ number parameters", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
