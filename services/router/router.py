"""Domain logic of the router: the registry mirror, the SLB and the routing decision. No protobuf here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.common.embedder import Embedder, tool_text
from services.common.errors import ArtifactNotFound, DataCorruption, EmptyRegistry, InvalidArgument
from services.common.store import Store
from services.common.tools import Tool, parse_tool
from services.compiler.compiler import decode_embedding, embedding_key, encode_embedding
from services.compiler.signature import signature
from services.router.config import RouterConfig
from services.router.slb import SemanticIndex

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


@dataclass
class ToolEntry:
    tool: Tool
    signature: str = ""


@dataclass
class RegistryView:
    tools: dict[str, ToolEntry] = field(default_factory=dict)
    version: int = -1


def routing_text(query: str, history: Sequence[HistoryTurn]) -> str:
    """The text embedded for a request: the query, preceded by the last user turn when there is history
    (so "merge it" carries what "it" was). Tool payloads are never embedded."""
    last_user = next((t.content for t in reversed(history) if t.role == "user" and t.content.strip()), "")
    if last_user:
        return f"{last_user[:300]}\n{query}"
    return query


class Router:
    def __init__(self, config: RouterConfig, store: Store, embedder: Embedder):
        self.config = config
        self.store = store
        self.embedder = embedder
        self.index = SemanticIndex(embedder.dim)
        self.view = RegistryView()
        self._sync_lock = asyncio.Lock()

    # -- validation -------------------------------------------------------------------------
    def _check_query(self, query: str, history: Sequence[HistoryTurn], top_k: int | None) -> int:
        if not query or not query.strip():
            raise InvalidArgument("query is empty")
        if len(query) > self.config.max_query_chars:
            raise InvalidArgument(f"query is {len(query)} characters; the limit is {self.config.max_query_chars}")
        if len(history) > self.config.max_history_turns:
            raise InvalidArgument(f"history has {len(history)} turns; the limit is {self.config.max_history_turns}")
        if top_k is None or top_k == 0:
            return self.config.default_top_k
        if top_k < 0:
            raise InvalidArgument(f"top_k must be positive, got {top_k}")
        if top_k > self.config.max_top_k:
            raise InvalidArgument(f"top_k {top_k} exceeds the limit {self.config.max_top_k}")
        return top_k

    # -- registry ---------------------------------------------------------------------------
    def _embedding_for(self, tool: Tool) -> np.ndarray:
        key = embedding_key(tool, self.embedder.fingerprint)
        try:
            return decode_embedding(self.store.get(key), self.embedder.dim)
        except (ArtifactNotFound, DataCorruption, ValueError):
            vec = self.embedder.embed_one(tool_text(tool))
            self.store.put(key, encode_embedding(vec), {"tool": tool.name, "schema_hash": tool.schema_hash,
                                                         "dim": self.embedder.dim})
            return vec

    def _load(self, tools: dict[str, Tool], version: int) -> None:
        """Rebuild the SLB from a registry snapshot, reusing vectors of unchanged tools."""
        old = self.view.tools
        vecs: dict[str, np.ndarray] = {}
        missing: list[Tool] = []
        for name, tool in tools.items():
            if name in old and old[name].tool.schema_hash == tool.schema_hash and name in self.index._pos:
                vecs[name] = self.index._mat[self.index._pos[name]]
            else:
                missing.append(tool)
        # Batch-embed the tools whose artifact is not in the store (first start, other embedder).
        need_embed: list[Tool] = []
        for tool in missing:
            key = embedding_key(tool, self.embedder.fingerprint)
            try:
                vecs[tool.name] = decode_embedding(self.store.get(key), self.embedder.dim)
            except (ArtifactNotFound, DataCorruption, ValueError):
                need_embed.append(tool)
        if need_embed:
            mat = self.embedder.embed([tool_text(t) for t in need_embed])
            for t, v in zip(need_embed, mat, strict=True):
                self.store.put(embedding_key(t, self.embedder.fingerprint), encode_embedding(v),
                               {"tool": t.name, "schema_hash": t.schema_hash, "dim": self.embedder.dim})
                vecs[t.name] = v
        self.index.replace_all({n: vecs[n] for n in sorted(tools)})
        self.view = RegistryView(
            tools={n: ToolEntry(t, old[n].signature if n in old and old[n].tool.schema_hash == t.schema_hash
                                else signature(t)) for n, t in tools.items()},
            version=version,
        )
        log.info("registry loaded", extra={"tools": len(tools), "version": version})

    async def sync(self, force: bool = False) -> bool:
        """Reload from the store when its registry version moved (another replica changed it)."""
        async with self._sync_lock:
            version = await asyncio.to_thread(self.store.registry_version)
            if not force and version == self.view.version:
                return False
            tools, version = await asyncio.to_thread(self.store.registry_snapshot)
            await asyncio.to_thread(self._load, tools, version)
            return True

    async def register(self, raw_tools: Sequence[str], compile_fn: CompileFn) -> tuple[list[str], int, int]:
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
        sem = asyncio.Semaphore(self.config.compile_concurrency)

        async def one(t: Tool) -> None:
            async with sem:
                await compile_fn(t)

        # Compile everything first: a tool is only registered once its artifacts exist.
        await asyncio.gather(*(one(t) for t in tools))
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
    def route(self, query: str, history: Sequence[HistoryTurn] = (), top_k: int | None = None) -> RouteDecision:
        k = self._check_query(query, history, top_k)
        t0 = time.perf_counter()
        view = self.view
        if not view.tools:
            raise EmptyRegistry("no tools are registered; call RegisterTools first")
        qvec = self.embedder.embed_one(routing_text(query, history))
        cands = self.index.search(qvec, max(k, 2))
        best, score = cands[0]
        margin = score - cands[1][1] if len(cands) > 1 else 0.0
        return RouteDecision(
            tool=best,
            score=score,
            margin=margin,
            escalated=False,
            candidates=cands[:k],
            route_ms=(time.perf_counter() - t0) * 1e3,
            registry_version=view.version,
        )
