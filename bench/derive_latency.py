"""Registering new tools: routable at once, derived keys ready in the background. Starts a compiler (derived requests
on, the real generator) and a router on a fresh embedded store, registers ``--tools N`` tools that no shipped data
covers (registry tools with a reworded description, so their schema hashes are new), and records when RegisterTools
returned, that Route answers at once, and when ListTools showed each tool's keys as derived.

    .venv/bin/python bench/derive_latency.py --tools 50 --json reports/derive_latency.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default=str(REPO / "data" / "mcp_tools"))
    ap.add_argument("--tools", type=int, default=50)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="reports/derive_latency.json")
    a = ap.parse_args(argv)

    from nexus_client import NexusClient
    from services.common.tools import load_registry_dir
    from tests.conftest import start_compiler, start_router

    tools = load_registry_dir(a.registry)
    picked = random.Random(a.seed).sample(tools, min(a.tools, len(tools)))
    new = [{"name": f"my_{t.name}", "description": f"{t.description} (our fork)", "inputSchema": t.input_schema}
           for t in picked]
    with tempfile.TemporaryDirectory(prefix="nexus-derive-bench-") as tmp:
        compiler = start_compiler(tmp, derive=True, derive_parallel=a.parallel, derive_threads=a.threads)
        router = start_router(tmp, compiler.addr, gate_model_dir="")
        try:
            with NexusClient(router=router.addr, timeout_s=600) as client:
                t0 = time.monotonic()
                client.register([json.dumps(t) for t in new])
                registered = time.monotonic() - t0
                r0 = time.monotonic()
                first_route = client.route("open a pull request from feature-x into main").tool
                route_ms = (time.monotonic() - r0) * 1e3
                ready: dict[str, float] = {}
                states: list[tuple[float, int]] = []
                while len(ready) < len(new) and time.monotonic() - t0 < a.timeout:
                    keys = {t.name: t.keys for t in client.list_tools().tools}
                    now = time.monotonic() - t0
                    for n, k in keys.items():
                        if k == "derived" and n not in ready:
                            ready[n] = now
                    states.append((now, len(ready)))
                    time.sleep(2.0)
        finally:
            router.stop()
            compiler.stop()
    done = sorted(ready.values())
    report = {"tools": len(new), "register_s": round(registered, 2), "route_after_register_ms": round(route_ms, 1),
              "route_after_register_tool": first_route, "derived": len(done),
              "all_derived_s": round(done[-1], 1) if len(done) == len(new) else None,
              "median_derived_s": round(done[len(done) // 2], 1) if done else None,
              "per_tool_s": round(done[-1] / len(done), 2) if done else None,
              "parallel": a.parallel, "threads": a.threads, "progress": states}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(report, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.step([t / 60 for t, _ in states], [n for _, n in states], where="post")
    ax.axvline(5, color="grey", ls=":", label="target: 5 min")
    ax.axhline(len(new), color="grey", lw=0.5)
    ax.set_xlabel("minutes after RegisterTools")
    ax.set_ylabel("tools with derived keys")
    ax.set_title(f"{len(new)} new tools: RegisterTools {registered:.1f} s, routable at once")
    ax.legend()
    fig.tight_layout()
    fig.savefig(Path(a.json).with_suffix(".png"), dpi=110)
    plt.close(fig)
    print(json.dumps({k: v for k, v in report.items() if k != "progress"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
