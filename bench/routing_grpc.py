"""Route latency over gRPC at N = 338 (the whole registry), embedding and gate included.

    .venv/bin/python bench/routing_grpc.py --tools ../shared/data/mcp_tools --queries ../shared/data/queries/train.jsonl \
        --gate var/models/gate --json reports/routing_grpc.json

Starts a real router process (``python -m services.cli serve router``) on a free port over a directory
store pre-filled with the registry (no compiler needed: the router embeds missing tool keys itself),
waits for SERVING, sends every query line once (plus a warm-up), and reports client-side round-trip
latency percentiles, the server-measured ``route_ms`` and the escalation rate. Latency only: the gate
model in use was trained on these lines, so accuracy here would not be held-out (see ``nexus eval routing``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tools", required=True)
    ap.add_argument("--queries", required=True)
    ap.add_argument("--gate", default="var/models/gate")
    ap.add_argument("--json", default="reports/routing_grpc.json")
    ap.add_argument("--limit", type=int, default=0, help="lines to send (0 = all)")
    ap.add_argument("--threads", type=int, default=1, help="router torch threads")
    args = ap.parse_args(argv)

    import grpc

    from nexus.v1 import common_pb2, router_pb2, router_pb2_grpc
    from services.common.store import LocalStore
    from services.evals.data import load_queries, load_registry

    registry = load_registry(args.tools)
    lines = load_queries(args.queries)
    if args.limit:
        lines = lines[: args.limit]
    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        LocalStore(tmp).registry_put(list(registry.tools))
        port = free_port()
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
                   NEXUS_ROUTER_GATE_MODEL_DIR=str(Path(args.gate).resolve()),
                   NEXUS_ROUTER_TORCH_THREADS=str(args.threads), NEXUS_ROUTER_METRICS_PORT="0",
                   NEXUS_ROUTER_LOG_LEVEL="WARNING")
        proc = subprocess.Popen([sys.executable, "-m", "services.cli", "serve", "router", "--port", str(port),
                                 "--store", tmp], env=env, stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / "log", "w"))
        try:
            from grpc_health.v1 import health_pb2, health_pb2_grpc

            ch = grpc.insecure_channel(f"127.0.0.1:{port}")
            health = health_pb2_grpc.HealthStub(ch)
            deadline = time.time() + 300
            while True:
                if proc.poll() is not None:
                    raise RuntimeError("router exited: " + (Path(tmp) / "log").read_text()[-2000:])
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=2).status == 1:
                        break
                except grpc.RpcError:
                    pass
                if time.time() > deadline:
                    raise TimeoutError("router not SERVING after 300 s")
                time.sleep(0.3)
            stub = router_pb2_grpc.RouterServiceStub(ch)

            def req(ln):
                return router_pb2.RouteRequest(query=ln.query, top_k=5,
                                               history=[common_pb2.Turn(role=r, content=c) for r, c in ln.history])

            for ln in lines[:20]:
                stub.Route(req(ln), timeout=30)
            rtt, server_ms, esc_flags, n_tools = [], [], [], 0
            for ln in lines:
                t0 = time.perf_counter()
                resp = stub.Route(req(ln), timeout=30)
                rtt.append((time.perf_counter() - t0) * 1e3)
                server_ms.append(resp.route_ms)
                esc_flags.append(bool(resp.escalated))
            listed = router_pb2_grpc.RouterServiceStub(ch).ListTools(router_pb2.ListToolsRequest(), timeout=30)
            n_tools = len(listed.tools)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log_text = (Path(tmp) / "log").read_text()
    # the router logs (WARNING and up) when a single request falls back to torch
    backend = "torch" if "embedded with torch" in log_text or "onnxruntime is not installed" in log_text \
        else "onnxruntime"
    rep = {
        "query_encoder_backend": backend,
        "n_requests": len(lines), "registry_size": n_tools, "gate_model": str(args.gate), "torch_threads": args.threads,
        "rtt_ms_p50": pct(rtt, 50), "rtt_ms_p90": pct(rtt, 90), "rtt_ms_p99": pct(rtt, 99), "rtt_ms_max": max(rtt),
        "server_route_ms_p50": pct(server_ms, 50), "server_route_ms_p99": pct(server_ms, 99),
        "escalation_rate": sum(esc_flags) / len(lines),
        "rtt_ms_p50_escalated": pct([t for t, e in zip(rtt, esc_flags, strict=True) if e], 50) if any(esc_flags) else None,
        "rtt_ms_p50_auto": pct([t for t, e in zip(rtt, esc_flags, strict=True) if not e], 50),
        "load_avg_1m_at_end": os.getloadavg()[0],
        "cpus": os.cpu_count(),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rep, indent=2))
    print(json.dumps(rep, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
