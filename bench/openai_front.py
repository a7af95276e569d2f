"""An agent's first request carrying 300 new tools through the OpenAI-compatible front, and the same 300 again,
written to reports/openai_front.json + reports/openai_front.png.

    nice -n 10 .venv/bin/python bench/openai_front.py [--tools 300] [--repeats 3] [--json reports/openai_front.json]

Starts compiler, engine and router as ``nexus up`` does (separate processes, the compiler's KV blocks on the host's
cores up to 4) on a fresh directory store with an empty registry, and the front (``python -m services.openai``).
Each repeat builds ``--tools`` distinct small JSON-schema tools never seen before (``synthetic_tools``: a fresh
namespace per repeat) and times, with the official ``openai`` client, one complete tool call (``tool_choice``
auto, non-streaming):

* ``first``: the request that brings the new tools (the front registers them: key embedding, signature and grammar
  on the request's path, the KV blocks queued for the compiler's background);
* ``again``: the same request with the same tools right after (nothing to register; the blocks still compiling);
* ``again_blocks_ready``: once more after the compiler's background queue has drained (``nexus_kv_blocks_pending``
  = 0; the chosen tool spliced, path A).

Also timed once: ``RegisterTools`` of another fresh set *without* ``defer_kv_blocks`` (every KV block compiled
before the call returns: the path a first request took before), and how long the deferred blocks took to drain.
Reported as p50 (and each value) over the repeats, with the front's own breakdown (register / route / generate ms,
prefill path) and whether the chosen tool is the one the request names. Not a test: timings depend on the machine
and its load (the host's load average is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REPORTS = ROOT / "reports"

NAMESPACES = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell", "cyberdyne", "soylent",
              "wonka", "gringotts", "oscorp", "vandelay", "dunder", "pied", "aperture", "blackmesa", "monarch",
              "prestige")
NOUNS = ("invoice", "customer", "order", "ticket", "playlist", "shipment", "employee", "meeting", "document",
         "payment", "subscription", "warehouse", "campaign", "repository", "dashboard", "vehicle", "recipe",
         "reservation", "patient", "course")
VERBS = {  # verb -> (description template, properties, required)
    "get": ("Get one {noun} of the {ns} {area} by its id.",
            {"{noun}_id": {"type": "string", "description": "Id of the {noun}"}}, ["{noun}_id"]),
    "list": ("List the {noun}s of the {ns} {area}, newest first.",
             {"limit": {"type": "integer", "description": "How many to return"},
              "status": {"type": "string", "enum": ["open", "closed", "all"]}}, []),
    "create": ("Create a new {noun} in the {ns} {area}.",
               {"name": {"type": "string", "description": "Name or title of the {noun}"},
                "notes": {"type": "string"}}, ["name"]),
    "update": ("Update the fields of an existing {noun} in the {ns} {area}.",
               {"{noun}_id": {"type": "string"}, "name": {"type": "string"}, "notes": {"type": "string"}},
               ["{noun}_id"]),
    "delete": ("Delete a {noun} from the {ns} {area} permanently.",
               {"{noun}_id": {"type": "string"}, "force": {"type": "boolean"}}, ["{noun}_id"]),
    "search": ("Search the {ns} {area} for {noun}s matching a text query.",
               {"query": {"type": "string", "description": "Words to look for"},
                "limit": {"type": "integer"}}, ["query"]),
    "archive": ("Archive a {noun} of the {ns} {area} so it no longer shows in lists.",
                {"{noun}_id": {"type": "string"}}, ["{noun}_id"]),
    "export": ("Export {noun}s of the {ns} {area} to a file.",
               {"format": {"type": "string", "enum": ["csv", "json", "pdf"]}, "since": {"type": "string",
                                                                                    "description": "YYYY-MM-DD"}},
               ["format"]),
    "assign": ("Assign a {noun} of the {ns} {area} to a person.",
               {"{noun}_id": {"type": "string"}, "assignee": {"type": "string", "description": "Email of the person"}},
               ["{noun}_id", "assignee"]),
    "comment": ("Add a comment to a {noun} in the {ns} {area}.",
                {"{noun}_id": {"type": "string"}, "text": {"type": "string"}}, ["{noun}_id", "text"]),
    "count": ("Count the {noun}s in the {ns} {area}.",
              {"status": {"type": "string", "enum": ["open", "closed", "all"]}}, []),
    "share": ("Share a {noun} of the {ns} {area} with a colleague.",
              {"{noun}_id": {"type": "string"}, "email": {"type": "string"}, "can_edit": {"type": "boolean"}},
              ["{noun}_id", "email"]),
    "restore": ("Restore an archived {noun} in the {ns} {area}.",
                {"{noun}_id": {"type": "string"}}, ["{noun}_id"]),
    "tag": ("Add a tag to a {noun} in the {ns} {area}.",
            {"{noun}_id": {"type": "string"}, "tag": {"type": "string"}}, ["{noun}_id", "tag"]),
    "duplicate": ("Make a copy of a {noun} in the {ns} {area}.",
                  {"{noun}_id": {"type": "string"}, "new_name": {"type": "string"}}, ["{noun}_id"]),
}
AREAS = ("workspace", "account", "portal", "system", "platform")


def _fill(obj, **kw):
    if isinstance(obj, str):
        return obj.format(**kw)
    if isinstance(obj, dict):
        return {_fill(k, **kw): _fill(v, **kw) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, **kw) for v in obj]
    return obj


def synthetic_tools(n: int = 300, namespace: str = "acme") -> list[dict]:
    """``n`` distinct small tools in OpenAI's ``tools`` form, named ``<namespace>_<verb>_<noun>`` (at most
    len(VERBS) * len(NOUNS) = 300 per namespace): a namespace never used before is a set of tools never seen."""
    if n > len(VERBS) * len(NOUNS):
        raise ValueError(f"at most {len(VERBS) * len(NOUNS)} tools per namespace")
    out = []
    for i, noun in enumerate(NOUNS):
        for j, (verb, (desc, props, req)) in enumerate(VERBS.items()):
            kw = {"noun": noun, "ns": namespace.capitalize(), "area": AREAS[(i + j) % len(AREAS)]}
            out.append({"type": "function", "function": {
                "name": f"{namespace}_{verb}_{noun}", "description": _fill(desc, **kw),
                "parameters": {"type": "object", "properties": _fill(props, **kw), "required": _fill(req, **kw)}}})
    # interleave so that any prefix spans every verb and noun
    out.sort(key=lambda t: (hash_order(t["function"]["name"])))
    return out[:n]


def hash_order(name: str) -> str:
    import hashlib

    return hashlib.sha256(name.encode()).hexdigest()


def request_for(namespace: str) -> tuple[str, str]:
    """A user turn and the tool it names among ``synthetic_tools(namespace=...)``."""
    return (f"Create a new invoice called 'March consulting' in {namespace.capitalize()}",
            f"{namespace}_create_invoice")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """compiler, engine, router and the front as child processes, as ``nexus up`` starts them."""

    def __init__(self, store: Path, log_dir: Path, kv_threads: int):
        self.ports = {s: free_port() for s in ("compiler", "engine", "router", "openai")}
        self.metrics_port = free_port()
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                        NEXUS_ROUTER_COMPILER_ADDR=self.addr("compiler"), NEXUS_ROUTER_METRICS_PORT="0",
                        NEXUS_ENGINE_METRICS_PORT="0", NEXUS_COMPILER_METRICS_PORT=str(self.metrics_port),
                        NEXUS_COMPILER_KV_THREADS=str(kv_threads))
        self.store, self.log_dir = store, log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def addr(self, s: str) -> str:
        return f"127.0.0.1:{self.ports[s]}"

    def start(self) -> None:
        from cli.main import wait_healthy, wait_http_healthy

        self.log_dir.mkdir(parents=True, exist_ok=True)
        for s in ("compiler", "engine", "router"):
            log = open(self.log_dir / f"{s}.log", "wb")  # noqa: SIM115 - the child's for its lifetime
            self.procs[s] = subprocess.Popen([sys.executable, "-m", f"services.{s}", "--port", str(self.ports[s]),
                                              "--store", str(self.store)], cwd=ROOT, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT)
        for s in ("compiler", "engine", "router"):
            wait_healthy(self.addr(s), timeout_s=300, proc=self.procs[s])
        log = open(self.log_dir / "openai.log", "wb")  # noqa: SIM115
        self.procs["openai"] = subprocess.Popen(
            [sys.executable, "-m", "services.openai", "--port", str(self.ports["openai"]), "--router",
             self.addr("router"), "--engine", self.addr("engine")], cwd=ROOT, env=self.env, stdout=log,
            stderr=subprocess.STDOUT)
        wait_http_healthy(f"http://{self.addr('openai')}/health", timeout_s=300, proc=self.procs["openai"])

    def kv_pending(self) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("nexus_kv_blocks_pending "):
                    return float(line.split()[1])
        return 0.0

    def wait_blocks(self, timeout_s: float = 1800) -> float:
        """Seconds until the compiler's background KV queue is empty."""
        t0 = time.perf_counter()
        while self.kv_pending() > 0:
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError("KV blocks still pending")
            time.sleep(0.5)
        return time.perf_counter() - t0

    def stop(self) -> None:
        for s in ("openai", "router", "engine", "compiler"):
            p = self.procs.get(s)
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def call(client, tools: list[dict], query: str) -> dict:
    """One complete tool call through the front: wall time, and what the front reports."""
    import jsonschema

    t0 = time.perf_counter()
    r = client.chat.completions.create(model="nexus", messages=[{"role": "user", "content": query}], tools=tools)
    ms = (time.perf_counter() - t0) * 1e3
    choice = r.choices[0]
    (tc,) = choice.message.tool_calls
    schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == tc.function.name)
    args = json.loads(tc.function.arguments)
    try:
        jsonschema.validate(args, schema)
        valid = True
    except jsonschema.ValidationError:
        valid = False
    info = r.model_extra.get("nexus", {})
    return {"ms": round(ms, 1), "tool": tc.function.name, "arguments": args, "valid": valid,
            "finish_reason": choice.finish_reason, "tools_registered": info.get("tools_registered"),
            "register_ms": info.get("register_ms"), "route_ms": info.get("route_ms"),
            "prepare_ms": info.get("prepare_ms"), "generate_ms": info.get("generate_ms"),
            "prefill_path": info.get("prefill_path"), "prompt_tokens": r.usage.prompt_tokens}


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 1)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = report["tools"]
    rows = [(f"first request\n(registers {n} new tools)", report["p50_ms"]["first"]),
            (f"same {n} again\n(blocks compiling)", report["p50_ms"]["again"]),
            (f"same {n} again\n(blocks ready)", report["p50_ms"]["again_blocks_ready"])]
    if report.get("register_without_defer_ms") is not None:
        rows.append((f"RegisterTools of {n}\nwithout deferral", report["register_without_defer_ms"]))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    labels, vals = zip(*rows, strict=True)
    bars = ax.barh(labels, [v / 1e3 for v in vals], color=["#3b7dd8", "#62a36b", "#62a36b", "#c0504d"][:len(rows)])
    for b, v in zip(bars, vals, strict=True):
        ax.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v / 1e3:.2f} s", va="center")
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds, p50 over {report['repeats']} repeats (a complete tool call through the front; the last "
                  "bar: the registration alone)" if len(rows) > 3 else
                  f"seconds, p50 over {report['repeats']} repeats (a complete tool call through the front)")
    ax.set_title(f"{n} new tools through the OpenAI-compatible front ({report['host']['cpus']} CPUs, shared)")
    ax.set_xlim(0, max(vals) / 1e3 * 1.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tools", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-threads", type=int, default=min(os.cpu_count() or 1, 4),
                   help="the compiler's llama.cpp threads for KV blocks (default: as `nexus up`)")
    p.add_argument("--skip-undeferred", action="store_true", help="do not time RegisterTools without deferral")
    p.add_argument("--json", default=str(REPORTS / "openai_front.json"))
    a = p.parse_args(argv)
    if a.repeats + 1 > len(NAMESPACES):
        p.error(f"at most {len(NAMESPACES) - 1} repeats")

    import openai

    from nexus_client import NexusClient

    tmp = Path(tempfile.mkdtemp(prefix="openai-front-bench-"))
    stack = Stack(tmp / "store", tmp / "log", a.kv_threads)
    runs = []
    try:
        stack.start()
        base = f"http://{stack.addr('openai')}/v1"
        with openai.OpenAI(base_url=base, api_key="-", max_retries=0, timeout=1800) as client:
            # warm the engine and the front's path once (a tool of no later set)
            warm = synthetic_tools(1, "warmup")
            call(client, warm, "warm up")
            stack.wait_blocks()
            for r in range(a.repeats):
                ns = NAMESPACES[r]
                tools = synthetic_tools(a.tools, ns)
                query, expected = request_for(ns)
                if expected not in {t["function"]["name"] for t in tools}:
                    tools[-1] = next(t for t in synthetic_tools(len(VERBS) * len(NOUNS), ns)
                                     if t["function"]["name"] == expected)
                first = call(client, tools, query)
                again = call(client, tools, query)
                drain_s = stack.wait_blocks()
                ready = call(client, tools, query)
                runs.append({"namespace": ns, "expected_tool": expected, "first": first, "again": again,
                             "again_blocks_ready": ready, "blocks_drained_after_s": round(drain_s, 1)})
                print(f"[{r + 1}/{a.repeats}] first {first['ms']:.0f} ms (registered {first['tools_registered']}), "
                      f"again {again['ms']:.0f} ms, blocks drained after {drain_s:.1f} s, then "
                      f"{ready['ms']:.0f} ms ({ready['prefill_path']}); tool {first['tool']}", flush=True)
        undeferred_ms = None
        if not a.skip_undeferred:
            ns = NAMESPACES[a.repeats]
            raw = [json.dumps({"name": t["function"]["name"], "description": t["function"]["description"],
                               "inputSchema": t["function"]["parameters"]}) for t in synthetic_tools(a.tools, ns)]
            with NexusClient(router=stack.addr("router"), engine=stack.addr("engine"), timeout_s=3600) as nc:
                t0 = time.perf_counter()
                nc.register(raw, timeout_s=3600)
                undeferred_ms = round((time.perf_counter() - t0) * 1e3, 1)
            print(f"RegisterTools of {a.tools} without deferral: {undeferred_ms / 1e3:.1f} s", flush=True)
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    report = {
        "what": f"one complete tool call (openai client, tool_choice auto) carrying {a.tools} tools never seen "
                "before, then the same again, through the OpenAI-compatible front over a fresh `nexus up`-like "
                "cluster (empty registry, SmolLM2-135M engine)",
        "tools": a.tools, "repeats": a.repeats, "kv_threads": a.kv_threads,
        "p50_ms": {k: p50([r[k]["ms"] for r in runs]) for k in ("first", "again", "again_blocks_ready")},
        "p50_register_ms_first": p50([r["first"]["register_ms"] for r in runs]),
        "p50_blocks_drained_after_s": p50([r["blocks_drained_after_s"] for r in runs]),
        "register_without_defer_ms": undeferred_ms,
        "second_request_registered": [r["again"]["tools_registered"] for r in runs],
        "right_tool": sum(r["first"]["tool"] == r["expected_tool"] for r in runs),
        "valid_arguments": sum(r["first"]["valid"] and r["again"]["valid"] for r in runs),
        "runs": runs,
        "plain_llama_cpp_server_arm": "not run: llama_cpp.server is not importable in this venv "
                                      "(llama-cpp-python's [server] extras are not installed)",
        "host": {"cpus": os.cpu_count(), "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
                 "python": platform.python_version(), "machine": platform.machine()},
    }
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
