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
        fit, right, none, cands = [], [], [], []
        for q, tool, fitting in rows:
            d = router.route(q)
            fit.append(d.score)
            right.append(d.tool == tool)
            n = router.route(q, allowed=[n for n in every if n not in fitting])
            none.append(n.score)
            cands.append(([c for c, _ in d.candidates[:TOP_K]], [c for c, _ in n.candidates[:TOP_K]]))
    return {"fits": np.array(fit), "right": np.array(right), "none": np.array(none), "candidates": cands}


# The model's own verdict (--llm): asked whether one of the router's top candidates can do the request, the
# probability it answers yes (against no). (The first token of Qwen's native tool-call format was tried first:
# Qwen2.5-Coder-0.5B opens its answer with a bare '{"' far more often than with <tool_call>, tools fitting or not.)
TOP_K = 3
FIT_SYSTEM = "You decide whether a request can be done by calling one of the given tools."
FIT_QUESTION = "Tools:\n{tools}\n\nRequest: {query}\n\nCan one of these tools do this request? Answer yes or no."


class FitProbe:
    """P(yes) / (P(yes) + P(no)) for "can one of these tools do the request", from a llama.cpp chat model; the
    shared system text stays in the KV cache between prompts."""

    def __init__(self, model: str, n_threads: int = 2):
        import llama_cpp

        from services.common.models import resolve_gguf
        from services.runtime.prompt import ChatTemplate

        self.llm = llama_cpp.Llama(str(resolve_gguf(model)), n_ctx=4096, n_threads=n_threads, verbose=False)
        self.template = ChatTemplate(self.llm.metadata.get("tokenizer.chat_template"))
        self.yes = [self.llm.tokenize(w, add_bos=False)[0] for w in (b"yes", b"Yes")]
        self.no = [self.llm.tokenize(w, add_bos=False)[0] for w in (b"no", b"No")]
        self.name = Path(self.llm.model_path).name

    def __call__(self, query: str, signatures: list[str]) -> float:
        tools = "\n".join("- " + s for s in signatures)
        text = self.template.render([{"role": "system", "content": FIT_SYSTEM},
                                     {"role": "user", "content": FIT_QUESTION.format(tools=tools, query=query)}])
        toks = self.llm.tokenize(text.encode(), add_bos=False, special=True)
        prev = self.llm.input_ids[: self.llm.n_tokens]
        keep = 0
        while keep < min(len(prev), len(toks) - 1) and prev[keep] == toks[keep]:
            keep += 1
        self.llm.n_tokens = keep  # eval() drops the cache past it
        self.llm.eval(toks[keep:])
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),)).astype(np.float64)
        y, n = np.logaddexp.reduce(logits[self.yes]), np.logaddexp.reduce(logits[self.no])
        return float(1 / (1 + np.exp(n - y)))


def llm_scores(probe: FitProbe, tools, rows, s: dict, idx: list[int]) -> dict[str, np.ndarray]:
    """The probe's P(yes) for the requests ``idx`` of ``rows``, with the router's top candidates when a tool
    fits and when nothing does."""
    from services.compiler.signature import signature

    sig = {t.name: signature(t) for t in tools}
    fit, none = [], []
    for i in idx:
        q = rows[i][0]
        c_fit, c_none = s["candidates"][i]
        fit.append(probe(q, [sig[c] for c in c_fit]))
        none.append(probe(q, [sig[c] for c in c_none]))
    return {"fits": np.array(fit), "none": np.array(none)}


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


def rank_mean(*scores: np.ndarray) -> list[np.ndarray]:
    """Each score turned into its rank among both conditions' scores, then averaged over the scorers."""
    n = len(scores[0]) // 2
    ranks = [np.argsort(np.argsort(x)) / (len(x) - 1) for x in scores]
    both = np.mean(ranks, axis=0)
    return [both[:n], both[n:]]


def llm_arm(a, data: dict, sets: dict) -> dict:
    """The model's P(yes) over a seeded sample of each set's requests, beside the router's score on the same
    requests and their rank average; the threshold chosen on MetaTool as the router's is."""
    from tqdm import tqdm

    probe = FitProbe(a.llm)
    rng = np.random.default_rng(a.seed)
    out: dict = {"model": probe.name, "top_k": TOP_K, "system": FIT_SYSTEM, "question": FIT_QUESTION, "sets": {}}
    got: dict = {}
    for name, (tools, rows) in data.items():
        idx = sorted(rng.choice(len(rows), size=min(a.llm_sample, len(rows)), replace=False).tolist())
        t0 = time.time()
        llm = llm_scores(probe, tools, rows, sets[name], list(tqdm(idx, desc=f"llm {name}", unit="request")))
        r = {"fits": sets[name]["fits"][idx], "none": sets[name]["none"][idx]}
        both_fit, both_none = rank_mean(np.concatenate([llm["fits"], llm["none"]]),
                                        np.concatenate([r["fits"], r["none"]]))
        got[name] = {"llm": llm, "router": r, "rank mean": {"fits": both_fit, "none": both_none}}
        out["sets"][name] = {"requests": len(idx), "seconds_per_prompt": round((time.time() - t0) / (2 * len(idx)), 3)}
    for arm in ("llm", "router", "rank mean"):
        tau = float(np.quantile(got["metatool"][arm]["fits"], a.miss))
        for name in got:
            g = got[name][arm]
            out["sets"][name][arm] = {"auc": auc(g), "threshold": round(tau, 4),
                                      "fitting_sent_to_text": float((g["fits"] < tau).mean()),
                                      "nothing_fits_sent_to_text": float((g["none"] < tau).mean())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--gate", default=str(REPO / "var" / "models" / "gate"), help="the gate model (the router's)")
    ap.add_argument("--per-tool", type=int, default=5, help="MetaTool requests per plugin")
    ap.add_argument("--miss", type=float, default=0.02, help="share of fitting MetaTool requests allowed to text")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llm", default="", help="also a chat model's own verdict: a GGUF (path or models/gguf.json "
                                              "name), e.g. qwen2.5-coder-1.5b")
    ap.add_argument("--llm-sample", type=int, default=200, help="requests per set the --llm arm reads")
    a = ap.parse_args(argv)
    if not 0 <= a.miss < 1:
        ap.error("--miss: a share in [0, 1)")
    t0 = time.time()
    data = {"metatool": metatool_set(a.per_tool, a.seed), "shipped": shipped_set()}
    sets = {n: scores(a.gate, *d) for n, d in data.items()}
    tau = float(np.quantile(sets["metatool"]["fits"], a.miss))
    report = {"what": __doc__.split("\n\n")[0], "gate": a.gate, "miss": a.miss, "threshold": round(tau, 4),
              "chosen_on": "metatool", "sets": {n: {"requests": len(s["fits"]), "top1": float(s["right"].mean()),
                                                     "auc": auc(s), **rates(s, tau)} for n, s in sets.items()},
              "curve": {n: [{"threshold": round(float(t), 4), **rates(s, float(t))}
                            for t in np.quantile(s["fits"], [0.0, 0.01, 0.02, 0.05, 0.1, 0.2])]
                        for n, s in sets.items()},
              "seconds": round(time.time() - t0, 1)}
    if a.llm:
        report["llm"] = llm_arm(a, data, sets)
        report["seconds"] = round(time.time() - t0, 1)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2))
    plot(report, sets, str(Path(a.json).with_suffix(".png")))
    print(json.dumps({k: report[k] for k in ("threshold", "sets", "seconds")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
