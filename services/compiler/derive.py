"""Derived requests: what a tool is asked for, written by an instruct LLM from the tool alone.

A tool registered a minute ago has no hand-written request. Routing keys it by its text key only, and a dense
embedding of a description is a weak match for how people ask (reports/routing_unseen.json). So the compiler
derives, from the tool's name, description and parameters and nothing else, a handful of requests a user might send
for it (the doc2query / Re-Invoke idea), and the router uses their embeddings as the tool's exemplar keys, as it
uses the hand-written requests of the tools it was trained on.

The requests are a content-addressed artifact: ``derived-<generator fingerprint>-<schema hash>``, a JSON document
``{"tool", "requests": [...], "generator": {...}}``. The fingerprint covers the GGUF's bytes, the prompt and the
sampling settings, so a tool re-registered with another description, or a generator changed in any way, gets new
requests; two tools that share a name never share them.

Generation is deterministic for a generator (greedy for the first request, then seeded sampling) and runs off the
request path: the compiler's ``DeriveWorker`` takes tools from a queue, one at a time, and a tool is routable on
its text key until its requests are in the store.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from services.common.tools import Tool

log = logging.getLogger("nexus.compiler")

KIND_DERIVED = "derived"
PROMPT_VERSION = "derive-v3"  # v3: a long tool is shortened to fit, never cut at its end

SYSTEM = ("You write realistic requests that people type to an AI assistant. You reply with a numbered list and "
          "nothing else.")
USER = """The assistant has this tool:

name: {name}
description: {description}
parameters:
{parameters}

Write {n} short requests (at most 20 words each) that a user could send and that this tool answers. Each one
different: a question, a command, a terse note, one with some context. Use concrete values (names, paths, ids,
numbers, quoted text). Never mention the tool's name. One request per line, numbered."""

_NUMBERED = re.compile(r"^\s*(?:\d+[.):]|[-*•])\s*(.+?)\s*$")


@dataclass(frozen=True)
class DeriveSettings:
    """What a generator's requests depend on besides the model (all in its fingerprint)."""

    n: int = 5                      # requests asked for per tool
    max_tokens: int = 200           # the reply's budget
    temperature: float = 0.8
    top_p: float = 0.9
    seed: int = 0
    max_description_chars: int = 600
    max_parameters: int = 12


def parameters_text(tool: Tool, max_parameters: int = 12) -> str:
    """One line per parameter: ``- name (type, required): description`` (the first ``max_parameters``)."""
    schema = tool.input_schema or {}
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    rows = []
    for name, spec in list(props.items())[:max_parameters]:
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type", "any")
        if isinstance(kind, list):
            kind = "|".join(str(k) for k in kind)
        if "enum" in spec:
            kind = f"one of {', '.join(json.dumps(v) for v in spec['enum'][:8])}"
        flags = ", required" if name in required else ""
        desc = re.sub(r"\s+", " ", str(spec.get("description", ""))).strip()[:160]
        rows.append(f"- {name} ({kind}{flags})" + (f": {desc}" if desc else ""))
    return "\n".join(rows) if rows else "(none)"


# One worked example, of a made-up tool of no registered server: a small instruct model copies the shape of an
# answer far better than it follows a description of one (without it, Qwen2.5-Coder-0.5B wrote questions *about*
# the tool: "What is the purpose of git diff?").
EXAMPLE_TOOL = Tool("invoice_send", "Email an invoice PDF to a customer, with an optional note.", {
    "type": "object", "required": ["invoice_id", "email"],
    "properties": {"invoice_id": {"type": "string", "description": "Invoice number"},
                   "email": {"type": "string", "description": "Recipient address"},
                   "note": {"type": "string", "description": "Message shown above the invoice"}}})
EXAMPLE_REPLY = """1. Send invoice INV-2291 to maria.lopez@brightpath.io
2. can you email the invoice 0457 to accounts@northwind.com and say thanks for the quick payment
3. INV-88 -> j.chen@orbit.dev
4. Our client still hasn't received their bill. Please mail invoice 3012 to billing@acme.co again.
5. email invoice A-17 to tom@bakery.fr with the note 'due by Friday'"""


