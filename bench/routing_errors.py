"""Where the router's held-out errors are, and how many of them a reader could have decided (issue 4).

    nice -n 19 .venv/bin/python bench/routing_errors.py --labels reports/routing_error_labels.json \
        --json reports/routing_errors.json

Each fold's gate model (the evaluation's, cached under ``--models-root``) routes its held-out lines as the product
does (``--precision``, default the router's; the stage off) at every size over ``--draws`` draws of distractors: the
evaluation's registries and its figures. For every size the report splits the wrong (line, draw) pairs by

* where the pick came from: a tool of the target's own server (a sibling) or of another server;
* whether the line is multi-turn, and the target servers that make most of them;
* whether the same (line, draw) was right at the smallest size (the fall that more distractors cause);

and lists every line wrong at the largest size with its picks, the SLB's top 3 and its wrong draws per size. It also
bounds the margin gate's design (``oracle_stage``): if the 15 / 20 / 25 % of requests with the lowest SLB margins
escalated to a perfect re-ranker of the top 3, how many errors it would see and could fix.

``--labels FILE`` (a JSON list of ``{"id", "verdict", "reason"}``, one per line id, optionally ``"pick"``: the tool
the verdict was given against; a line whose picks no longer include it is marked ``labelled_pick``) adds a reader's
verdict on each wrong line: ``decidable`` (the request or its history holds the detail that makes the label right), ``ambiguous``
(the pick would do as well) or ``label_questionable``. The report then counts errors per verdict at every size and
the accuracy a router would have if it decided every ``decidable`` one (the ceiling the request allows under that
reading). Lines wrong without a verdict are counted as ``unlabelled``. A PNG draws both.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evals.routing_models import prepare_training_env  # noqa: E402

VERDICTS = ("decidable", "ambiguous", "label_questionable", "unlabelled")
ESCALATE = (0.15, 0.2, 0.25)  # the escalation band and its middle


def load_labels(path: str) -> dict[str, dict[str, Any]]:
    """``{id: label}`` of a labels file; a clear error for anything but a list of objects with an id and a known
    verdict (the same id twice included)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--labels {path}: {e}") from None
    if not isinstance(doc, list):
        raise SystemExit(f"--labels {path}: expected a JSON list of {{id, verdict, reason}}")
    out: dict[str, dict[str, Any]] = {}
    for k, row in enumerate(doc):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise SystemExit(f"--labels {path}: item {k} has no id")
        if row.get("verdict") not in VERDICTS[:-1]:
            raise SystemExit(f"--labels {path}: item {k} ({row['id']}): verdict {row.get('verdict')!r}, expected "
                             f"one of {', '.join(VERDICTS[:-1])}")
        if row["id"] in out:
            raise SystemExit(f"--labels {path}: {row['id']} twice")
        out[row["id"]] = row
    return out


def oracle_stage(rs: Sequence[dict[str, Any]], fractions: Sequence[float] = ESCALATE) -> dict[str, Any]:
    """What a perfect second stage behind the margin gate could reach: for each fraction f, the requests whose SLB
    margin is among the lowest f escalate (tau = the f-quantile of the margins), and an escalated request ends
    right when its target is in the SLB's top 3 (the candidates the stage re-ranks). A ceiling for the gate's
    design at that escalation rate, not a stage's figure."""
    if not rs:
        return {}
    margins = np.array([np.inf if r["margin"] is None else r["margin"] for r in rs], float)
    wrong = [not r["correct"] for r in rs]
    out = {}
    for f in fractions:
        tau = float(np.quantile(margins, f))
        esc = margins < tau
        err_esc = sum(w and e for w, e in zip(wrong, esc, strict=True))
        fixable = sum(w and e and r["slb_top3"] for w, e, r in zip(wrong, esc, rs, strict=True))
        out[str(f)] = {"tau": tau, "escalated": float(esc.mean()), "errors_escalated": int(err_esc),
                       "fixable": int(fixable), "accuracy": 1 - (sum(wrong) - fixable) / len(rs)}
    return out


