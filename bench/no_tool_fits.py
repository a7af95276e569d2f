"""When no tool fits: the router score below which the OpenAI front's ``tool_choice: "auto"`` answers in text.

    .venv/bin/python bench/no_tool_fits.py --json reports/no_tool_fits.json          (make eval, ~2 min)

The production router (the shipped gate model, INT8, every tool registered as a new one: text and alternate keys,
no exemplar key, as a user's tools are) routes each request twice: among all the tools (its own tool is there: the
request fits) and among all but the ones that fit it (its own plugin on MetaTool, its whole server on the shipped
registry: nothing fits). Its top-1 score in both cases is what a threshold can tell apart.

The threshold is chosen on tools no model here trained on: MetaTool's 199 plugins (``--per-tool`` requests each),
as the largest score that sends at most ``--miss`` of the fitting requests to text. It is then checked on the
shipped registry (the 1,352 requests of data/routing_calibration, written apart from the training lines): how many
fitting requests it sends to text (calls lost) and how many non-fitting ones (right). MetaTool has near-duplicate
plugins, so some of its "nothing fits" requests do fit another plugin: the figures there are a lower bound.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PUBLIC = REPO / "data" / "public_tools"


def metatool_set(per_tool: int, seed: int):
    """(tools, [(request, its tool, names that fit it)]) of MetaTool, the plugins as MCP tools."""
    from services.common.tools import parse_tool

    sys.path.insert(0, str(REPO / "bench"))
    from routing_metatool import load

    names, docs, pairs = load(PUBLIC, per_tool, seed)
    des = json.loads((PUBLIC / "metatool_plugin_des.json").read_text())
    mcp = {n: re.sub(r"[^A-Za-z0-9_.\-]", "_", n)[:128] for n in names}
    tools = [parse_tool({"name": mcp[n], "description": des[n], "inputSchema": {"type": "object"}}) for n in names]
    return tools, [(q, mcp[k], {mcp[k]}) for q, k in pairs]


def shipped_set():
    """(tools, [(request, its tool, its server's tools)]) of the shipped registry and routing_calibration."""
    from training.data import load_augment, load_registry

    registry = load_registry(str(REPO / "data" / "mcp_tools"))
    servers = registry.servers()
    lines = load_augment(str(REPO / "data" / "routing_calibration"))
    return list(registry.tools), [(ln.query, ln.tool, set(servers[registry.server_of[ln.tool]])) for ln in lines]


def scores(gate: str, tools, rows) -> dict[str, np.ndarray]:
    """Top-1 score and correctness of each request among every tool, and the top-1 score among the rest."""
    from evals.routing import _open_router
    from services.common.embedder import Embedder
    from services.common.store import LocalStore

    with tempfile.TemporaryDirectory(prefix="nexus-nofit-") as tmp:
        store = LocalStore(tmp)
        store.registry_put(list(tools))
        router = _open_router(store, Embedder(""), gate, exemplar_weight=0.0, precision="int8")
        every = [t.name for t in tools]
        fit, right, none = [], [], []
        for q, tool, fitting in rows:
            d = router.route(q)
            fit.append(d.score)
            right.append(d.tool == tool)
            none.append(router.route(q, allowed=[n for n in every if n not in fitting]).score)
    return {"fits": np.array(fit), "right": np.array(right), "none": np.array(none)}


def rates(s: dict[str, np.ndarray], tau: float) -> dict[str, float]:
    return {"fitting_sent_to_text": float((s["fits"] < tau).mean()),
            "right_calls_lost": float(((s["fits"] < tau) & s["right"]).mean()),
            "nothing_fits_sent_to_text": float((s["none"] < tau).mean())}


def auc(s: dict[str, np.ndarray]) -> float:
    """P(score of a fitting request > score of a non-fitting one)."""
    a, b = np.sort(s["fits"]), s["none"]
    return float(1 - np.searchsorted(a, b, side="right").sum() / (len(a) * len(b)))


def plot(report: dict, sets: dict[str, dict[str, np.ndarray]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4))
    for ax, (name, s) in zip(np.atleast_1d(axes), sets.items(), strict=True):
        bins = np.linspace(min(s["fits"].min(), s["none"].min()), max(s["fits"].max(), s["none"].max()), 40)
        ax.hist(s["fits"], bins, alpha=0.6, label="a tool fits (top-1 score)", color="#2a9d8f")
        ax.hist(s["none"], bins, alpha=0.6, label="nothing fits", color="#e76f51")
        ax.axvline(report["threshold"], color="black", ls="--", label=f"threshold {report['threshold']:.3f}")
        r = report["sets"][name]
        ax.set_title(f"{name}: {100 * r['fitting_sent_to_text']:.1f} % fitting -> text, "
                     f"{100 * r['nothing_fits_sent_to_text']:.1f} % nothing-fits -> text", fontsize=9)
        ax.set_xlabel("router score")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--gate", default=str(REPO / "var" / "models" / "gate"), help="the gate model (the router's)")
    ap.add_argument("--per-tool", type=int, default=5, help="MetaTool requests per plugin")
    ap.add_argument("--miss", type=float, default=0.02, help="share of fitting MetaTool requests allowed to text")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not 0 <= a.miss < 1:
        ap.error("--miss: a share in [0, 1)")
    t0 = time.time()
    sets = {"metatool": scores(a.gate, *metatool_set(a.per_tool, a.seed)), "shipped": scores(a.gate, *shipped_set())}
    tau = float(np.quantile(sets["metatool"]["fits"], a.miss))
    report = {"what": __doc__.split("\n\n")[0], "gate": a.gate, "miss": a.miss, "threshold": round(tau, 4),
              "chosen_on": "metatool", "sets": {n: {"requests": len(s["fits"]), "top1": float(s["right"].mean()),
                                                     "auc": auc(s), **rates(s, tau)} for n, s in sets.items()},
              "curve": {n: [{"threshold": round(float(t), 4), **rates(s, float(t))}
                            for t in np.quantile(s["fits"], [0.0, 0.01, 0.02, 0.05, 0.1, 0.2])]
                        for n, s in sets.items()},
              "seconds": round(time.time() - t0, 1)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2))
    plot(report, sets, str(Path(a.json).with_suffix(".png")))
    print(json.dumps({k: report[k] for k in ("threshold", "sets", "seconds")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