def _user(tool: Tool, settings: DeriveSettings) -> str:
    desc = re.sub(r"\s+", " ", tool.description or "").strip()[: settings.max_description_chars] or "(none)"
    return USER.format(name=tool.name, description=desc, parameters=parameters_text(tool, settings.max_parameters),
                       n=settings.n)


def messages(tool: Tool, settings: DeriveSettings = DeriveSettings()) -> list[dict[str, str]]:
    """The chat the generator answers for ``tool``: the instruction, one worked example, then the tool."""
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": _user(EXAMPLE_TOOL, replace(settings, n=5))},
            {"role": "assistant", "content": EXAMPLE_REPLY},
            {"role": "user", "content": _user(tool, settings)}]


def parse_requests(reply: str, tool: Tool, n: int) -> list[str]:
    """The requests of a numbered (or bulleted) reply: unquoted, de-duplicated, at most ``n``; lines that are not
    list items, too short to be a request, or that name the tool are dropped."""
    out: list[str] = []
    seen: set[str] = set()
    for line in reply.splitlines():
        m = _NUMBERED.match(line)
        if not m:
            continue
        text = _unquote(m.group(1).strip())
        text = re.sub(r"^\*\*[^*]*\*\*:?\s*", "", text)  # a bold "**Question:**" lead-in
        text = _unname(text, tool.name)
        if len(text.split()) < 3:
            continue
        key = text.lower()
        if key in seen:
            continue
        seen.add(key)
        out.append(text)
        if len(out) >= n:
            break
    return out


def _unquote(text: str) -> str:
    """``text`` without one pair of quotes around the whole of it; a quote that closes a value inside the request
    (``Echo "hi"``) stays."""
    for left, right in (('"', '"'), ("“", "”")):
        if len(text) > 1 and text[0] == left and text[-1] == right:
            return text[1:-1].strip()
    return text


def _unname(text: str, name: str) -> str:
    """``text`` without the tool's name: "use the `get_time` tool to get ..." -> "get ...", any other mention of
    the name -> its words (a user does not know a tool's identifier; the model names it despite being asked not
    to)."""
    n = re.escape(name)
    text = re.sub(rf"(?i)\b(?:can i |how (?:can|do) i |please )?(?:use|using|call|calling|with|via|run)\s+(?:the\s+)?"
                  rf"[`'\"]?{n}[`'\"]?(?:\s+(?:tool|function|command))?\s*(?:to\s+)?", "", text)
    text = re.sub(rf"(?i)(?:the\s+)?[`'\"]?{n}[`'\"]?(?:\s+(?:tool|function))?", name.replace("_", " "), text)
    text = re.sub(r"\s+", " ", text).strip(" ,")
    return text[:1].upper() + text[1:] if text else text


def generator_fingerprint(model_sha256: str, settings: DeriveSettings = DeriveSettings()) -> str:
    """The generator's identity: the model's bytes, the prompt and the settings."""
    h = hashlib.sha256()
    h.update(model_sha256.encode())
    h.update(PROMPT_VERSION.encode())
    h.update(SYSTEM.encode())
    h.update(USER.encode())
    h.update(EXAMPLE_TOOL.canonical_json().encode())
    h.update(EXAMPLE_REPLY.encode())
    h.update(json.dumps(asdict(settings), sort_keys=True).encode())
    return h.hexdigest()


def default_fingerprint() -> str:
    """The fingerprint of the default generator (the pinned GGUF of models/gguf.json, default settings): what a
    router looks derived requests up by unless configured otherwise, without loading any model."""
    from services.common.models import GENERATOR_MODEL, gguf_manifest

    return generator_fingerprint(gguf_manifest()[GENERATOR_MODEL]["sha256"])


def derived_key(tool: Tool, fingerprint: str) -> str:
    from services.common.store import artifact_key

    return artifact_key(KIND_DERIVED, fingerprint, tool.schema_hash)


def encode_derived(tool: Tool, requests: Sequence[str], generator: dict[str, Any]) -> bytes:
    return json.dumps({"tool": tool.name, "schema_hash": tool.schema_hash, "requests": list(requests),
                       "generator": generator}, sort_keys=True).encode()


