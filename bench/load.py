"""Bounded load test of a real loopback cluster, written to reports/load.json + reports/load.png.

Starts compiler, engine and router as separate processes (``nexus serve …``) on a fresh directory store,
registers a fixed slice of the shared MCP registry (every 7th tool: 50 tools across servers), then runs
``--route-clients`` threads calling Route with held-out-style queries of those tools and
``--generate-clients`` threads calling Generate (small ``max_tokens``) for a fixed time, after one
Generate per tool (bounded per-tool caches filled) and a short warm-up of the same traffic. Reports per RPC:
requests, throughput, p50 / p90 / p99 latency, errors by status (must be 0); and the RSS of each server
process sampled every second, with growth = mean RSS of the second half minus the first half (must be
flat: the criterion is < 5 % and < 32 MiB).

Usage: .venv/bin/python bench/load.py [--seconds 60] [--route-clients 16] [--generate-clients 2]
(``make load``; LOAD_SECONDS overrides the duration). The cores are shared with the servers and with
anything else on the machine: the throughput is a floor, not a capacity figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import psutil

from services.common.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REPORTS = ROOT / "reports"
DATA = ROOT / "data"  # the default registry and the query file (data/README.md)


def pick_tools(n: int):
    from services.common.tools import load_registry_dir

    tools = load_registry_dir(str(DATA / "mcp_tools"))
    step = max(1, len(tools) // n)
    return tools[::step][:n]


def pick_queries(names: set[str]) -> list[tuple[str, str]]:
    out = []
    for line in (DATA / "queries" / "train.jsonl").read_text().splitlines():
        q = json.loads(line)
        if q["tool"] in names:
            out.append((q["query"], q["tool"]))
    return out


class Cluster:
    """The three services as child processes on free loopback ports."""

    def __init__(self, store: Path, log_dir: Path):
        self.ports = {s: free_port() for s in ("compiler", "engine", "router")}
        self.procs: dict[str, subprocess.Popen] = {}
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   NEXUS_ROUTER_COMPILER_ADDR=f"127.0.0.1:{self.ports['compiler']}")
        for s in self.ports:
            env[f"NEXUS_{s.upper()}_METRICS_PORT"] = "0"
        self.env, self.store, self.log_dir = env, store, log_dir

    def addr(self, s: str) -> str:
        return f"127.0.0.1:{self.ports[s]}"

    def start(self) -> None:
        from cli.main import wait_healthy

        self.log_dir.mkdir(parents=True, exist_ok=True)
        for s in ("compiler", "engine", "router"):
            log = open(self.log_dir / f"{s}.log", "wb")  # noqa: SIM115 - the child's for its lifetime
            self.procs[s] = subprocess.Popen(
                [sys.executable, "-m", f"services.{s}", "--port", str(self.ports[s]),
                 "--store", str(self.store)], cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        for s, p in self.procs.items():
            wait_healthy(self.addr(s), timeout_s=300, proc=p)

    def stop(self) -> dict[str, int | None]:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        codes = {}
        for s, p in self.procs.items():
            try:
                codes[s] = p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[s] = p.wait()
        return codes


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.lat: dict[str, list[float]] = defaultdict(list)
        self.t: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.error_examples: list[str] = []

    def ok(self, rpc: str, t_end: float, ms: float) -> None:
        with self.lock:
            self.lat[rpc].append(ms)
            self.t[rpc].append(t_end)

    def error(self, rpc: str, code: str, detail: str) -> None:
        with self.lock:
            self.errors[rpc][code] += 1
            if len(self.error_examples) < 10:
                self.error_examples.append(f"{rpc}: {code}: {detail[:200]}")


def rpc_worker(rpc: str, client_kw: dict, call, queries, stop: threading.Event, rec: Recorder, seed: int,
               t0: float) -> None:
    """Send ``call(client, query, tool)`` in a loop until ``stop``, recording latency or the error code."""
    from nexus_client import NexusClient, NexusClientError

    rnd = random.Random(seed)
    with NexusClient(**client_kw) as c:
        while not stop.is_set():
            q, tool = rnd.choice(queries)
            s = time.perf_counter()
            try:
                call(c, q, tool)
                rec.ok(rpc, time.perf_counter() - t0, (time.perf_counter() - s) * 1e3)
            except NexusClientError as e:
                rec.error(rpc, e.code.name, e.details)


def route_worker(addr: str, queries, stop: threading.Event, rec: Recorder, seed: int, t0: float) -> None:
    rpc_worker("Route", {"router": addr, "timeout_s": 30}, lambda c, q, _tool: c.route_pb(q),
               queries, stop, rec, seed, t0)


def generate_worker(addr: str, queries, stop: threading.Event, rec: Recorder, seed: int, t0: float,
                    max_tokens: int) -> None:
    rpc_worker("Generate", {"engine": addr, "timeout_s": 120},
               lambda c, q, tool: c.generate(q, tool, max_tokens=max_tokens), queries, stop, rec, seed, t0)


def rss_sampler(procs: dict[str, subprocess.Popen], stop: threading.Event, out: dict, t0: float,
                interval: float = 1.0) -> None:
    ps = {s: psutil.Process(p.pid) for s, p in procs.items()}
    while not stop.wait(interval):
        t = time.perf_counter() - t0
        for s, p in ps.items():
            try:
                out[s].append((round(t, 2), p.memory_info().rss))
            except psutil.Error:
                out[s].append((round(t, 2), None))


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 2) if xs else None


def growth(series: list[tuple[float, int | None]]) -> dict:
    vals = [v for _, v in series if v is not None]
    if len(vals) < 4:
        return {"samples": len(vals)}
    half = len(vals) // 2
    a, b = float(np.mean(vals[:half])), float(np.mean(vals[half:]))
    mib = (b - a) / 2**20
    return {"samples": len(vals), "first_half_mib": round(a / 2**20, 1), "second_half_mib": round(b / 2**20, 1),
            "growth_mib": round(mib, 2), "growth_pct": round(100 * (b - a) / a, 2),
            "min_mib": round(min(vals) / 2**20, 1), "max_mib": round(max(vals) / 2**20, 1),
            "flat": bool(abs(mib) < 32 and abs(b - a) / a < 0.05)}


def plot(report: dict, rec: Recorder, rss: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(16, 4.5))
    dur = report["config"]["seconds"]
    for rpc, ts in rec.t.items():
        bins = np.arange(0, dur + 2, 1.0)
        h, _ = np.histogram(ts, bins=bins)
        ax[0].plot(bins[:-1], h, label=f"{rpc} ({report['rpcs'][rpc]['throughput_rps']:.1f}/s)")
    ax[0].set(title="throughput", xlabel="s", ylabel="requests / s")
    ax[0].legend()
    for rpc, lat in rec.lat.items():
        xs = np.sort(lat)
        ax[1].plot(xs, np.linspace(0, 1, len(xs)), label=f"{rpc} p50 {pct(lat, 50)} / p99 {pct(lat, 99)} ms")
    ax[1].set(title="latency CDF", xlabel="ms", xscale="log", ylabel="fraction")
    ax[1].legend(fontsize=8)
    for s, series in rss.items():
        pts = [(t, v / 2**20) for t, v in series if v is not None]
        if pts:
            ax[2].plot(*zip(*pts, strict=True), label=f"{s} (Δ {report['rss'][s].get('growth_mib')} MiB)")
    ax[2].set(title="server RSS", xlabel="s", ylabel="MiB")
    ax[2].legend(fontsize=8)
    errs = sum(r["errors"] for r in report["rpcs"].values())
    fig.suptitle(f"Nexus load test: {report['config']['route_clients']} Route + "
                 f"{report['config']['generate_clients']} Generate clients, {dur:.0f} s, errors {errs}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=float(os.environ.get("LOAD_SECONDS", 60)))
    p.add_argument("--route-clients", type=int, default=16)
    p.add_argument("--generate-clients", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--tools", type=int, default=50)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--json", default=str(REPORTS / "load.json"))
    p.add_argument("--png", default=str(REPORTS / "load.png"))
    args = p.parse_args(argv)

    from nexus_client import NexusClient

    tools = pick_tools(args.tools)
    queries = pick_queries({t.name for t in tools})
    work = Path(tempfile.mkdtemp(prefix="nexus-load-"))
    cluster = Cluster(work / "store", work / "log")
    print(f"starting cluster (store {work / 'store'}) …", file=sys.stderr, flush=True)
    t_start = time.perf_counter()
    cluster.start()
    try:
        with NexusClient(router=cluster.addr("router"), timeout_s=600) as c:
            c.register([t.to_json() for t in tools])
        # Generate once per tool first: the engine's bounded per-tool caches (decoded KV blocks, grammars)
        # fill here, so RSS growth during the measurement means a leak, not a cache warming up.
        first_query = {}
        for q, tool in queries:
            first_query.setdefault(tool, q)
        with NexusClient(engine=cluster.addr("engine"), timeout_s=300) as c:
            for tool in sorted(first_query):
                c.generate(first_query[tool], tool, max_tokens=args.max_tokens)
        print(f"cluster up, {len(tools)} tools registered and generated once in {time.perf_counter() - t_start:.0f} s; "
              f"{len(queries)} queries; warm-up {args.warmup:.0f} s, then {args.seconds:.0f} s of load",
              file=sys.stderr, flush=True)
        rec, stop = Recorder(), threading.Event()
        rss: dict[str, list] = {s: [] for s in cluster.procs}
        t0 = time.perf_counter() + args.warmup
        threads = [threading.Thread(target=route_worker, args=(cluster.addr("router"), queries, stop, rec, i, t0))
                   for i in range(args.route_clients)]
        threads += [threading.Thread(target=generate_worker, args=(cluster.addr("engine"), queries, stop, rec,
                                                                   1000 + i, t0, args.max_tokens))
                    for i in range(args.generate_clients)]
        for th in threads:
            th.start()
        time.sleep(args.warmup)  # warm-up traffic, not counted
        with rec.lock:
            rec.lat.clear()
            rec.t.clear()
            rec.errors.clear()
        sampler = threading.Thread(target=rss_sampler, args=(cluster.procs, stop, rss, t0))
        sampler.start()
        time.sleep(args.seconds)
        stop.set()
        for th in [*threads, sampler]:
            th.join(timeout=180)
        elapsed = time.perf_counter() - t0
    finally:
        exit_codes = cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    rpcs = {}
    for rpc in ("Route", "Generate"):
        # requests finishing after the stop (in-flight Generates) are counted: they were served
        lat = rec.lat.get(rpc, [])
        rpcs[rpc] = {"requests": len(lat), "errors": sum(rec.errors.get(rpc, {}).values()),
                     "errors_by_status": dict(rec.errors.get(rpc, {})),
                     "throughput_rps": round(len(lat) / elapsed, 2),
                     "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
                     "max_ms": round(max(lat), 2) if lat else None}
    report = {
        "what": "bounded load test on loopback: Route + Generate against compiler/engine/router child processes",
        "config": {"seconds": args.seconds, "warmup_s": args.warmup, "route_clients": args.route_clients,
                   "generate_clients": args.generate_clients, "generate_max_tokens": args.max_tokens,
                   "tools": len(tools), "queries": len(queries), "store": "directory"},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "note": "2 shared cores: the clients, the three servers and other jobs compete for them"},
        "rpcs": rpcs,
        "errors_total": sum(r["errors"] for r in rpcs.values()),
        "error_examples": rec.error_examples,
        "rss": {s: growth(v) for s, v in rss.items()},
        "rss_series_mib": {s: [(t, round(v / 2**20, 1)) for t, v in v_ if v is not None] for s, v_ in rss.items()},
        "server_exit_codes": exit_codes,
    }
    report["memory_flat"] = all(g.get("flat", False) for g in report["rss"].values())
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    plot(report, rec, rss, Path(args.png))
    print(json.dumps({k: report[k] for k in ("rpcs", "errors_total", "rss", "memory_flat")}, indent=2))
    return 0 if report["errors_total"] == 0 and report["memory_flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
