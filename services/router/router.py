"""Domain logic of the router: the registry mirror, the SLB and the routing decision. No protobuf here."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.common.embedder import NAME_DESC, Embedder, key_text, tool_text
from services.common.errors import (
    ArtifactNotFound,
    DataCorruption,
    EmptyRegistry,
    InvalidArgument,
    ToolNotFound,
)
from services.common.store import Store, artifact_key
from services.common.tools import Tool, parse_tool
from services.common.validation import bounded_count, check_request
from services.compiler.compiler import decode_embedding, embedding_key, encode_embedding
from services.compiler.signature import signature
from services.router.config import RouterConfig
from services.router.context import routing_text as _routing_text
from services.router.gate import GateModel, ce_tool_text, fuse, load_gate, set_threads
from services.router.keys import ALT_KEY_VERSION, LexicalIndex, alt_tool_text, query_part
from services.router.slb import SemanticIndex

# example requests a user registers with a tool (RegisterToolsRequest.examples), stored by its schema hash
KIND_EXAMPLES = "examples"
MAX_EXAMPLES_PER_TOOL = 64


def examples_key(tool: Tool) -> str:
    return artifact_key(KIND_EXAMPLES, "requests-v1", tool.schema_hash)

log = logging.getLogger("nexus.router")

CompileFn = Callable[[Tool], Awaitable[None]]


@dataclass(frozen=True)
class HistoryTurn:
    role: str
    content: str


@dataclass(frozen=True)
class RouteDecision:
    tool: str
    score: float
    margin: float
    escalated: bool
    candidates: list[tuple[str, float]]
    route_ms: float
    registry_version: int
    # How the decision was made: "auto" (margin >= tau), "escalated" (the cross-encoder re-ranked the top
    # candidates), "slb-only" (no gate model loaded: escalation disabled).
    gate: str = "auto"
    # The SLB's own ranking (before any re-ranking), best first; the evaluation reads it.
    slb_candidates: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class ToolEntry:
    tool: Tool
    signature: str = ""
    # what keys the tool in the SLB: "trained" (the gate model's exemplar keys of this very schema), "derived"
    # (the embeddings of its derived requests), "pending" (derived requests not in the store yet: text key only)
    # or "text" (text key only: derived keys off)
    keys: str = "text"


@dataclass
class RegistryView:
    tools: dict[str, ToolEntry] = field(default_factory=dict)
    version: int = -1


def routing_text(query: str, history: Sequence[HistoryTurn], max_turns: int = 4) -> str:
    """The text encoded for a request: the query, then a pruned window of the history (recent turns
    verbatim, tool payloads as short surrogates); see ``services.router.context``."""
    return _routing_text(query, history, max_turns=max_turns)


class Router:
    def __init__(self, config: RouterConfig, store: Store, embedder: Embedder):
        self.config = config
        self.store = store
        self.embedder = embedder
        set_threads(config.torch_threads)
        self.gate: GateModel | None = load_gate(config.gate_model_dir, threads=config.torch_threads,
                                                precision=config.query_encoder_precision)
        if (self.gate is not None and self.gate.info.meta.get("tool_keys") != "query_encoder"
                and self.gate.info.meta.get("base_embedder_fingerprint") != embedder.fingerprint):
            # the query encoder was trained against another embedder's tool keys: its vectors would not match (a
            # model built on its own encoder keys the tools itself, whatever the base embedder is)
            log.error("gate model %s was trained for another embedder; routing is SLB-only (escalation disabled)",
                      self.gate.info.path)
            self.gate = None
        self.exemplar_weight = self._exemplar_weight()
        # the BM25 addend's weight (services/router/keys.py): configured, else the gate model's calibrated one
        self.lexical_weight = (config.lexical_weight if config.lexical_weight >= 0
                               else self.gate.info.lexical_weight if self.gate is not None else 0.0)
        self.derived_fingerprint = ""
        if config.derived_keys:
            from services.compiler.derive import default_fingerprint

            self.derived_fingerprint = config.derived_fingerprint or default_fingerprint()
            if self.gate is None:  # no trained exemplar keys: the derived ones pooled as configured
                self.exemplar_weight = config.derived_weight
        self.index = SemanticIndex(embedder.dim, exemplar_weight=self.exemplar_weight,
                                   prefer_native=config.native_scan,
                                   exemplar_gap=self.gate.info.exemplar_gap if self.gate is not None else 0.0,
                                   exemplar_temperature=(self.gate.info.exemplar_temperature
                                                         if self.gate is not None else config.derived_temperature))
        self.view = RegistryView()
        # the gate model's per-tool data, by schema hash (re-keyed to the registry's names at every load)
        self._exemplars_by_schema: dict[str, np.ndarray] = {}
        self._bias_by_schema: dict[str, float] = {}
        # derived keys: embedded requests by schema hash (kept across loads), and the tools still waiting for theirs
        self._derived_vecs: dict[str, np.ndarray] = {}
        self._pending_derived: dict[str, str] = {}
        # registered example requests, embedded: schema hash -> (digest of the stored requests, their vectors)
        self._example_vecs: dict[str, tuple[str, np.ndarray]] = {}
        self._ce_texts: dict[str, str] = {}
        self._lexical: tuple[list[str], LexicalIndex] | None = None
        self._sync_lock = asyncio.Lock()
        if self.gate is not None:
            info = self.gate.info
            log.info("gate model loaded", extra={"path": info.path, "tau": info.tau, "alpha": info.alpha,
                                                 "ce_top_k": info.ce_top_k, "alt_keys": info.alt_keys,
                                                 "lexical_weight": info.lexical_weight})
            # warm what routes so the first request does not pay for lazy initialisation; the cross-encoder only
            # when it can change a decision (alpha > 0): otherwise it is never loaded
            self.gate.embed_query("warm up")
            if info.alpha > 0:
                self.gate.ce_scores("warm up", ["warm up"])
            if info.alpha <= 0:
                log.info("gate model %s: no second stage (cross-encoder weight alpha = 0): routing is the SLB with "
                         "the tuned query encoder and exemplar keys", info.path)
            if self.exemplar_weight:
                # keyed by schema hash: a registered tool gets the keys and bias of the trained tool it *is*
                keys = self.gate.by_schema(self.gate.exemplar_keys())
                # the tool bias was calibrated with the model's exemplar weight: not under another one
                bias = info.tool_bias if self.exemplar_weight == info.exemplar_weight else {}
                bad = [n for n, b in bias.items() if not np.isfinite(b)]
                if bad:  # a corrupt gate.json: route without the bias rather than not at all
                    log.error("gate model %s: tool bias of %r is not finite; routing without any", info.path, bad[0])
                    bias = {}
                self._exemplars_by_schema, self._bias_by_schema = keys, self.gate.by_schema(bias)
                if not info.tool_schemas:
                    log.error("gate model %s has no tool_schemas (trained before artifacts were keyed by schema "
                              "hash): routing without its exemplar keys and biases; retrain it (make train)",
                              info.path)
                log.info("exemplar keys loaded", extra={"weight": self.exemplar_weight, "tools": len(keys),
                                                        "gap": self.gate.info.exemplar_gap,
                                                        "temperature": self.gate.info.exemplar_temperature,
                                                        "biased_tools": len(self._bias_by_schema),
                                                        "rows": sum(len(v) for v in keys.values())})
        log.info("SLB scan backend", extra={"backend": self.index.backend_name})

    def _exemplar_weight(self) -> float:
        """The configured exemplar weight, or (negative, the default) the gate model's validation-chosen one."""
        if self.config.exemplar_weight >= 0:
            return self.config.exemplar_weight if self.gate is not None else 0.0
        return self.gate.info.exemplar_weight if self.gate is not None else 0.0

    @property
    def escalation_enabled(self) -> bool:
        return self.gate is not None

    # -- validation -------------------------------------------------------------------------
    def _check_query(self, query: str, history: Sequence[HistoryTurn], top_k: int | None) -> int:
        check_request(query, len(history), max_query_chars=self.config.max_query_chars,
                      max_history_turns=self.config.max_history_turns)
        return bounded_count("top_k", top_k, default=self.config.default_top_k, limit=self.config.max_top_k)

    # -- registry ---------------------------------------------------------------------------
    def _load(self, tools: dict[str, Tool], version: int) -> None:
        """Rebuild the SLB from a registry snapshot, reusing vectors of unchanged tools."""
        old = self.view.tools
        vecs: dict[str, np.ndarray] = {}
        missing: list[Tool] = []
        for name, tool in tools.items():
            if name in old and old[name].tool.schema_hash == tool.schema_hash and name in self.index:
                vecs[name] = self.index.vector(name)
            else:
                missing.append(tool)
        # Batch-embed the tools whose artifact is not in the store (first start, other key encoder).
        fingerprint, dim, embed, text = self._key_encoder()
        need_embed: list[Tool] = []
        for tool in missing:
            key = embedding_key(tool, fingerprint)
            try:
                vecs[tool.name] = decode_embedding(self.store.get(key), dim)
            except (ArtifactNotFound, DataCorruption, ValueError):
                need_embed.append(tool)
        if need_embed:
            mat = embed([text(t) for t in need_embed])
            for t, v in zip(need_embed, mat, strict=True):
                self.store.put(embedding_key(t, fingerprint), encode_embedding(v),
                               {"tool": t.name, "schema_hash": t.schema_hash, "dim": dim})
                vecs[t.name] = v
        # Build the new index and views first, then swap: routing keeps using the old ones meanwhile.
        if self.gate is not None and self.gate.info.alt_keys:
            self.index.set_alt_keys(self._alt_keys(tools))
        if self.lexical_weight > 0:
            order = sorted(tools)
            self._lexical = (order, LexicalIndex.of_tools([tools[n] for n in order]))
        exemplars = {n: self._exemplars_by_schema[t.schema_hash] for n, t in tools.items()
                     if t.schema_hash in self._exemplars_by_schema}
        examples = self._example_keys({n: t for n, t in tools.items() if n not in exemplars})
        derived = self._derived_keys({n: t for n, t in tools.items() if n not in exemplars and n not in examples})
        keys_of = {n: "trained" if n in exemplars else "examples" if n in examples else "derived" if n in derived
                   else "pending" if n in self._pending_derived else "text" for n in tools}
        self.index.replace_all({n: vecs[n] for n in sorted(tools)}, exemplars={**exemplars, **examples, **derived},
                               bias={n: self._bias_by_schema[t.schema_hash] for n, t in tools.items()
                                     if t.schema_hash in self._bias_by_schema})
        self._ce_texts = {n: ce_tool_text(t) for n, t in tools.items()}
        self.view = RegistryView(
            tools={n: ToolEntry(t, old[n].signature if n in old and old[n].tool.schema_hash == t.schema_hash
                                else signature(t), keys_of[n]) for n, t in tools.items()},
            version=version,
        )
        log.info("registry loaded", extra={"tools": len(tools), "version": version, "derived_keys": len(derived),
                                           "derived_pending": len(self._pending_derived)})

    def _key_encoder(self) -> tuple[str, int, Callable[[list[str]], np.ndarray], Callable[[Tool], str]]:
        """(fingerprint, dim, embed, text) of the tools' keys: the base embedder on ``tool_text`` (the compiler
        stores its vectors), or the gate model's own encoder when the model was built on one (gate.json tool_keys)
        on the text form it names (gate.json tool_text: the public encoders learnt tools as ``tool_doc``)."""
        gate = self.gate
        if gate is not None and gate.info.meta.get("tool_keys") == "query_encoder":
            form = str(gate.info.meta.get("tool_text") or NAME_DESC)
            # each text through the very path a request takes (its graph, INT8 by default): keys and queries agree;
            # another text, another vector: the form joins the fingerprint (artifact keys read its first 16 chars)
            fp = gate.fingerprint
            if form != NAME_DESC:
                fp = hashlib.sha256(f"{fp}+{form}".encode()).hexdigest()
            return (fp, gate.dim,
                    lambda texts: np.stack([gate.embed_query(t) for t in texts]), key_text(form))
        return self.embedder.fingerprint, self.embedder.dim, self.embedder.embed, tool_text

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Requests embedded as the router embeds a query (the gate's query encoder, else the base embedder)."""
        return self.gate.embed_queries(texts) if self.gate is not None else self.embedder.embed(texts)

    def _example_keys(self, tools: dict[str, Tool]) -> dict[str, np.ndarray]:
        """The keys of ``tools`` that have registered example requests: those requests as the router embeds a
        query (embedded once per schema and set of requests)."""
        need: dict[str, tuple[str, list[str]]] = {}
        present: list[str] = []
        for n, t in tools.items():
            try:
                raw = self.store.get(examples_key(t))
            except ArtifactNotFound:
                continue
            present.append(n)
            digest = hashlib.sha256(raw).hexdigest()
            if self._example_vecs.get(t.schema_hash, ("",))[0] == digest:
                continue
            try:
                reqs = json.loads(raw)["requests"]
            except (ValueError, KeyError, TypeError) as e:
                log.error("example requests of %s unreadable (%s): text key only", t.name, e)
                continue
            need[t.schema_hash] = (digest, reqs)
        texts = [r for _, reqs in need.values() for r in reqs]
        if texts:
            mat = self.embed_texts(texts)
            i = 0
            for h, (digest, reqs) in need.items():
                self._example_vecs[h] = (digest, mat[i:i + len(reqs)])
                i += len(reqs)
        return {n: self._example_vecs[tools[n].schema_hash][1] for n in present
                if tools[n].schema_hash in self._example_vecs}

    def store_examples(self, tools: Mapping[str, Tool], examples: Mapping[str, Sequence[str]]) -> None:
        """Validate ``examples`` (tool name -> example requests, for tools of ``tools``) and store them by each
        tool's schema hash (they key it from the next load on). InvalidArgument names what is wrong; nothing is
        stored then."""
        self._put_examples(tools, self.check_examples(tools, examples))

    def _put_examples(self, tools: Mapping[str, Tool], clean: Mapping[str, list[str]]) -> None:
        for name, reqs in clean.items():
            t = tools[name]
            self.store.put(examples_key(t), json.dumps({"requests": reqs}).encode(),
                           {"tool": t.name, "schema_hash": t.schema_hash, "n": len(reqs)})

    def check_examples(self, tools: Mapping[str, Tool], examples: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """``examples`` stripped, or InvalidArgument naming the first problem (``store_examples``)."""
        clean: dict[str, list[str]] = {}
        for name, reqs in examples.items():
            if name not in tools:
                raise InvalidArgument(f"examples for {name!r}: not a tool of this registration")
            reqs = [r.strip() for r in reqs]
            if not reqs or not all(reqs):
                raise InvalidArgument(f"examples for {name!r}: give one or more non-empty requests")
            if len(reqs) > MAX_EXAMPLES_PER_TOOL:
                raise InvalidArgument(f"examples for {name!r}: {len(reqs)} requests; the limit is "
                                      f"{MAX_EXAMPLES_PER_TOOL}")
            for r in reqs:
                if len(r) > self.config.max_query_chars:
                    raise InvalidArgument(f"examples for {name!r}: a request of {len(r)} characters; the limit is "
                                          f"{self.config.max_query_chars}")
            clean[name] = reqs
        return clean

    def _derived_keys(self, tools: dict[str, Tool]) -> dict[str, np.ndarray]:
        """The derived keys of ``tools`` whose derived requests are in the store (embedded once per schema);
        the others are remembered as pending (``sync`` looks for them at every poll)."""
        self._pending_derived = {}
        if not self.derived_fingerprint:
            return {}
        from services.compiler.derive import decode_derived, derived_key

        need: dict[str, list[str]] = {}
        for t in tools.values():
            if t.schema_hash in self._derived_vecs or t.schema_hash in need:
                continue
            key = derived_key(t, self.derived_fingerprint)
            try:
                reqs = decode_derived(self.store.get(key))
            except ArtifactNotFound:
                self._pending_derived[t.name] = key
                continue
            except (DataCorruption, ValueError) as e:
                log.error("derived requests of %s unreadable (%s): text key only", t.name, e)
                continue
            need[t.schema_hash] = reqs
        texts = [r for reqs in need.values() for r in reqs]
        if texts:
            mat = self.embed_texts(texts)
            i = 0
            for h, reqs in need.items():
                self._derived_vecs[h] = mat[i:i + len(reqs)]
                i += len(reqs)
        return {n: self._derived_vecs[t.schema_hash] for n, t in tools.items()
                if len(self._derived_vecs.get(t.schema_hash, ())) > 0}

    def wants_derived(self, tool: Tool) -> bool:
        """Whether ``tool`` needs derived requests: derived keys are on and the gate model has no trained keys of
        this schema (the compiler then derives them; a shipped tool costs the generator nothing)."""
        return bool(self.derived_fingerprint) and tool.schema_hash not in self._exemplars_by_schema

    def _derived_arrived(self) -> bool:
        return any(self.store.exists(k) for k in list(self._pending_derived.values()))

    def _alt_keys(self, tools: dict[str, Tool]) -> dict[str, np.ndarray]:
        """Alternate keys (``keys.alt_tool_text`` embedded with the base embedder), cached in the store."""
        out: dict[str, np.ndarray] = {}
        need: list[Tool] = []
        fingerprint, dim, embed, _ = self._key_encoder()
        for name, tool in tools.items():
            key = self._alt_key_name(tool, fingerprint)
            try:
                out[name] = decode_embedding(self.store.get(key), dim)
            except (ArtifactNotFound, DataCorruption, ValueError):
                need.append(tool)
        if need:
            mat = embed([alt_tool_text(t) for t in need])
            for t, v in zip(need, mat, strict=True):
                self.store.put(self._alt_key_name(t, fingerprint), encode_embedding(v),
                               {"tool": t.name, "schema_hash": t.schema_hash, "dim": dim, "text": ALT_KEY_VERSION})
                out[t.name] = v
        return out

    @staticmethod
    def _alt_key_name(tool: Tool, fingerprint: str) -> str:
        from services.common.store import artifact_key

        return artifact_key("embalt", fingerprint, tool.schema_hash)

    async def sync(self, force: bool = False) -> bool:
        """Reload from the store when its registry version moved (another replica changed it)."""
        async with self._sync_lock:
            version = await asyncio.to_thread(self.store.registry_version)
            if (not force and version == self.view.version
                    and not (self._pending_derived and await asyncio.to_thread(self._derived_arrived))):
                return False
            tools, version = await asyncio.to_thread(self.store.registry_snapshot)
            await asyncio.to_thread(self._load, tools, version)
            return True

    def _store_base_embeddings(self, tools: Sequence[Tool]) -> None:
        """The base embeddings a registration's tools lack, in one batch, into the store under the compiler's
        content-addressed key: the compiler, one tool per call, would embed them one at a time (~3x the time for
        300 tools); it reuses what it finds there."""
        need = [t for t in tools if not self.store.exists(embedding_key(t, self.embedder.fingerprint))]
        if not need:
            return
        mat = self.embedder.embed([tool_text(t) for t in need])
        for t, v in zip(need, mat, strict=True):
            self.store.put(embedding_key(t, self.embedder.fingerprint), encode_embedding(v),
                           {"tool": t.name, "schema_hash": t.schema_hash, "dim": self.embedder.dim,
                            "embedder": self.embedder.fingerprint})

    async def register(self, raw_tools: Sequence[str], compile_fn: CompileFn,
                       examples: Mapping[str, Sequence[str]] | None = None) -> tuple[list[str], int, int]:
        """Compile and register ``raw_tools`` (MCP JSON), with ``examples`` (tool name -> example requests) that
        key them too (``store_examples``)."""
        if not raw_tools:
            raise InvalidArgument("no tools given")
        tools: list[Tool] = []
        seen: set[str] = set()
        for i, raw in enumerate(raw_tools):
            try:
                tool = parse_tool(raw)
            except InvalidArgument as e:
                raise type(e)(f"tools[{i}]: {e.message}") from e
            if tool.name in seen:
                raise InvalidArgument(f"tools[{i}]: duplicate tool name {tool.name!r} in request")
            seen.add(tool.name)
            tools.append(tool)
        by_name = {t.name: t for t in tools}
        examples = self.check_examples(by_name, examples or {})  # before anything compiles: a bad one registers nothing
        sem = asyncio.Semaphore(self.config.compile_concurrency)

        async def one(t: Tool) -> None:
            async with sem:
                await compile_fn(t)

        if len(tools) > 1:
            await asyncio.to_thread(self._store_base_embeddings, tools)
        # Compile everything first: a tool is only registered once its artifacts exist.
        await asyncio.gather(*(one(t) for t in tools))
        if examples:
            await asyncio.to_thread(self._put_examples, by_name, examples)  # checked above
        version = await asyncio.to_thread(self.store.registry_put, tools)
        await self.sync(force=True)
        return [t.name for t in tools], version, len(self.view.tools)

    async def remove(self, names: Sequence[str]) -> tuple[list[str], list[str], int]:
        if not names:
            raise InvalidArgument("no tool names given")
        removed, missing, version = await asyncio.to_thread(self.store.registry_remove, list(names))
        await self.sync(force=True)
        return removed, missing, version

    def list(self, prefix: str = "") -> tuple[list[ToolEntry], int]:
        view = self.view
        entries = [view.tools[n] for n in sorted(view.tools) if n.startswith(prefix)]
        return entries, view.version

    # -- routing ----------------------------------------------------------------------------
    def route(self, query: str, history: Sequence[HistoryTurn] = (), top_k: int | None = None,
              allowed: Sequence[str] = ()) -> RouteDecision:
        """Route ``query`` (+ ``history``) among every registered tool, or among the ``allowed`` names only."""
        k = self._check_query(query, history, top_k)
        t0 = time.perf_counter()
        view = self.view
        if not view.tools:
            raise EmptyRegistry("no tools are registered; call RegisterTools first")
        mask = None
        if allowed:
            names = self.index.names()
            pos = {n: i for i, n in enumerate(names)}
            unknown = sorted({n for n in allowed if n not in pos})
            if unknown:
                raise ToolNotFound(f"allowed_tools: not registered: {', '.join(unknown[:5])}"
                                   + (f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else ""))
            mask = np.zeros(len(names), bool)
            mask[[pos[n] for n in allowed]] = True
            k = min(k, int(mask.sum()))
        return self.decide(routing_text(query, history, self._max_turns()), k, allowed=mask, t0=t0,
                           version=view.version)

    def _max_turns(self) -> int:
        return self.gate.info.max_turns if self.gate is not None else 4

    def embed_request(self, text: str) -> np.ndarray:
        """The query vector: the gate's fine-tuned query encoder, or the base embedder without a gate."""
        return self.gate.embed_query(text) if self.gate is not None else self.embedder.embed_one(text)

    def _lexical_bonus(self, text: str) -> np.ndarray | None:
        """The weighted lexical score of every indexed tool (index order), or None when not in use."""
        lexical = self._lexical
        if self.lexical_weight <= 0 or lexical is None:
            return None
        if lexical[0] != self.index.names():  # registry swapped meanwhile: the next request gets it
            return None
        return np.float32(self.lexical_weight) * lexical[1].scores(query_part(text))

    def decide(self, text: str, k: int, *, allowed: np.ndarray | None = None, t0: float | None = None,
               version: int | None = None) -> RouteDecision:
        """SLB scan -> margin gate -> (cross-encoder) for an already-built routing text. ``allowed``
        restricts the candidates to a subset of the index (the evaluation's per-query registries)."""
        t0 = time.perf_counter() if t0 is None else t0
        gate = self.gate
        n_slb = max(k, 2, gate.info.ce_top_k if gate is not None else 0)
        qvec = self.embed_request(text)
        slb = self.index.search(qvec, n_slb, allowed=allowed, bonus=self._lexical_bonus(text))
        if not slb:
            raise EmptyRegistry("no tools are registered; call RegisterTools first")
        margin = slb[0][1] - slb[1][1] if len(slb) > 1 else float("inf")
        final = slb
        mode = "slb-only" if gate is None else "auto"
        # alpha == 0 (validation found the cross-encoder adds nothing): re-ranking could not change the order
        if gate is not None and gate.info.alpha > 0 and len(slb) > 1 and margin < gate.info.tau:
            top = slb[: gate.info.ce_top_k]
            logits = gate.ce_scores(text, [self._ce_texts.get(n, n.replace("_", " ")) for n, _ in top])
            fused = fuse(np.array([s for _, s in top], np.float32), logits, gate.info.alpha)
            order = np.argsort(-fused, kind="stable")
            final = [(top[i][0], float(fused[i])) for i in order] + list(slb[gate.info.ce_top_k:])
            mode = "escalated"
        return RouteDecision(
            tool=final[0][0],
            score=final[0][1],
            margin=float(margin) if np.isfinite(margin) else 0.0,
            escalated=mode == "escalated",
            candidates=final[:k],
            route_ms=(time.perf_counter() - t0) * 1e3,
            registry_version=self.view.version if version is None else version,
            gate=mode,
            slb_candidates=slb,
        )
