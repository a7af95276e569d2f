"""The request's tools as Nexus's registry for that request, keyed by schema hash.

Every request carries its tools whole. ``ToolBook`` keeps the front's view of the router's registry (registered
name -> schema hash, and the registry version) and maps each request tool to the registered name it is served under:

* the same tool (same schema hash) already registered under its own name: that name, nothing to do;
* its name free in the registry: registered under it;
* its name taken by *another* tool (another client's tool of the same name, another version of it): registered
  under an alias, ``<name>.<first 12 hex of its schema hash>``, so that no registered tool is ever replaced or
  removed by a request. The answer names the tool by the request's own name.

New tools are registered through the router's RegisterTools with ``defer_kv_blocks``: the call waits for what routing
and generation need (key embedding, signature, grammar) while the KV blocks compile in the background (the engine
prefills a tool's signature as text until its block is stored). The view is refreshed from
ListTools only when a request brings a tool it does not know, or when a Route answers from a newer registry version
than the view (another client changed the registry): the common request costs no registry call at all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from services.common.tools import NAME_RE, Tool
from services.openai.backend import Backend, Registry

log = logging.getLogger("nexus.openai")

ALIAS_HASH_CHARS = 12


def alias_name(tool: Tool) -> str:
    """The name a tool is registered under when its own name is taken by another tool."""
    suffix = "." + tool.schema_hash[:ALIAS_HASH_CHARS]
    name = tool.name[: 128 - len(suffix)] + suffix
    assert NAME_RE.match(name), name
    return name


def renamed(tool: Tool, name: str) -> Tool:
    return tool if name == tool.name else Tool(name=name, description=tool.description, input_schema=tool.input_schema)


@dataclass(frozen=True)
class Resolution:
    """Request tool name -> registered name, and how many of the request's tools this request registered."""

    names: dict[str, str]
    registered: int
    registry_version: int
    registry_size: int


class ToolBook:
    def __init__(self, backend: Backend):
        self.backend = backend
        self._hash_of: dict[str, str] = {}  # registered name -> schema hash of the tool registered under it
        self.version = -1
        self._lock = asyncio.Lock()

    @property
    def size(self) -> int:
        return len(self._hash_of)

    def _load(self, reg: Registry) -> None:
        self._hash_of = {t.name: t.schema_hash for t in reg.tools}
        self.version = reg.version

    def invalidate(self) -> None:
        """Forget the view (a registered name turned out missing): the next request re-reads the registry."""
        self._hash_of, self.version = {}, -1

    async def refresh(self) -> None:
        self._load(await self.backend.list_tools())

    def _lookup(self, tool: Tool) -> str | None:
        """The registered name serving exactly ``tool``, if any."""
        if self._hash_of.get(tool.name) == tool.schema_hash:
            return tool.name
        alias = renamed(tool, alias_name(tool))
        if self._hash_of.get(alias.name) == alias.schema_hash:
            return alias.name
        return None

    def lookup_all(self, tools: Sequence[Tool]) -> dict[str, str] | None:
        names = {}
        for t in tools:
            got = self._lookup(t)
            if got is None:
                return None
            names[t.name] = got
        return names

    async def resolve(self, tools: Sequence[Tool], *, fresh: bool = False) -> Resolution:
        """Registered names for ``tools``, registering those not yet registered. ``fresh``: re-read the registry
        first (a Route saw a newer version than the view)."""
        if not fresh:
            names = self.lookup_all(tools)
            if names is not None:
                return Resolution(names, 0, self.version, self.size)
        async with self._lock:  # one registration at a time per front: two requests never claim one free name
            await self.refresh()
            names: dict[str, str] = {}
            new: list[Tool] = []
            aliased = 0
            for t in tools:
                got = self._lookup(t)
                if got is None:
                    got = t.name if t.name not in self._hash_of else alias_name(t)
                    aliased += got != t.name
                    new.append(renamed(t, got))
                names[t.name] = got
            if new:
                _, version, total = await self.backend.register([t.to_json() for t in new])
                for t in new:
                    self._hash_of[t.name] = t.schema_hash
                self.version = version
                if len(self._hash_of) != total:  # someone else changed the registry meanwhile: re-read it
                    await self.refresh()
                log.info("request tools registered", extra={"tools": len(new), "aliased": aliased,
                                                            "registry_version": version, "registry_size": total})
            return Resolution(names, len(new), self.version, self.size)

    def current(self, names: dict[str, str], tools: Sequence[Tool]) -> bool:
        """Whether every registered name still serves the request's tool (after a refresh)."""
        return all(self._lookup(t) == names[t.name] for t in tools)