def analyse(recs: dict[str, list[dict[str, Any]]], server_of: dict[str, str], labels: dict[str, dict[str, Any]]
            ) -> dict[str, Any]:
    """The report's figures from ``recs``: ``{size: [record]}`` with one record per (line, draw), the draw in
    ``draw`` (route_lines' records), sizes in the order given, the smallest first."""
    sizes = list(recs)
    first = {(r["id"], r["draw"]): r["correct"] for r in recs[sizes[0]]}
    out: dict[str, Any] = {}
    for s in sizes:
        rs = recs[s]
        wrong = [r for r in rs if not r["correct"]]
        same = [r for r in wrong if server_of[r["pred"]] == server_of[r["tool"]]]
        by_line = Counter(r["id"] for r in wrong)
        draws = Counter(r["id"] for r in rs)
        row: dict[str, Any] = {
            "n": len(rs), "accuracy": 1 - len(wrong) / len(rs) if rs else None, "errors": len(wrong),
            "lines_wrong": len(by_line), "lines_wrong_every_draw": sum(by_line[i] == draws[i] for i in by_line),
            "same_server": len(same), "same_server_share": len(same) / len(wrong) if wrong else None,
            "multi_turn": sum(r["multi_turn"] for r in wrong),
            "multi_turn_accuracy": (1 - sum(r["multi_turn"] for r in wrong) / m
                                    if (m := sum(r["multi_turn"] for r in rs)) else None),
            f"right_at_{sizes[0]}": sum(first[(r["id"], r["draw"])] for r in wrong),
            "by_target_server": dict(Counter(server_of[r["tool"]] for r in wrong).most_common()),
        }
        row["oracle_stage"] = oracle_stage(rs)
        if labels:
            per = Counter(labels.get(r["id"], {}).get("verdict", "unlabelled") for r in wrong)
            row["by_verdict"] = {v: per.get(v, 0) for v in VERDICTS}
            row["accuracy_if_decidable_fixed"] = (1 - (len(wrong) - per.get("decidable", 0)) / len(rs)) if rs else None
        out[s] = row
    return out


