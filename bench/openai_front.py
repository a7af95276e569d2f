"""The OpenAI-compatible front measured (issue 54 item 6), written to reports/openai_front.json + .png.

    nice -n 10 .venv/bin/python bench/openai_front.py [--parts new_tools,plain,overhead] [--sizes 20 50 100 300]
        [--repeats 3] [--json reports/openai_front.json]

Starts compiler, engine and router as ``nexus up`` does (separate processes, the compiler's KV blocks on the host's
cores up to 4) on a fresh directory store with an empty registry, the front (``python -m services.openai``) and,
for the ``plain`` part, a plain llama.cpp OpenAI-compatible server on the same GGUF and the same threads
(``python -m llama_cpp.server --chat_format chatml-function-calling``: llama-cpp-python's tool-calling format for
ChatML models such as SmolLM2; every tool's schema goes into the system prompt). Three parts:

``new_tools`` -- an agent's first request carrying ``--new-tools`` (300) tools never seen before, timed with the
official ``openai`` client (tool_choice auto, non-streaming): ``first`` (the front registers them: key embedding,
signature and grammar on the request's path, the KV blocks queued for the compiler's background), ``again`` (the
same right after; blocks still compiling), ``again_blocks_ready`` (once the compiler's queue has drained: the chosen
tool spliced). Also once: ``RegisterTools`` of another fresh set *without* ``defer_kv_blocks``.

``plain`` -- the same request (a system prompt + one user turn, ``--sizes`` tools, tool_choice auto, temperature 0)
through the front and to the plain server, arms interleaved (the order flips every repeat), one request per repeat
(``REQUESTS``: each names one tool). The tools are registered with the front and their KV blocks compiled before
(the steady state of an agent that sends the same tools every turn). Per arm: the time to the first tool-call chunk
(streaming) and to the complete call (non-streaming), the tool chosen, the arguments' validity against its schema.
The plain server is measured *cold* (its prompt cache flushed by a one-token request first: another conversation or
another tool set ran before), *prefix-warm* (right after another request with the same tools: the system prompt and
the tools in llama.cpp's prompt cache, the user turn new, as an agent's next turn finds it) and *warm* (the same
request again at once: the whole prompt cached, only the generation left). Its chatml-function-calling handler
refuses to stream tool_choice auto (tried once, the error recorded): its first chunk is timed prefix-warm with
tool_choice naming the expected tool (the arguments cut at 16 tokens), which skips picking the name, so it is a
lower bound of what auto would take. Where its prompt overflows the model's context, the
server's own count of the prompt's tokens is recorded instead of a time.

``overhead`` -- the front's own cost: the same request (bytes prepared beforehand) through the front vs a direct
gRPC Route (allowed_tools = the request's tools) + Generate to the same cluster, ``--overhead-pairs`` pairs in
ABBA order per size. Reported as the p50 difference of the wall times (as the issue defines it) and, less noisy, the
p50 difference of what is left after the services' own route and generate times (``residual``).

Not a test: timings depend on the machine and its load (the host's load average is recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from services.common.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REPORTS = ROOT / "reports"
SYSTEM_PROMPT = "You are a helpful assistant. Call a function when one fits the request."
PARTS = ("new_tools", "plain", "overhead")
PART_KEYS = ("new_tools", "vs_plain_llama_cpp", "front_overhead")  # where each part's figures go in the report

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


# Requests for the ``plain`` and ``overhead`` parts: (verb, noun, text); each names the tool <ns>_<verb>_<noun>.
REQUESTS = (
    ("create", "invoice", "Create a new invoice called 'March consulting' in {Ns}"),
    ("assign", "ticket", "Assign ticket TCK-4821 in {Ns} to dana@example.com"),
    ("export", "payment", "Export the {Ns} payments since 2024-01-01 as a csv file"),
    ("delete", "meeting", "Delete the meeting MTG-77 from {Ns} permanently"),
    ("search", "document", "Search {Ns} for documents about the quarterly budget"),
    ("share", "playlist", "Share playlist PL-9 of {Ns} with sam@example.com"),
)


PRIMER = "What changed in {Ns} since yesterday?"  # the agent's previous turn, over the same tools (plain part)


def request_for(namespace: str, i: int = 0) -> tuple[str, str]:
    """The ``i``-th request (a user turn) and the tool it names among ``synthetic_tools(namespace=...)``."""
    verb, noun, text = REQUESTS[i % len(REQUESTS)]
    return text.format(Ns=namespace.capitalize()), f"{namespace}_{verb}_{noun}"


def tool_set(n: int, namespace: str, required: list[str]) -> list[dict]:
    """``synthetic_tools(n, namespace)`` with every ``required`` tool in it: a missing one takes the place of the
    last tools that are not required (the set stays ``n`` tools, all of the namespace)."""
    everything = {t["function"]["name"]: t for t in synthetic_tools(len(VERBS) * len(NOUNS), namespace)}
    tools = synthetic_tools(n, namespace)
    names = [t["function"]["name"] for t in tools]
    missing = [r for r in dict.fromkeys(required) if r not in names]
    if len(dict.fromkeys(required)) > n:
        raise ValueError(f"{len(required)} required tools do not fit in {n}")
    for j in range(len(tools) - 1, -1, -1):
        if not missing:
            break
        if names[j] not in required:
            tools[j] = everything[missing.pop()]
    return tools


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
        from cli.main import kv_pending

        pending = kv_pending(f"http://127.0.0.1:{self.metrics_port}/metrics")
        if pending is None:
            raise RuntimeError(f"the compiler's metrics on port {self.metrics_port} cannot be read")
        return pending

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


class PlainServer:
    """llama-cpp-python's OpenAI-compatible server (``llama_cpp.server``) on ``model``: the plain arm."""

    CHAT_FORMAT = "chatml-function-calling"

    def __init__(self, model: Path, log_dir: Path, n_ctx: int, n_threads: int):
        self.model, self.n_ctx, self.n_threads = model, n_ctx, n_threads
        self.port = free_port()
        self.log_path = log_dir / "llama_cpp_server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def settings(self) -> dict:
        import llama_cpp

        return {"server": "llama_cpp.server", "llama_cpp_python": llama_cpp.__version__,
                "chat_format": self.CHAT_FORMAT, "model": self.model.name, "n_ctx": self.n_ctx,
                "n_threads": self.n_threads, "n_threads_batch": self.n_threads}

    def start(self) -> None:
        from cli.main import wait_http_healthy

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child's for its lifetime
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--chat_format", self.CHAT_FORMAT,
             "--n_ctx", str(self.n_ctx), "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
             "--host", "127.0.0.1", "--port", str(self.port), "--verbose", "False"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_http_healthy(f"{self.base_url}/models", timeout_s=300, proc=self.proc)

    def last_error(self, wait_s: float = 5.0) -> str | None:
        """The last exception line of the server's log (what a dropped stream died of; the traceback may be logged
        a moment after the connection closed)."""
        deadline = time.monotonic() + wait_s
        while True:
            lines = [ln.strip(" |") for ln in self.log_path.read_text(errors="replace").splitlines()]
            errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", ln)]
            if errors or time.monotonic() > deadline:
                return errors[-1] if errors else None
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def p50(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 1) if xs else None