def decode_derived(data: bytes) -> list[str]:
    """The requests of a ``derived`` artifact (``ValueError`` when it is not one)."""
    doc = json.loads(data)
    reqs = doc.get("requests") if isinstance(doc, dict) else None
    if not isinstance(reqs, list) or not all(isinstance(r, str) for r in reqs):
        raise ValueError("not a derived-requests artifact")
    return reqs


def sample(logits: np.ndarray, rng: np.random.Generator, temperature: float, top_p: float, top_k: int = 64) -> int:
    """One token from ``logits``: greedy at temperature 0, else nucleus sampling (``top_p``) within the ``top_k``
    most likely (the mass beyond them is negligible at top_p < 1, and a partition is ~50x cheaper than sorting a
    151k-token vocabulary)."""
    if temperature <= 0:
        return int(np.argmax(logits))
    k = min(top_k, len(logits))
    idx = np.argpartition(-logits, k - 1)[:k]
    z = logits[idx].astype(np.float64) / temperature
    order = np.argsort(-z)
    idx, z = idx[order], z[order]
    p = np.exp(z - z[0])
    p /= p.sum()
    keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
    p = p[:keep] / p[:keep].sum()
    return int(idx[rng.choice(keep, p=p)])


class RequestGenerator:
    """An instruct GGUF that writes tools' requests, ``parallel`` tools at a time: one llama.cpp context with a
    sequence per tool, every step decoding one token of each in a single batch (decoding on a CPU is bound by
    reading the weights, so a batch of 8 costs little more than one token: ~3x the throughput of one tool at a time
    here). Sampling is seeded per tool (the settings' seed and its schema hash). Not thread-safe: one caller."""

    def __init__(self, model_path: str, settings: DeriveSettings = DeriveSettings(), threads: int = 2,
                 parallel: int = 8, n_ctx_per_seq: int = 768):
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        from services.common.errors import FailedPrecondition
        from services.common.models import file_fingerprint

        self.settings = settings
        self.model_path = str(model_path)
        self.model_sha256 = file_fingerprint(model_path)
        self.fingerprint = generator_fingerprint(self.model_sha256, settings)
        self.parallel = max(1, int(parallel))
        self.n_ctx_per_seq = n_ctx_per_seq
        from services.runtime.splice import _silence_llama_logs

        self._ll = llama_cpp
        llama_cpp.llama_backend_init()
        _silence_llama_logs(llama_cpp)
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = False  # AMX-advertising VMs: see services/runtime/splice.py
        self.model = llama_cpp.llama_model_load_from_file(self.model_path.encode(), mp)
        if not self.model:
            raise FailedPrecondition(f"llama.cpp could not load {self.model_path}")
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = (self.parallel + 1) * n_ctx_per_seq
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = self.parallel + 1  # + the shared prefix's sequence
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise FailedPrecondition("llama_init_from_model failed")
        self._closed = False
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        template = llama_cpp.llama_model_chat_template(self.model, None)
        if not template:
            self.close()
            raise FailedPrecondition(f"{self.model_path} has no chat template: the generator needs an instruct model")
        self._format = Jinja2ChatFormatter(template.decode("utf-8"), eos_token=self._piece(
            llama_cpp.llama_vocab_eos(self.vocab)), bos_token=self._piece(llama_cpp.llama_vocab_bos(self.vocab)))
        # the prompts' shared prefix (instruction + worked example), decoded once into sequence ``parallel``
        self._prefix: list[int] = []

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._ll.llama_batch_free(self.batch)
        self._ll.llama_free(self.ctx)
        self._ll.llama_model_free(self.model)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def describe(self) -> dict[str, Any]:
        return {"model_sha256": self.model_sha256, "prompt": PROMPT_VERSION, "fingerprint": self.fingerprint,
                **asdict(self.settings)}

    # -- llama.cpp plumbing ----------------------------------------------------------------------------------
    def _piece(self, token: int) -> str:
        return self._piece_bytes(token, special=True).decode("utf-8", errors="replace")

    def _piece_bytes(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._ll.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def fitted_prompt(self, tool: Tool) -> list[int]:
        """``tool``'s prompt within its sequence's budget (``n_ctx_per_seq`` less the reply's): a long tool's
        description and parameter list are shortened until it fits. Cutting the token list instead would cut the
        chat's end (the tool's text and the assistant's turn), and the model would go on writing the user's
        message rather than answer it (it did, for 24 of the 338 tools, under derive-v2)."""
        budget = self.n_ctx_per_seq - self.settings.max_tokens
        st = self.settings
        tokens = self.prompt_tokens(tool)
        for chars, params in ((400, 8), (250, 6), (150, 4), (80, 2), (0, 0)):
            if len(tokens) <= budget:
                break
            tokens = self.prompt_tokens(tool, replace(st, max_description_chars=min(chars, st.max_description_chars),
                                                      max_parameters=min(params, st.max_parameters)))
        if len(tokens) > budget:
            raise ValueError(f"{tool.name}: even its shortest prompt ({len(tokens)} tokens) exceeds the generator's "
                             f"{budget}-token budget (raise n_ctx_per_seq)")
        return tokens

    def prompt_tokens(self, tool: Tool, settings: DeriveSettings | None = None) -> list[int]:
        from services.runtime.splice import tokenize

        return tokenize(self._ll, self.vocab, self._format(messages=messages(tool, settings or self.settings)).prompt)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """Decode ``(token, pos, seq, want logits)`` items in batches of 512."""
        b = self.batch
        for s in range(0, len(items), 512):
            chunk = items[s:s + 512]
            b.n_tokens = len(chunk)
            for i, (t, pos, seq, want) in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = t, pos, 1, seq, want
            rc = self._ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed ({rc})")

    def _shared_prefix(self, prompts: list[list[int]]) -> int:
        """The length of the cached prefix every prompt starts with, decoding a new one (the prompts' longest
        common prefix, one token short of the shortest) when the cached one is not theirs."""
        n = len(self._prefix)
        if n and all(len(p) > n and p[:n] == self._prefix for p in prompts):
            return n
        # the common prefix of these prompts and of two unlike tools' (so it ends where any tool's text begins, and
        # the next pass reuses it)
        unlike = [self.prompt_tokens(Tool("a", "a", {})), self.prompt_tokens(Tool("zz_q", "Zz.", {}))]
        common = min(len(p) for p in prompts) - 1
        for p in [*prompts[1:], *unlike]:
            common = next((j for j in range(common) if p[j] != prompts[0][j]), common)
        self._ll.llama_memory_seq_rm(self.mem, self.parallel, -1, -1)
        self._prefix = list(prompts[0][:common])
        if common:
            self._decode([(t, j, self.parallel, False) for j, t in enumerate(self._prefix)])
        return common

    def _logits(self, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(self._ll.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    # -- generation ------------------------------------------------------------------------------------------
    def generate(self, tool: Tool) -> list[str]:
        return self.generate_many([tool])[0]

    def generate_many(self, tools: Sequence[Tool]) -> list[list[str]]:
        """Each tool's requests (``parse_requests`` of its reply), ``parallel`` tools per pass."""
        out: list[list[str]] = []
        for s in range(0, len(tools), self.parallel):
            out.extend(self._pass(list(tools[s:s + self.parallel])))
        return out

    def _pass(self, tools: list[Tool]) -> list[list[str]]:
        st = self.settings
        for i in range(self.parallel):
            self._ll.llama_memory_seq_rm(self.mem, i, -1, -1)
        prompts = [self.fitted_prompt(t) for t in tools]
        rngs = [np.random.default_rng([st.seed, int(t.schema_hash[:15], 16)]) for t in tools]
        replies: list[bytearray] = [bytearray() for _ in tools]
        pos = [len(p) for p in prompts]
        # every prompt starts with the instruction and the worked example: that prefix is decoded once per generator
        # (sequence ``parallel``) and copied into each tool's sequence (a KV copy, no compute); then each prompt's
        # own rest (its last position's logits copied before the next decode overwrites them)
        common = self._shared_prefix(prompts)
        for i in range(len(prompts)):
            self._ll.llama_memory_seq_cp(self.mem, self.parallel, i, 0, common)
        logits: list[np.ndarray | None] = []
        for i, p in enumerate(prompts):
            self._decode([(t, j, i, j == len(p) - 1) for j, t in enumerate(p) if j >= common])
            logits.append(self._logits(-1).copy())
        active = list(range(len(tools)))
        for _ in range(st.max_tokens):
            items, alive = [], []
            for i in active:
                tok = sample(logits[i], rngs[i], st.temperature, st.top_p)
                if self._ll.llama_vocab_is_eog(self.vocab, tok):
                    continue
                replies[i] += self._piece_bytes(tok)
                if replies[i].count(b"\n") >= st.n + 2 and _enough(replies[i], st.n):
                    continue
                items.append((tok, pos[i], i, True))
                pos[i] += 1
                alive.append(i)
            if not items:
                break
            self._decode(items)
            for j, i in enumerate(alive):
                logits[i] = self._logits(j).copy()
            active = alive
        results = []
        for t, r in zip(tools, replies, strict=True):
            reqs = parse_requests(r.decode("utf-8", errors="replace"), t, st.n)
            if not reqs:
                log.warning("derived requests: the generator's reply for %s held no request", t.name)
            results.append(reqs)
        return results


def _enough(reply: bytearray, n: int) -> bool:
    """The reply already holds ``n`` complete list items (the rest would be cut anyway)."""
    lines = reply.decode("utf-8", errors="replace").split("\n")[:-1]
    return sum(bool(_NUMBERED.match(x)) for x in lines) >= n


# -- shipped requests and the batch command ------------------------------------------------------------------
def read_requests_file(path: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """A derived-requests file (``nexus derive``): its generator header and ``{schema hash: requests}``."""
    header: dict[str, Any] = {}
    out: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            if n == 0 and "generator" in row:
                header = row["generator"]
                continue
            out[str(row["schema_hash"])] = [str(r) for r in row["requests"]]
    return header, out


def derive_file(tools: Sequence[Tool], path: str, generator: RequestGenerator, progress: bool = True) -> int:
    """Write (or complete) the derived requests of ``tools`` into the JSONL file ``path``: a generator header, then
    one ``{"tool", "schema_hash", "requests"}`` row per tool, appended as each is written, so an interrupted run
    resumes where it stopped. A file of another generator is refused. Returns the number of tools generated now."""
    import os
    import sys

    from tqdm import tqdm

    done: dict[str, list[str]] = {}
    if os.path.exists(path) and os.path.getsize(path) > 0:
        header, done = read_requests_file(path)
        if header.get("fingerprint") != generator.fingerprint:
            raise ValueError(f"{path} was written by generator {str(header.get('fingerprint'))[:12]}, not "
                             f"{generator.fingerprint[:12]}: write to another file")
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps({"generator": generator.describe()}, sort_keys=True) + "\n")
    todo = [t for t in tools if t.schema_hash not in done]
    with open(path, "a", encoding="utf-8") as f, tqdm(total=len(todo), desc="derived requests", unit="tool",
                                                       file=sys.stderr, disable=not progress) as bar:
        for s in range(0, len(todo), generator.parallel):
            chunk = todo[s:s + generator.parallel]
            for t, reqs in zip(chunk, generator.generate_many(chunk), strict=True):
                f.write(json.dumps({"tool": t.name, "schema_hash": t.schema_hash, "requests": reqs},
                                   ensure_ascii=False) + "\n")
            f.flush()
            bar.update(len(chunk))
    return len(todo)


def add_derive_parser(sub) -> None:
    d = sub.add_parser("derive", help="write the derived requests of a directory of MCP tool files (JSONL)")
    d.add_argument("--tools", required=True, help="registry directory (MCP tool files)")
    d.add_argument("--out", required=True, help="JSONL file to write or complete")
    d.add_argument("--model", default="", help="instruct GGUF (default: the installed generator model)")
    d.add_argument("--threads", type=int, default=2)
    d.add_argument("--limit", type=int, default=0, help="only the first N tools (a quick look)")
    d.add_argument("--quiet", action="store_true")

    def run(a) -> int:
        from services.common.models import resolve_generator_gguf
        from services.common.tools import load_registry_dir

        tools = list(load_registry_dir(a.tools))
        if a.limit:
            tools = tools[: a.limit]
        gen = RequestGenerator(str(resolve_generator_gguf(a.model)), threads=a.threads)
        n = derive_file(tools, a.out, gen, progress=not a.quiet)
        print(f"{a.out}: {n} tool(s) derived now, generator {gen.fingerprint[:12]}")
        return 0

    d.set_defaults(fn=run)


# -- the compiler's background worker ------------------------------------------------------------------------
class DeriveWorker:
    """Writes the derived requests of compiled tools into the store, off the request path: ``submit`` queues a
    tool (nothing to do when its artifact exists) and returns at once; one thread takes the queue in batches of
    the generator's ``parallel``. A tool found in ``shipped`` (the default registry's requests, written by the same
    generator) is written from there without loading any model; the generator is loaded at the first tool that
    needs it (``make_generator``). A tool that fails is logged and skipped (it routes on its text key)."""

    def __init__(self, store, make_generator, fingerprint: str, shipped: dict[str, list[str]] | None = None,
                 metrics=None):
        import queue
        import threading

        self.store = store
        self._make = make_generator
        self.fingerprint = fingerprint
        self.shipped = shipped or {}
        self.metrics = metrics
        self._q: queue.Queue[Tool | None] = queue.Queue()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._gen: RequestGenerator | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="derive", daemon=True)
        self._thread.start()

    def key(self, tool: Tool) -> str:
        return derived_key(tool, self.fingerprint)

    def pending(self) -> int:
        with self._lock:
            return len(self._queued)

    def submit(self, tool: Tool) -> bool:
        """Queue ``tool`` unless its requests are in the store or queued; True when queued now."""
        key = self.key(tool)
        with self._lock:
            if key in self._queued:
                return False
            if self.store.exists(key):
                return False
            self._queued.add(key)
            self._idle.clear()
            self._gauge()
        self._q.put(tool)
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until the queue is empty (tests, ``nexus derive``-like callers); True when it is."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=30)
        if self._gen is not None:
            self._gen.close()

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.derive_pending.set(len(self._queued))

    def _run(self) -> None:
        import queue

        while True:
            tool = self._q.get()
            if tool is None:
                return
            batch = [tool]
            parallel = self._gen.parallel if self._gen is not None else 8
            while len(batch) < parallel:
                try:
                    nxt = self._q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                batch.append(nxt)
            try:
                self._write(batch)
            except Exception as e:  # noqa: BLE001 - a failed batch must not stop the worker
                log.error("derived requests failed for %d tool(s): %s", len(batch), e,
                          extra={"tools": [t.name for t in batch]})
            with self._lock:
                for t in batch:
                    self._queued.discard(self.key(t))
                self._gauge()
                if not self._queued:
                    self._idle.set()

    def _write(self, batch: list[Tool]) -> None:
        gen_info = {"fingerprint": self.fingerprint}
        todo = []
        for t in batch:
            if t.schema_hash in self.shipped:
                self.store.put(self.key(t), encode_derived(t, self.shipped[t.schema_hash], {**gen_info,
                                                                                          "source": "shipped"}),
                               {"tool": t.name, "schema_hash": t.schema_hash, "source": "shipped"})
                if self.metrics is not None:
                    self.metrics.derived.labels("shipped").inc()
            else:
                todo.append(t)
        if not todo:
            return
        if self._gen is None:
            self._gen = self._make()
            if self._gen.fingerprint != self.fingerprint:
                raise RuntimeError(f"the generator's fingerprint {self._gen.fingerprint[:12]} is not the "
                                   f"configured {self.fingerprint[:12]}")
        import time

        t0 = time.perf_counter()
        for s in range(0, len(todo), self._gen.parallel):  # each pass written as soon as it is done
            chunk = todo[s:s + self._gen.parallel]
            for t, reqs in zip(chunk, self._gen.generate_many(chunk), strict=True):
                self.store.put(self.key(t), encode_derived(t, reqs, {**gen_info, "source": "generated"}),
                               {"tool": t.name, "schema_hash": t.schema_hash, "source": "generated"})
                if self.metrics is not None:
                    self.metrics.derived.labels("generated").inc()
        log.info("derived requests written", extra={"tools": len(todo),
                                                    "ms": round((time.perf_counter() - t0) * 1e3)})