def wrong_lines(recs: dict[str, list[dict[str, Any]]], lines: dict[str, Any], server_of: dict[str, str],
                labels: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every line wrong in some draw at the largest size: its request, picks, the SLB's top 3 of its first wrong draw,
    wrong draws per size and its verdict when labelled; most wrong draws first."""
    sizes = list(recs)
    per: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for s in sizes:
        for r in recs[s]:
            per[r["id"]][s].append(r)
    out = []
    for i, by_size in per.items():
        wrong = [r for r in by_size[sizes[-1]] if not r["correct"]]
        if not wrong:
            continue
        ln = lines[i]
        row = {"id": i, "tool": ln.tool, "server": server_of[ln.tool], "query": ln.query,
               "history": [list(t) for t in ln.history],
               "picks": dict(Counter(r["pred"] for r in wrong).most_common()),
               "same_server": all(server_of[r["pred"]] == server_of[ln.tool] for r in wrong),
               "slb_top3": wrong[0]["candidates"],
               "wrong_draws": {s: sum(not r["correct"] for r in by_size[s]) for s in sizes},
               "draws": len(by_size[sizes[-1]])}
        if labels:
            lab = labels.get(i, {})
            row["verdict"] = lab.get("verdict", "unlabelled")
            row["reason"] = lab.get("reason", "")
            if lab.get("pick") and lab["pick"] not in row["picks"]:
                row["labelled_pick"] = lab["pick"]  # the verdict was given against a pick this model no longer makes
        out.append(row)
    return sorted(out, key=lambda r: (-r["wrong_draws"][sizes[-1]], r["id"]))


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(report["sizes"])
    by = report["sizes"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.4))
    xs = np.arange(len(sizes))
    if report["labelled"]:
        bottom = np.zeros(len(sizes))
        for v in VERDICTS:
            h = np.array([by[s]["by_verdict"][v] for s in sizes], float)
            if h.any():
                ax.bar(xs, h, 0.6, bottom=bottom, label=v.replace("_", " "))
                bottom += h
        ax.set_title("wrong (line, draw) pairs by a reader's verdict")
    else:
        same = np.array([by[s]["same_server"] for s in sizes], float)
        other = np.array([by[s]["errors"] for s in sizes], float) - same
        ax.bar(xs, same, 0.6, label="picked a sibling (target's server)")
        ax.bar(xs, other, 0.6, bottom=same, label="picked another server's tool")
        ax.set_title("wrong (line, draw) pairs by where the pick came from")
    for x, s in zip(xs, sizes, strict=True):
        ax.text(x, by[s]["errors"], f"{100 * by[s]['accuracy']:.1f} %", ha="center", va="bottom", fontsize=8)
        o = by[s]["oracle_stage"].get("0.2")
        if o:
            left = by[s]["errors"] - o["fixable"]
            ax.hlines(left, x - 0.3, x + 0.3, colors="k", linestyles="--",
                      label="left by a perfect stage at 20 % escalation" if x == 0 else None)
            ax.text(x + 0.32, left, f"{100 * o['accuracy']:.1f} %", va="center", fontsize=7)
    ax.set_ylim(0, 1.12 * max([by[s]["errors"] for s in sizes] + [1]))
    ax.set_xticks(xs, [f"N = {s}" for s in sizes])
    ax.set_ylabel(f"wrong of {by[sizes[-1]]['n']} (line, draw) pairs (label: accuracy)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    last = by[sizes[-1]]
    servers = list(last["by_target_server"])[:8][::-1]
    if report["labelled"]:
        counts = {v: Counter() for v in VERDICTS}
        for r in report["wrong_lines"]:
            counts[r["verdict"]][r["server"]] += r["wrong_draws"][sizes[-1]]
        left = np.zeros(len(servers))
        for v in VERDICTS:
            w = np.array([counts[v][s] for s in servers], float)
            if w.any():
                bx.barh(servers, w, left=left, label=v.replace("_", " "))
                left += w
        bx.legend(fontsize=8)
        if last.get("accuracy_if_decidable_fixed") is not None:
            bx.set_title(f"N = {sizes[-1]}: {100 * last['accuracy']:.1f} %, "
                         f"{100 * last['accuracy_if_decidable_fixed']:.1f} % with every decidable one right")
    else:
        bx.barh(servers, [last["by_target_server"][s] for s in servers])
        bx.set_title(f"N = {sizes[-1]}: wrong pairs by the target's server")
    bx.set_xlabel("wrong (line, draw) pairs")
    bx.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    from evals.routing import checked_folds, held_out_parser

    ap = held_out_parser(__doc__, "reports/routing_errors.json")
    ap.add_argument("--precision", choices=("fp32", "int8"), default=None,
                    help="the query encoder's precision (default: the router's, RouterConfig)")
    ap.add_argument("--labels", default="", help="a reader's verdicts on wrong lines (see the module's doc)")
    a = ap.parse_args(argv)
    folds, given = checked_folds(ap, a)
    labels = load_labels(a.labels) if a.labels else {}
    prepare_training_env()

    from tqdm import tqdm

    from evals.routing import _open_router, fold_model_dirs, load_protocol, route_lines, write_report
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.router.config import RouterConfig

    precision = a.precision or RouterConfig().query_encoder_precision
    t0 = time.time()
    proto = load_protocol(a.queries, a.tools, a.sizes, folds=3, seed=0, draws=a.draws)
    stale = sorted(set(labels) - {ln.id for ln in proto.lines})
    if stale:  # before any model is trained or opened
        raise SystemExit(f"--labels: ids not in {a.queries}: {', '.join(stale[:5])}")
    dirs = fold_model_dirs(a, proto, folds, given)
    regs = {(s, d): r[s] for d, r in enumerate(proto.draw_regs) for s in proto.sizes}
    recs: dict[str, list[dict[str, Any]]] = {s: [] for s in proto.sizes}
    embedder = Embedder("")
    with tempfile.TemporaryDirectory(prefix="nexus-errors-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(proto.registry.tools))
        for f in folds:
            router = _open_router(store, embedder, dirs[f], precision=precision)
            got = getattr(router.gate.onnx, "precision", None) if router.gate else None
            if got != precision:
                raise RuntimeError(f"fold {f} ({dirs[f]}): the router embeds at {got}, not {precision}; run `make "
                                   "models` (or `nexus train-gate` on its data) to write the graph")
            idxs = [i for i, g in enumerate(proto.fold_of) if g == f][: a.limit or None]
            with tqdm(total=len(idxs), desc=f"fold {f}", file=sys.stderr) as bar:
                for (s, d), rows in route_lines(router, proto.lines, regs, idxs, bar, candidates=True).items():
                    recs[s] += [{**r, "draw": d, "fold": f} for r in rows]
            del router
    if labels:
        wrong_ids = {r["id"] for rs in recs.values() for r in rs if not r["correct"]}
        missing = sorted(wrong_ids - set(labels))
        if missing:
            print(f"{len(missing)} wrong line(s) have no verdict (counted as unlabelled): {', '.join(missing[:10])}",
                  file=sys.stderr)
    lines = {ln.id: ln for ln in proto.lines}
    report = {
        "bench": "bench/routing_errors.py", "folds": folds, "draws": a.draws, "precision": precision,
        "held_out": not given, "models": {str(f): str(d) for f, d in dirs.items()},
        "labels": a.labels or None, "labelled": bool(labels), "seconds": round(time.time() - t0, 1),
        "sizes": analyse(recs, proto.registry.server_of, labels),
        "wrong_lines": wrong_lines(recs, lines, proto.registry.server_of, labels),
    }
    summary = {s: {k: v for k, v in row.items() if k != "by_target_server"} for s, row in report["sizes"].items()}
    write_report(a.json, report, plot, echo=[summary])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
