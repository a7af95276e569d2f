"""Route latency over gRPC at N = 338 (the whole registry), embedding and gate included, arms side by side.

    .venv/bin/python bench/routing_grpc.py --tools data/mcp_tools --queries data/queries/train.jsonl \
        --gate var/models/gate --json reports/routing_grpc.json

Starts one real router process per arm (``python -m services.router``) on a free port over a
directory store pre-filled with the registry (no compiler needed: the router embeds missing tool keys itself),
waits for SERVING, then sends every query line to each arm in turn (interleaved request by request, the arm
order alternating, ``--repeats`` passes), and reports client-side round-trip latency percentiles, the
server-measured ``route_ms`` and the escalation rate per arm, the ratio of their p50s, and a PNG of the
latency distributions. Arms (``--arms``): ``model`` (the router as it starts by default: the gate model with exemplar
keys at its validation-chosen weight), ``text`` (``exemplar_weight = 0``: text keys only, the scan over 338 rows
instead of ~5,000), ``int8`` (the default with its INT8 query encoder, ``NEXUS_ROUTER_QUERY_ENCODER_PRECISION=int8``:
the default, so ``model`` too) and ``fp32`` (the default at fp32: the fp32 graphs, the torch vectors, from a
training-form gate model; the held-out comparison of the two: bench/routing_int8.py).
Routers run from this checkout's root, so the default's relative paths resolve as under ``make run``. Latency only:
the production gate model trained on train.jsonl and calibrated on data/routing_calibration, so accuracy here would not be held-out (see ``nexus eval
routing``); ``--queries`` takes a JSONL file or a directory of them (data/routing_calibration escalates as the
gate was calibrated to, ~20 %; train.jsonl's trained lines rarely do).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.common.serve import free_port

REPO = Path(__file__).resolve().parents[1]
# arm -> extra router environment
ARMS = {"model": {}, "text": {"NEXUS_ROUTER_EXEMPLAR_WEIGHT": "0"},
        "int8": {"NEXUS_ROUTER_QUERY_ENCODER_PRECISION": "int8"}, "fp32": {"NEXUS_ROUTER_QUERY_ENCODER_PRECISION": "fp32"}}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def start_router(store: str, port: int, gate: str, threads: int, extra_env: dict[str, str], log_path: Path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
               NEXUS_ROUTER_GATE_MODEL_DIR=str(Path(gate).resolve()), NEXUS_ROUTER_TORCH_THREADS=str(threads),
               NEXUS_ROUTER_METRICS_PORT="0", NEXUS_ROUTER_LOG_LEVEL="INFO")
    env.update(extra_env)  # an arm's settings win
    return subprocess.Popen([sys.executable, "-m", "services.router", "--port", str(port),
                             "--store", store], env=env, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"),
                            cwd=REPO)


def wait_serving(ch, proc, log_path: Path, timeout_s: float = 300) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(ch)
    deadline = time.time() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError("router exited: " + log_path.read_text()[-2000:])
        try:
            if health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                return
        except grpc.RpcError:
            pass
        if time.time() > deadline:
            raise TimeoutError(f"router not SERVING after {timeout_s:.0f} s")
        time.sleep(0.3)


def summarize(rtt: list[float], server_ms: list[float], esc: list[bool], log_text: str, env: dict[str, str]) -> dict:
    # the router logs (WARNING and up) when a single request falls back to torch, and which graph it loaded (INFO)
    backend = "torch" if "embedded with torch" in log_text or "onnxruntime is not installed" in log_text \
        else "onnxruntime"
    if backend == "onnxruntime" and "query encoder: onnxruntime int8" in log_text:
        backend = "onnxruntime-int8"
    return {
        "query_encoder_backend": backend, "n_requests": len(rtt),
        "exemplar_keys_loaded": "exemplar keys loaded" in log_text,
        "rtt_ms_p50": pct(rtt, 50), "rtt_ms_p90": pct(rtt, 90), "rtt_ms_p99": pct(rtt, 99), "rtt_ms_max": max(rtt),
        "server_route_ms_p50": pct(server_ms, 50), "server_route_ms_p99": pct(server_ms, 99),
        "escalation_rate": sum(esc) / len(esc),
        "rtt_ms_p50_escalated": pct([t for t, e in zip(rtt, esc, strict=True) if e], 50) if any(esc) else None,
        "rtt_ms_p50_auto": pct([t for t, e in zip(rtt, esc, strict=True) if not e], 50) if not all(esc) else None,
    }


def plot(rep: dict, samples: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, xs in samples.items():
        xs = np.sort(xs)
        a = rep["arms"][arm]
        ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=f"{arm}: p50 {a['rtt_ms_p50']:.1f} ms, "
                f"p99 {a['rtt_ms_p99']:.1f} ms")
    for q, ms in (("p50 target", 15), ("p99 target", 40)):
        ax.axvline(ms, ls="--", lw=0.8, color="grey")
        ax.text(ms, 0.02, f" {q}", fontsize=7, color="grey")
    ax.set_xscale("log")
    ax.set_xlim(right=max(60.0, max(max(xs) for xs in samples.values()) * 1.1))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([5, 10, 15, 20, 30, 40, 60, 100])
    ax.set_xlabel("Route round trip over gRPC, ms (log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Route latency at N = {rep['registry_size']}, {rep['repeats']} interleaved passes, "
                 f"load {rep['load_avg_1m_at_end']:.1f} on {rep['cpus']} cores", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--gate", default="var/models/gate")
    ap.add_argument("--json", default="reports/routing_grpc.json")
    ap.add_argument("--limit", type=int, default=0, help="lines to send (0 = all)")
    ap.add_argument("--threads", type=int, default=1, help="router torch threads")
    ap.add_argument("--repeats", type=int, default=2, help="passes over the lines (each arm gets every line per pass)")
    ap.add_argument("--arms", default="model,text", help=f"comma-separated, of {', '.join(ARMS)}")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        ap.error(f"--arms: unknown arm(s) {unknown or args.arms!r}; choose from {', '.join(ARMS)}")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    fp32 = [a for a in arms if a.endswith("fp32")]
    if fp32 and not (Path(args.gate) / "query_encoder" / "onnx" / "sentence_embedding.onnx").is_file():
        ap.error(f"--arms {','.join(fp32)}: the gate model at {args.gate} has its INT8 graph only (the shipped serving "
                 f"form); pass --gate a training-form model (`make train` writes one to ~/.cache/nexus/models/gate)")

    import grpc

    from evals.routing_models import load_augment
    from nexus.v1 import common_pb2, router_pb2, router_pb2_grpc
    from services.common.store import LocalStore
    from training.data import load_registry

    registry = load_registry(args.tools)
    lines = load_augment(args.queries)
    if args.limit:
        lines = lines[: args.limit]

    def req(ln):
        return router_pb2.RouteRequest(query=ln.query, top_k=5,
                                       history=[common_pb2.Turn(role=r, content=c) for r, c in ln.history])

    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        LocalStore(tmp).registry_put(list(registry.tools))
        procs, stubs, logs = {}, {}, {}
        try:
            for arm in arms:  # one after the other: both would embed the same missing keys into the store
                logs[arm] = Path(tmp) / f"{arm}.log"
                port = free_port()
                procs[arm] = start_router(tmp, port, args.gate, args.threads, ARMS[arm], logs[arm])
                ch = grpc.insecure_channel(f"127.0.0.1:{port}")
                wait_serving(ch, procs[arm], logs[arm])
                stubs[arm] = router_pb2_grpc.RouterServiceStub(ch)
                for ln in lines[:20]:
                    stubs[arm].Route(req(ln), timeout=30)
            rtt = {a: [] for a in arms}
            server_ms = {a: [] for a in arms}
            esc = {a: [] for a in arms}
            picks: dict[str, list[str]] = {a: [] for a in arms}
            n_tools = {a: len(stubs[a].ListTools(router_pb2.ListToolsRequest(), timeout=30).tools) for a in arms}
            for rep_i in range(args.repeats):
                for i, ln in enumerate(lines):
                    order = arms if (i + rep_i) % 2 == 0 else arms[::-1]
                    for arm in order:
                        t0 = time.perf_counter()
                        resp = stubs[arm].Route(req(ln), timeout=30)
                        rtt[arm].append((time.perf_counter() - t0) * 1e3)
                        server_ms[arm].append(resp.route_ms)
                        esc[arm].append(bool(resp.escalated))
                        picks[arm].append(resp.tool)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(timeout=30)
        log_text = {a: logs[a].read_text() for a in arms}
    if len(set(n_tools.values())) != 1:
        raise RuntimeError(f"arms see different registries: {n_tools}")
    rep = {
        "registry_size": next(iter(n_tools.values())), "gate_model": str(args.gate), "torch_threads": args.threads,
        "n_lines": len(lines), "repeats": args.repeats, "interleaved": "request by request, arm order alternating",
        "arms": {a: summarize(rtt[a], server_ms[a], esc[a], log_text[a], ARMS[a]) for a in arms},
        "arm_env": {a: ARMS[a] for a in arms},
        "load_avg_1m_at_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    a = arms[0]
    for b in arms[1:]:  # the first arm against each other one
        rep[f"p50_ratio_{a}_over_{b}"] = rep["arms"][a]["rtt_ms_p50"] / rep["arms"][b]["rtt_ms_p50"]
        rep[f"p99_ratio_{a}_over_{b}"] = rep["arms"][a]["rtt_ms_p99"] / rep["arms"][b]["rtt_ms_p99"]
        # the same request, the same tool? (arms that differ in precision only should rarely disagree)
        rep[f"same_tool_{a}_and_{b}"] = sum(x == y for x, y in zip(picks[a], picks[b], strict=True)) / len(picks[a])
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    rep["plot"] = str(out.with_suffix(".png"))
    plot(rep, rtt, out.with_suffix(".png"))
    out.write_text(json.dumps(rep, indent=2))
    print(json.dumps(rep, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
