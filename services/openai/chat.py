"""One chat-completions turn over the cluster: register the request's tools, route among them, generate the call, or
answer in text.

``ChatService.prepare`` does everything before the first generated token (tool registration, routing) and returns
a ``Turn``; ``Turn.events`` streams the arguments (or the text: a Generate without a tool, over the whole
conversation) as the engine samples them and ends with the whole ``Answer``.
The HTTP adapter (services/openai/app.py) turns both into OpenAI JSON or server-sent events. No HTTP here.

Routing is restricted to the request's own tools: Route's ``allowed_tools`` is the registered names of the tools the
request lets the model pick (all of them, or ``tool_choice``'s ``allowed_tools`` subset); the registry may hold other
clients' tools too, and they are never candidates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from services.common.errors import NotFound, Unavailable
from services.common.tools import Tool
from services.openai.backend import Backend, Generated, Routed
from services.openai.config import OpenAIConfig
from services.openai.protocol import Answer, ChatRequest, Plan, Usage, call_id, plan, text_plan
from services.openai.toolbook import Resolution, ToolBook

log = logging.getLogger("nexus.openai")


@dataclass
class Turn:
    """A prepared turn: ``answer`` carries the id, the chosen tool (or the text) and what Nexus did."""

    answer: Answer
    plan: Plan
    registered_tool: str = ""
    max_tokens: int | None = None
    stream: bool = True  # the caller reads the pieces (False: the engine sends the result alone)

    @property
    def is_call(self) -> bool:
        return bool(self.answer.tool)


class ChatService:
    def __init__(self, config: OpenAIConfig, backend: Backend):
        self.config = config
        self.backend = backend
        self.book = ToolBook(backend)

    async def prepare(self, req: ChatRequest) -> Turn:
        t0 = time.perf_counter()
        p = plan(req)
        base = Answer(model=req.model)
        max_tokens = None if req.max_tokens is None else min(req.max_tokens, self.config.max_tokens_limit)
        if p.kind == "text":
            return Turn(replace(base, info={"answer": "text", "reason": p.reason}), p, max_tokens=max_tokens,
                        stream=req.stream)
        candidates = set(p.candidates)
        tools = [t for t in req.tools if t.name in candidates]
        res = await self.book.resolve(req.tools)
        info: dict[str, Any] = {"tools": len(req.tools), "tools_registered": res.registered,
                                "register_ms": round((time.perf_counter() - t0) * 1e3, 2)}
        gated = req.tool_choice.mode == "auto" and self.config.min_tool_score > 0
        if len(tools) == 1 and not gated:
            chosen, how = tools[0].name, "named" if req.tool_choice.mode == "named" else "single"
        else:
            chosen, how, routed, res = await self._route(req, p, tools, res)
            info.update({"route_ms": round(routed.route_ms, 3), "score": routed.score, "margin": routed.margin,
                         "gate": routed.gate, "registry_version": routed.registry_version})
            if gated and routed.score < self.config.min_tool_score:
                tp = text_plan(req, f"no tool fits: the routed tool scores {routed.score:.3f} < min_tool_score "
                                    f"{self.config.min_tool_score:g}")
                return Turn(replace(base, info={**info, "answer": "text", "reason": tp.reason}), tp,
                            max_tokens=max_tokens, stream=req.stream)
        info.update({"route": how, "tool": chosen, "registered_as": res.names[chosen],
                     "prepare_ms": round((time.perf_counter() - t0) * 1e3, 2)})
        answer = replace(base, tool=chosen, call_id=call_id(), info=info)
        return Turn(answer, p, res.names[chosen], max_tokens, req.stream)

    async def _route(self, req: ChatRequest, p: Plan, tools: list[Tool],
                     res: Resolution) -> tuple[str, str, Routed, Resolution]:
        """The chosen request tool, how it was chosen, Route's answer, and the names it holds for."""
        for attempt in range(2):
            allowed = [res.names[t.name] for t in tools]
            try:
                routed = await self.backend.route(p.query, p.history, allowed)
            except NotFound as e:
                # one of the names left the registry since it was resolved (another client removed it): register
                # it again and route once more; a second miss is the registry churning, not the caller's mistake
                if attempt:
                    raise Unavailable(f"the request's tools keep leaving the registry; retry ({e.message})") from e
                res = await self.book.resolve(req.tools, fresh=True)
                continue
            if routed.registry_version > self.book.version and attempt == 0:
                # the registry moved since the view was read (another client changed it): make sure the registered
                # names still serve the request's tools; route again only if one of them had to change
                fresh = await self.book.resolve(req.tools, fresh=True)
                if any(fresh.names[t.name] != res.names[t.name] for t in tools) or fresh.registered:
                    res = fresh
                    continue
                res = fresh
            back = {res.names[t.name]: t.name for t in tools}
            return back[routed.tool], "routed", routed, res
        raise AssertionError("unreachable")

    async def events(self, turn: Turn) -> AsyncIterator[str | Answer]:
        """The argument text (or the answer's text) in pieces, then the finished ``Answer``."""
        p = turn.plan
        result: Generated | None = None
        leading = True
        try:
            # a text turn has no registered tool: Generate then answers the conversation in text
            async for ev in self.backend.generate(p.query, turn.registered_tool, p.history, turn.max_tokens,
                                                  pieces=turn.stream):
                if isinstance(ev, Generated):
                    result = ev
                    continue
                if leading:  # the engine strips the final text: so do the pieces
                    ev = ev.lstrip()
                    if not ev:
                        continue
                    leading = False
                yield ev
        except NotFound as e:
            if not turn.is_call:
                raise
            # the tool left the registry after it was resolved (another client removed it): not the caller's
            # mistake; the view is re-read, so a retry registers it again
            self.book.invalidate()
            raise Unavailable(f"tool {turn.registered_tool!r} left the registry during the request; retry "
                              f"({e.message})") from e
        assert result is not None
        usage = Usage(result.prompt_tokens, result.completion_tokens,
                      max(0, result.spliced_tokens - result.recomputed_tokens))
        info = {**turn.answer.info, "prefill_path": result.path, "path_reason": result.path_reason,
                "generate_ms": round(result.total_ms, 2), "first_token_ms": round(result.first_token_ms, 2)}
        if not turn.is_call:
            yield replace(turn.answer, text=result.text, truncated=result.truncated, usage=usage, info=info)
            return
        info["schema_valid"] = result.schema_valid
        yield replace(turn.answer, arguments=result.arguments_json, usage=usage, info=info)