def check_arguments(tools: list[dict], name: str | None, arguments: str | None) -> bool:
    """Whether ``arguments`` (a call's JSON text) is a JSON object valid against tool ``name``'s schema."""
    import jsonschema

    schema = next((t["function"]["parameters"] for t in tools if t["function"]["name"] == name), None)
    if schema is None or arguments is None:
        return False
    try:
        args = json.loads(arguments)
        jsonschema.validate(args, schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return isinstance(args, dict)


CONTEXT_EXCEEDED = re.compile(r"\((\d+) in the messages")


def overflow_tokens(result: dict) -> int | None:
    """The prompt's token count when the server refused it for the model's context (llama_cpp.server's
    ``context_length_exceeded`` error), else None."""
    err = result.get("error") or {}
    if result.get("status") != 400 or err.get("code") != "context_length_exceeded":
        return None
    m = CONTEXT_EXCEEDED.search(err.get("message", ""))
    return int(m.group(1)) if m else None


def _error_of(r) -> dict:
    try:
        body = r.json()
    except ValueError:
        return {"message": r.text[:500]}
    return body.get("error", body) if isinstance(body, dict) else {"message": str(body)[:500]}


def complete(http, url: str, body: dict, tools: list[dict]) -> dict:
    """One non-streaming chat completion: wall time, the call (or the text) and whether its arguments are valid."""
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    try:
        r = http.post(url, content=data, headers={"content-type": "application/json"})
    except Exception as e:  # noqa: BLE001 - a server that drops the connection is a result too
        return {"ms": round((time.perf_counter() - t0) * 1e3, 1), "status": None,
                "error": {"message": f"{type(e).__name__}: {e}"}}
    ms = round((time.perf_counter() - t0) * 1e3, 1)
    if r.status_code != 200:
        return {"ms": ms, "status": r.status_code, "error": _error_of(r)}
    out = r.json()
    choice = out["choices"][0]
    msg = choice.get("message") or {}
    calls = msg.get("tool_calls") or []
    name = calls[0]["function"]["name"] if calls else None
    arguments = calls[0]["function"]["arguments"] if calls else None
    usage = out.get("usage") or {}
    res = {"ms": ms, "status": 200, "tool": name, "arguments": arguments, "calls": len(calls),
           "valid": check_arguments(tools, name, arguments), "finish_reason": choice.get("finish_reason"),
           "text": msg.get("content"), "prompt_tokens": usage.get("prompt_tokens"),
           "completion_tokens": usage.get("completion_tokens")}
    if "nexus" in out:
        info = out["nexus"]
        res["nexus"] = {k: info.get(k) for k in ("route_ms", "generate_ms", "prepare_ms", "register_ms",
                                                 "tools_registered", "prefill_path", "first_token_ms")}
        res["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return res


def stream(http, url: str, body: dict, tools: list[dict]) -> dict:
    """One streaming chat completion (server-sent events read as they arrive): the time to the first chunk that
    carries a tool call, to the end of the stream, and the call assembled from the chunks."""
    data = json.dumps({**body, "stream": True}).encode()
    first = name = finish = None
    done = False
    pieces: list[str] = []
    text: list[str] = []
    t0 = time.perf_counter()
    try:
        with http.stream("POST", url, content=data, headers={"content-type": "application/json"}) as r:
            if r.status_code != 200:
                r.read()
                return {"ms": round((time.perf_counter() - t0) * 1e3, 1), "status": r.status_code,
                        "error": _error_of(r)}
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    return {"ms": round((time.perf_counter() - t0) * 1e3, 1), "status": 200,
                            "error": chunk["error"]}
                for c in chunk.get("choices") or []:
                    delta = c.get("delta") or {}
                    for tc in delta.get("tool_calls") or []:
                        if first is None:
                            first = (time.perf_counter() - t0) * 1e3
                        fn = tc.get("function") or {}
                        name = name or fn.get("name")
                        if fn.get("arguments"):
                            pieces.append(fn["arguments"])
                    if delta.get("content"):
                        text.append(delta["content"])
                    finish = c.get("finish_reason") or finish
    except Exception as e:  # noqa: BLE001 - llama_cpp.server drops the connection on an unsupported stream
        return {"ms": round((time.perf_counter() - t0) * 1e3, 1), "status": None,
                "error": {"message": f"{type(e).__name__}: {e}"}}
    ms = round((time.perf_counter() - t0) * 1e3, 1)
    if not done:  # llama_cpp.server ends the response without [DONE] when its handler raises mid-stream
        return {"ms": ms, "status": 200, "error": {"message": "the stream ended without data: [DONE] after "
                                                              f"{len(pieces) + len(text)} pieces"}}
    arguments = "".join(pieces) if name else None
    return {"first_chunk_ms": None if first is None else round(first, 1),
            "ms": ms, "status": 200, "tool": name, "arguments": arguments, "valid": check_arguments(tools, name, arguments), "finish_reason": finish,
            "text": "".join(text) or None}


def messages_for(query: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": query}]


def front_arm(http, url: str, tools: list[dict], query: str) -> dict:
    body = {"model": "nexus", "messages": messages_for(query), "tools": tools, "tool_choice": "auto",
            "temperature": 0}
    return {"stream": stream(http, url, body, tools), "complete": complete(http, url, body, tools)}


def flush_plain(http, url: str) -> None:
    """A one-token request of another conversation: llama.cpp's prompt cache then holds it, not the tools."""
    r = http.post(url, json={"model": "plain", "messages": [{"role": "user", "content": "ok"}], "max_tokens": 1,
                             "temperature": 0})
    r.raise_for_status()


def plain_arm(http, url: str, tools: list[dict], query: str, expected: str, prime: str) -> dict:
    """cold (prompt cache flushed), warm (the same request again at once: only the generation left), prefix-warm
    (after another request ``prime`` with the same tools: the system prompt and tools cached, the user turn new, as
    an agent's next turn finds it), and the first chunk of the prompt streamed with tool_choice naming ``expected``
    (prefix-warm too; auto cannot stream there)."""
    body = {"model": "plain", "messages": messages_for(query), "tools": tools, "tool_choice": "auto",
            "temperature": 0}
    primer = {**body, "messages": messages_for(prime), "max_tokens": 1}
    flush_plain(http, url)
    cold = complete(http, url, body, tools)
    tokens = overflow_tokens(cold)
    if tokens is not None:
        return {"overflow": True, "prompt_tokens": tokens, "error": cold["error"].get("message")}
    warm = complete(http, url, body, tools)
    complete(http, url, primer, tools)
    prefix = complete(http, url, body, tools)
    complete(http, url, primer, tools)
    # only its first chunk is timed: its arguments are cut at 16 tokens
    named = stream(http, url, {**body, "tool_choice": {"type": "function", "function": {"name": expected}},
                               "max_tokens": 16}, tools)
    return {"overflow": False, "complete_cold": cold, "complete_warm": warm, "complete_prefix": prefix,
            "stream_named_prefix": named}


def direct_call(nc, tools: list[dict], query: str) -> dict:
    """Route (among the request's tools) + Generate over gRPC, as the front does, without the front."""
    names = [t["function"]["name"] for t in tools]
    t0 = time.perf_counter()
    route = nc.route(query, top_k=1, allowed_tools=names)
    gen = nc.generate(query, route.tool)
    ms = (time.perf_counter() - t0) * 1e3
    return {"ms": round(ms, 2), "tool": route.tool, "route_ms": round(route.route_ms, 3),
            "generate_ms": round(gen.total_ms, 2), "residual_ms": round(ms - route.route_ms - gen.total_ms, 2)}


def front_call(http, url: str, data: bytes) -> dict:
    t0 = time.perf_counter()
    r = http.post(url, content=data, headers={"content-type": "application/json"})
    ms = (time.perf_counter() - t0) * 1e3
    r.raise_for_status()
    out = r.json()
    info = out["nexus"]
    return {"ms": round(ms, 2), "tool": out["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
            "route_ms": info["route_ms"], "generate_ms": info["generate_ms"],
            "residual_ms": round(ms - info["route_ms"] - info["generate_ms"], 2)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def summarize_plain(runs: list[dict], n_ctx: int) -> dict:
    """Per tool count (``str(size)``): both arms' p50 times, right tools and valid arguments, the plain arm's
    overflow with its prompt's token count, the speed-ups and the issue's goals at that size."""
    out: dict[str, dict] = {}
    for size in sorted({r["size"] for r in runs}):
        rs = [r for r in runs if r["size"] == size]
        front_c = [r["front"]["complete"] for r in rs]
        front_s = [r["front"]["stream"] for r in rs]
        front = {"first_chunk_ms": p50([s.get("first_chunk_ms") for s in front_s]),
                 "complete_ms": p50([c["ms"] for c in front_c if c.get("status") == 200]),
                 "right_tool": sum(c.get("tool") == r["expected"] for c, r in zip(front_c, rs, strict=True)),
                 "valid_arguments": sum(bool(c.get("valid")) for c in front_c),
                 "stream_right_tool": sum(s.get("tool") == r["expected"] for s, r in zip(front_s, rs, strict=True)),
                 "prompt_tokens": p50([c.get("prompt_tokens") for c in front_c]),
                 "prefill_paths": sorted({(c.get("nexus") or {}).get("prefill_path") or "?" for c in front_c})}
        fits = [r["plain"] for r in rs if not r["plain"]["overflow"]]
        over = [r["plain"] for r in rs if r["plain"]["overflow"]]
        plain: dict = {"n_ctx": n_ctx, "overflow": len(over), "requests": len(rs)}
        if over:
            plain["overflow_prompt_tokens"] = p50([p["prompt_tokens"] for p in over])
        if fits:
            cold = [p["complete_cold"] for p in fits]
            warm = [p["complete_warm"] for p in fits]
            prefix = [p["complete_prefix"] for p in fits]
            named = [p["stream_named_prefix"] for p in fits]
            expected = [r["expected"] for r in rs if not r["plain"]["overflow"]]
            plain.update({
                "complete_ms_cold": p50([c["ms"] for c in cold if c.get("status") == 200]),
                "complete_ms_warm": p50([c["ms"] for c in warm if c.get("status") == 200]),
                "complete_ms_prefix_warm": p50([c["ms"] for c in prefix if c.get("status") == 200]),
                "right_tool_prefix_warm": sum(c.get("tool") == e for c, e in zip(prefix, expected, strict=True)),
                "first_chunk_ms_lower_bound": p50([s.get("first_chunk_ms") for s in named]),
                "right_tool": sum(c.get("tool") == e for c, e in zip(cold, expected, strict=True)),
                "valid_arguments": sum(bool(c.get("valid")) for c in cold),
                "answered_text": sum(c.get("status") == 200 and not c.get("tool") for c in cold),
                "errors": sum(c.get("status") != 200 for c in cold),
                "prompt_tokens": p50([c.get("prompt_tokens") for c in cold])})
        row = {"tools": size, "requests": len(rs), "front": front, "plain": plain}
        if fits:
            row["speedup_complete_cold"] = _ratio(plain["complete_ms_cold"], front["complete_ms"])
            row["speedup_complete_warm"] = _ratio(plain["complete_ms_warm"], front["complete_ms"])
            row["speedup_complete_prefix_warm"] = _ratio(plain["complete_ms_prefix_warm"], front["complete_ms"])
            row["speedup_first_chunk_vs_lower_bound"] = _ratio(plain["first_chunk_ms_lower_bound"],
                                                               front["first_chunk_ms"])
        # the issue's goals at this size: the right tool at least as often where the plain prompt fits (where it
        # overflows the plain server makes no call at all), a complete call >= 3x sooner from 50 tools on
        row["goal_right_tool"] = front["right_tool"] >= plain.get("right_tool", 0)
        if size >= 50:
            row["goal_3x_cold"] = (row.get("speedup_complete_cold") or 0) >= 3 if fits else True
            row["goal_3x_warm"] = (row.get("speedup_complete_warm") or 0) >= 3 if fits else True
            row["goal_3x_prefix_warm"] = (row.get("speedup_complete_prefix_warm") or 0) >= 3 if fits else True
        out[str(size)] = row
    return out


def summarize_overhead(pairs: list[dict]) -> dict:
    """Per tool count: p50 wall time through the front and direct, their difference, and the same for the residual
    (wall time less the services' own route and generate times: what the generation's noise does not reach)."""
    out: dict[str, dict] = {}
    for size in sorted({p["size"] for p in pairs}):
        ps = [p for p in pairs if p["size"] == size]
        fw, dw = p50([p["front"]["ms"] for p in ps]), p50([p["direct"]["ms"] for p in ps])
        fr, dr = p50([p["front"]["residual_ms"] for p in ps]), p50([p["direct"]["residual_ms"] for p in ps])
        out[str(size)] = {
            "tools": size, "pairs": len(ps), "front_ms": fw, "direct_ms": dw,
            "overhead_ms": round(fw - dw, 1),
            "paired_overhead_ms": p50([p["front"]["ms"] - p["direct"]["ms"] for p in ps]),
            "front_residual_ms": fr, "direct_residual_ms": dr, "residual_overhead_ms": round(fr - dr, 2),
            "same_tool": sum(p["front"]["tool"] == p["direct"]["tool"] for p in ps)}
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (ax_c, ax_f), (ax_n, ax_o) = axes
    vs = report.get("vs_plain_llama_cpp")
    if vs:
        rows = list(vs["sizes"].values())
        x = list(range(len(rows)))
        labels = [str(r["tools"]) for r in rows]
        for ax, series, title in (
                (ax_c, [("front", lambda r: r["front"]["complete_ms"], "#3b7dd8"),
                        ("plain, cold prompt", lambda r: r["plain"].get("complete_ms_cold"), "#c0504d"),
                        ("plain, tools cached (new turn)", lambda r: r["plain"].get("complete_ms_prefix_warm"),
                         "#d9777a"),
                        ("plain, whole prompt cached", lambda r: r["plain"].get("complete_ms_warm"), "#e8a09e")],
                 "complete tool call (non-streaming, tool_choice auto)"),
                (ax_f, [("front", lambda r: r["front"]["first_chunk_ms"], "#3b7dd8"),
                        ("plain, tools cached (lower bound: tool named)", lambda r: r["plain"].get("first_chunk_ms_lower_bound"),
                         "#c0504d")],
                 "first tool-call chunk (streaming)")):
            w = 0.8 / len(series)
            for k, (name, get, color) in enumerate(series):
                xs = [i + (k - (len(series) - 1) / 2) * w for i in x]
                vals = [get(r) for r in rows]
                ax.bar([xi for xi, v in zip(xs, vals, strict=True) if v is not None],
                       [v / 1e3 for v in vals if v is not None], w, label=name, color=color)
            for i, r in zip(x, rows, strict=True):
                if r["plain"].get("overflow"):
                    ax.text(i - 0.05, 0.5, f"plain: prompt of\n{r['plain']['overflow_prompt_tokens']:.0f} tokens\n"
                                           f"> its context\n({r['plain']['n_ctx']})", fontsize=8, color="#c0504d",
                            transform=ax.get_xaxis_transform(), va="center")
                right = f"right tool {r['front']['right_tool']}/{r['requests']}"
                if "right_tool" in r["plain"]:
                    right += f" vs {r['plain']['right_tool']}/{r['requests']}"
                ax.text(i, 1.01, right, ha="center", fontsize=7, transform=ax.get_xaxis_transform())
            ax.set_yscale("log")
            ax.set_xlim(-0.6, len(rows) - 0.4)
            ax.set_xticks(x, labels)
            ax.set_xlabel("tools in the request")
            ax.set_ylabel("seconds, p50")
            ax.set_title(title, pad=16)
            ax.legend(fontsize=8, loc="upper left")
    else:
        for ax in (ax_c, ax_f):
            ax.text(0.5, 0.5, "plain llama.cpp arm not run", ha="center", transform=ax.transAxes)
    nt = report.get("new_tools")
    if nt:
        n = nt["tools"]
        bars = [(f"first request\n({n} new tools)", nt["p50_ms"]["first"]),
                ("same again\n(blocks compiling)", nt["p50_ms"]["again"]),
                ("same again\n(blocks ready)", nt["p50_ms"]["again_blocks_ready"])]
        if nt.get("register_without_defer_ms") is not None:
            bars.append((f"RegisterTools of {n}\nwithout deferral", nt["register_without_defer_ms"]))
        labels, vals = zip(*bars, strict=True)
        hb = ax_n.barh(labels, [v / 1e3 for v in vals], color=["#3b7dd8", "#62a36b", "#62a36b", "#c0504d"][:len(bars)])
        for b, v in zip(hb, vals, strict=True):
            ax_n.text(b.get_width(), b.get_y() + b.get_height() / 2, f" {v / 1e3:.1f} s", va="center", fontsize=8)
        ax_n.invert_yaxis()
        ax_n.set_xlim(0, max(vals) / 1e3 * 1.3)
        ax_n.set_xlabel(f"seconds, p50 over {nt['repeats']} (the last bar: the registration alone)")
        ax_n.set_title(f"an agent's first request with {n} new tools, through the front")
    else:
        ax_n.text(0.5, 0.5, "new-tools part not run", ha="center", transform=ax_n.transAxes)
    ov = report.get("front_overhead")
    if ov:
        rows = list(ov["sizes"].values())
        x = list(range(len(rows)))
        ax_o.bar([i - 0.2 for i in x], [r["overhead_ms"] for r in rows], 0.4, color="#9bb7e0",
                 label="p50 wall time, front - direct")
        ax_o.bar([i + 0.2 for i in x], [r["residual_overhead_ms"] for r in rows], 0.4, color="#3b7dd8",
                 label="p50 residual (less route + generate), front - direct")
        ax_o.axhline(3, color="#c0504d", ls="--", lw=1, label="goal: 3 ms")
        ax_o.axhline(0, color="black", lw=0.5)
        ax_o.set_xticks(x, [str(r["tools"]) for r in rows])
        ax_o.set_xlabel(f"tools in the request ({rows[0]['pairs']} pairs each)")
        ax_o.set_ylabel("ms")
        ax_o.set_title("the front's own overhead over a direct gRPC Route + Generate")
        ax_o.legend(fontsize=8)
    else:
        ax_o.text(0.5, 0.5, "overhead part not run", ha="center", transform=ax_o.transAxes)
    host = report.get("host", {})
    fig.suptitle(f"OpenAI-compatible front, {report['model']['gguf']} ({host.get('cpus')} CPUs, shared; load "
                 f"{host.get('load_avg_at_start', ['?'])[0]} at start)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def call(client, tools: list[dict], query: str) -> dict:
    """One complete tool call through the front with the ``openai`` client: wall time, and what the front reports."""
    t0 = time.perf_counter()
    r = client.chat.completions.create(model="nexus", messages=[{"role": "user", "content": query}], tools=tools)
    ms = (time.perf_counter() - t0) * 1e3
    choice = r.choices[0]
    (tc,) = choice.message.tool_calls
    info = r.model_extra.get("nexus", {})
    return {"ms": round(ms, 1), "tool": tc.function.name, "arguments": json.loads(tc.function.arguments),
            "valid": check_arguments(tools, tc.function.name, tc.function.arguments),
            "finish_reason": choice.finish_reason, "tools_registered": info.get("tools_registered"),
            "register_ms": info.get("register_ms"), "route_ms": info.get("route_ms"),
            "prepare_ms": info.get("prepare_ms"), "generate_ms": info.get("generate_ms"),
            "prefill_path": info.get("prefill_path"), "prompt_tokens": r.usage.prompt_tokens}


def run_new_tools(stack: Stack, client, n: int, repeats: int, undeferred: bool) -> dict:
    """The ``new_tools`` part (see the module's docstring)."""
    from nexus_client import NexusClient

    runs = []
    for r in range(repeats):
        ns = NAMESPACES[r]
        query, expected = request_for(ns)
        tools = tool_set(n, ns, [expected])
        first = call(client, tools, query)
        again = call(client, tools, query)
        drain_s = stack.wait_blocks()
        ready = call(client, tools, query)
        runs.append({"namespace": ns, "expected_tool": expected, "first": first, "again": again,
                     "again_blocks_ready": ready, "blocks_drained_after_s": round(drain_s, 1)})
        print(f"[new tools {r + 1}/{repeats}] first {first['ms']:.0f} ms (registered {first['tools_registered']}), "
              f"again {again['ms']:.0f} ms, blocks drained after {drain_s:.1f} s, then "
              f"{ready['ms']:.0f} ms ({ready['prefill_path']}); tool {first['tool']}", flush=True)
    undeferred_ms = None
    if undeferred:
        ns = NAMESPACES[repeats]
        raw = [json.dumps({"name": t["function"]["name"], "description": t["function"]["description"],
                           "inputSchema": t["function"]["parameters"]}) for t in synthetic_tools(n, ns)]
        with NexusClient(router=stack.addr("router"), engine=stack.addr("engine"), timeout_s=3600) as nc:
            t0 = time.perf_counter()
            nc.register(raw, timeout_s=3600)
            undeferred_ms = round((time.perf_counter() - t0) * 1e3, 1)
        print(f"RegisterTools of {n} without deferral: {undeferred_ms / 1e3:.1f} s", flush=True)
        stack.wait_blocks()
    return {
        "what": f"one complete tool call (openai client, tool_choice auto) carrying {n} tools never seen before, "
                "then the same again, through the front over a fresh `nexus up`-like cluster (empty registry)",
        "tools": n, "repeats": repeats,
        "p50_ms": {k: p50([r[k]["ms"] for r in runs]) for k in ("first", "again", "again_blocks_ready")},
        "p50_register_ms_first": p50([r["first"]["register_ms"] for r in runs]),
        "p50_blocks_drained_after_s": p50([r["blocks_drained_after_s"] for r in runs]),
        "register_without_defer_ms": undeferred_ms,
        "second_request_registered": [r["again"]["tools_registered"] for r in runs],
        "right_tool": sum(r["first"]["tool"] == r["expected_tool"] for r in runs),
        "valid_arguments": sum(r["first"]["valid"] and r["again"]["valid"] for r in runs),
        "runs": runs,
    }


PLAIN_NAMESPACE = "contoso"  # not in NAMESPACES: the plain and overhead parts' tools are their own


def run_plain(stack: Stack, plain: PlainServer, http, sizes: list[int], repeats: int) -> dict:
    """The ``plain`` part (see the module's docstring)."""
    ns = PLAIN_NAMESPACE
    requests = [request_for(ns, i) for i in range(repeats)]
    expected = [e for _, e in requests]
    sets = {n: tool_set(n, ns, expected) for n in sizes}
    front_url = f"http://{stack.addr('openai')}/v1/chat/completions"
    plain_url = f"{plain.base_url}/chat/completions"
    # every size's tools registered through the front (one request), their KV blocks compiled: the steady state
    union = list({t["function"]["name"]: t for n in sizes for t in sets[n]}.values())
    reg = complete(http, front_url, {"model": "nexus", "messages": messages_for(requests[0][0]), "tools": union},
                   union)
    drain_s = stack.wait_blocks()
    print(f"[plain] registered {len(union)} tools through the front in {reg['ms'] / 1e3:.1f} s, blocks compiled "
          f"{drain_s:.0f} s later", flush=True)
    flush_plain(http, plain_url)  # the plain server's first decode
    # llama-cpp-python's chatml-function-calling cannot stream tool_choice auto: what the server answers, once
    small = sets[min(sizes)]
    auto_stream = stream(http, plain_url, {"model": "plain", "messages": messages_for(requests[0][0]),
                                           "tools": small, "tool_choice": "auto", "temperature": 0}, small)
    if auto_stream.get("error"):
        auto_stream["error"]["server_log"] = plain.last_error()
    print(f"[plain] streaming tool_choice auto on the plain server: {auto_stream.get('error') or 'streamed'}",
          flush=True)
    runs = []
    for r, (query, exp) in enumerate(requests):
        for size in sizes:
            tools = sets[size]
            order = ("front", "plain") if (r + sizes.index(size)) % 2 == 0 else ("plain", "front")
            rec: dict = {"size": size, "repeat": r, "request": query, "expected": exp, "order": "/".join(order)}
            for arm in order:
                rec[arm] = (front_arm(http, front_url, tools, query) if arm == "front" else
                            plain_arm(http, plain_url, tools, query, exp, PRIMER.format(Ns=ns.capitalize())))
            runs.append(rec)
            f, p = rec["front"], rec["plain"]
            ptxt = (f"overflow ({p['prompt_tokens']} tokens > {plain.n_ctx})" if p["overflow"] else
                    f"cold {p['complete_cold']['ms'] / 1e3:.1f} s, warm {p['complete_warm']['ms'] / 1e3:.1f} s, "
                    f"prefix-warm {p['complete_prefix']['ms'] / 1e3:.1f} s, "
                    f"first chunk >= {(p['stream_named_prefix'].get('first_chunk_ms') or 0) / 1e3:.1f} s, "
                    f"tool {p['complete_cold'].get('tool')}")
            print(f"[plain {r + 1}/{repeats}] {size} tools: front first chunk "
                  f"{(f['stream'].get('first_chunk_ms') or 0) / 1e3:.2f} s, complete {f['complete']['ms'] / 1e3:.2f} s, "
                  f"tool {f['complete'].get('tool')}; plain {ptxt} (expected {exp})", flush=True)
    return {
        "what": "the same request (system prompt + one user turn, tool_choice auto, temperature 0) through the front "
                "and to a plain llama.cpp OpenAI-compatible server on the same GGUF, threads and machine, with all its "
                "tools in the prompt; arms interleaved",
        "server": plain.settings(), "namespace": ns, "requests": [q for q, _ in requests],
        "registered_through_front_ms": reg["ms"], "blocks_compiled_after_s": round(drain_s, 1),
        "plain_stream_auto": {"supported": not auto_stream.get("error"), "answer": auto_stream.get("error")},
        "sizes": summarize_plain(runs, plain.n_ctx), "runs": runs,
    }


def run_overhead(stack: Stack, http, sizes: list[int], pairs: int) -> dict:
    """The ``overhead`` part (see the module's docstring). Uses the plain part's tools (registered if not yet)."""
    from nexus_client import NexusClient

    ns = PLAIN_NAMESPACE
    query, exp = request_for(ns, 0)
    url = f"http://{stack.addr('openai')}/v1/chat/completions"
    out = []
    with NexusClient(router=stack.addr("router"), engine=stack.addr("engine"), timeout_s=600) as nc:
        for size in sizes:
            tools = tool_set(size, ns, [exp])
            data = json.dumps({"model": "nexus", "messages": messages_for(query), "tools": tools,
                               "tool_choice": "auto", "temperature": 0}).encode()
            front_call(http, url, data)  # registers them if the plain part did not run; warms the path
            stack.wait_blocks()
            direct_call(nc, tools, query)
            for i in range(pairs):
                if i % 4 in (0, 3):  # ABBA
                    f = front_call(http, url, data)
                    d = direct_call(nc, tools, query)
                else:
                    d = direct_call(nc, tools, query)
                    f = front_call(http, url, data)
                out.append({"size": size, "front": f, "direct": d})
            s = summarize_overhead([p for p in out if p["size"] == size])[str(size)]
            print(f"[overhead] {size} tools: front {s['front_ms']:.1f} ms, direct {s['direct_ms']:.1f} ms "
                  f"(p50 difference {s['overhead_ms']:.1f} ms), residual {s['front_residual_ms']:.1f} vs "
                  f"{s['direct_residual_ms']:.1f} ms ({s['residual_overhead_ms']:+.1f} ms)", flush=True)
    return {"what": "the same request through the front (HTTP, JSON, the request's tools checked and looked up) vs a "
                    "direct gRPC Route (allowed_tools = the request's tools) + Generate to the same cluster, ABBA "
                    "pairs; residual = wall time less the services' own route_ms and generate total_ms",
            "request": query, "sizes": summarize_overhead(out), "pairs": out}


def model_info(path: Path) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    arch = llm.metadata.get("general.architecture", "llama")
    n_ctx_train = int(llm.metadata.get(f"{arch}.context_length", 2048))
    llm.close()
    return {"gguf": path.name, "bytes": path.stat().st_size, "n_ctx_train": n_ctx_train}


def host_info(load_at_start: tuple[float, ...]) -> dict:
    return {"cpus": os.cpu_count(), "load_avg_at_start": [round(x, 2) for x in load_at_start],
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
            "machine": platform.machine()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--sizes", type=int, nargs="+", default=[20, 50, 100, 300])
    p.add_argument("--repeats", type=int, default=3, help="requests per size (plain part) and first requests "
                                                          "(new_tools part)")
    p.add_argument("--new-tools", type=int, default=300)
    p.add_argument("--overhead-pairs", type=int, default=8)
    p.add_argument("--plain-ctx", type=int, default=0, help="the plain server's context (0: the model's own)")
    p.add_argument("--kv-threads", type=int, default=min(os.cpu_count() or 1, 4),
                   help="the compiler's llama.cpp threads for KV blocks (default: as `nexus up`)")
    p.add_argument("--skip-undeferred", action="store_true", help="do not time RegisterTools without deferral")
    p.add_argument("--model", default="",
                   help="the GGUF every arm serves: a models/gguf.json entry, smollm2-135m or a path (default: the "
                        "engine's default model)")
    p.add_argument("--json", default=str(REPORTS / "openai_front.json"))
    p.add_argument("--update", action="store_true",
                   help="keep the parts of the existing --json this run does not measure (each part records when "
                        "it ran and the host's load)")
    a = p.parse_args(argv)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    if unknown := set(parts) - set(PARTS):
        p.error(f"unknown parts {sorted(unknown)}")
    if a.repeats + 1 > len(NAMESPACES):
        p.error(f"at most {len(NAMESPACES) - 1} repeats")
    if a.repeats > len(REQUESTS):
        p.error(f"at most {len(REQUESTS)} repeats")

    import httpx2 as httpx
    import openai

    from services.common.models import resolve_gguf
    from services.engine.config import EngineConfig

    load0 = os.getloadavg()
    if a.model:  # the stack's processes and this one resolve the same default
        os.environ["NEXUS_DEFAULT_MODEL"] = a.model
    model = resolve_gguf(EngineConfig().model_path)
    minfo = model_info(model)
    tmp = Path(tempfile.mkdtemp(prefix="openai-front-bench-"))
    stack = Stack(tmp / "store", tmp / "log", a.kv_threads)
    plain = PlainServer(model, tmp / "log", a.plain_ctx or minfo["n_ctx_train"], EngineConfig().n_threads)
    report: dict = {"what": "the OpenAI-compatible front: new tools, vs a plain llama.cpp server, its own overhead",
                    "model": minfo, "engine_threads": EngineConfig().n_threads, "kv_threads": a.kv_threads}
    t_start = time.perf_counter()
    try:
        stack.start()
        if "plain" in parts:
            plain.start()
        base = f"http://{stack.addr('openai')}/v1"
        with openai.OpenAI(base_url=base, api_key="-", max_retries=0, timeout=1800) as client, \
                httpx.Client(timeout=1800) as http:
            call(client, synthetic_tools(1, "warmup"), "warm up")  # the engine and the front's path, once
            stack.wait_blocks()
            if "new_tools" in parts:
                t0 = time.perf_counter()
                report["new_tools"] = run_new_tools(stack, client, a.new_tools, a.repeats, not a.skip_undeferred)
                report["new_tools"]["elapsed_s"] = round(time.perf_counter() - t0, 1)
            if "plain" in parts:
                t0 = time.perf_counter()
                report["vs_plain_llama_cpp"] = run_plain(stack, plain, http, a.sizes, a.repeats)
                report["vs_plain_llama_cpp"]["elapsed_s"] = round(time.perf_counter() - t0, 1)
            if "overhead" in parts:
                t0 = time.perf_counter()
                report["front_overhead"] = run_overhead(stack, http, a.sizes, a.overhead_pairs)
                report["front_overhead"]["elapsed_s"] = round(time.perf_counter() - t0, 1)
    finally:
        plain.stop()
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    report["host"] = host_info(load0)
    for part in ("new_tools", "vs_plain_llama_cpp", "front_overhead"):
        if part in report:
            report[part]["measured"] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                        "host": report["host"]}
    out = Path(a.json)
    if a.update and out.is_file():  # the parts not run now stay as their own run measured them
        old = json.loads(out.read_text())
        kept = {k: old[k] for k in PART_KEYS if k in old and k not in report}
        for v in kept.values():
            v.setdefault("measured", {"at": "an earlier run", "host": old.get("host")})
        report = {**kept, **report}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} ({report['elapsed_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
