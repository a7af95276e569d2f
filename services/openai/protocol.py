"""The OpenAI chat-completions wire format, mapped to and from Nexus's domain: no HTTP framework, no protobuf.

``parse_body`` (the HTTP body's bytes) and ``parse_request`` (a decoded body) turn a request into a ``ChatRequest`` (raising ``InvalidArgument`` / ``NotFound``
whose ``param`` attribute names the offending field, as OpenAI's error body does); ``plan`` decides what the
answer is (a routed tool call, a named tool call, or a text answer the engine generates without a tool, over the
whole conversation); the ``completion`` / ``*_chunk`` builders write the
answer back in OpenAI's shapes. Fields the request may carry but Nexus cannot honour are accepted and ignored, as
OpenAI-compatible servers do (``IGNORED_FIELDS``); unknown fields are ignored too."""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from services.common.errors import InvalidArgument, NexusError, NotFound
from services.common.store import stored_tool
from services.common.tools import NAME_RE, Tool, parse_tool

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
CHOICES = ("auto", "none", "required")
# accepted, but the engine decodes greedily, one call per turn, arguments as JSON only
IGNORED_FIELDS = ("temperature", "top_p", "seed", "parallel_tool_calls", "stop", "presence_penalty",
                  "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "response_format", "user",
                  "metadata", "store", "service_tier", "reasoning_effort", "prediction", "modalities", "audio")


def invalid(param: str | None, message: str) -> InvalidArgument:
    """A 400 naming the request field at fault (OpenAI's ``error.param``)."""
    err = InvalidArgument(message)
    err.param = param  # type: ignore[attr-defined]
    return err


def param_of(err: NexusError) -> str | None:
    return getattr(err, "param", None)


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made earlier in the conversation."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True)
class ToolChoice:
    """``mode``: auto / none / required / named; ``names``: the tools it may pick from (empty = all the request's):
    the named function, or the ``allowed_tools`` subset."""

    mode: str = "auto"
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None


@dataclass(frozen=True)
class Plan:
    """What the answer is. ``kind``: "call" (route among ``candidates``, or the single one, then generate) or
    "text" (the engine answers the conversation in text, no tool; ``reason`` says why). ``query`` / ``history``:
    the last user turn and the other turns as (role, content), oldest first; for a call the system prompts are left
    out, for text they are kept and ``query`` is empty when the conversation ends with a tool result."""

    kind: str
    query: str = ""
    history: tuple[tuple[str, str], ...] = ()
    candidates: tuple[str, ...] = ()
    reason: str = ""


# -- request ------------------------------------------------------------------------------------------------
def _text(content: Any, param: str) -> str:
    """A message's content as text: a string, null, or a list of parts whose text parts are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise invalid(f"{param}[{j}].text", "a text part needs a string 'text'")
                out.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "refusal":
                out.append(str(part.get("refusal", "")))
            else:
                raise invalid(f"{param}[{j}]", "only text content parts are supported")
        return "\n".join(out)
    raise invalid(param, f"content must be a string, null or a list of parts, got {type(content).__name__}")


def _message(i: int, raw: Any) -> Message:
    p = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise invalid(p, f"{p} must be an object")
    role = raw.get("role")
    if role not in ROLES:
        raise invalid(f"{p}.role", f"{p}.role must be one of {', '.join(ROLES)}, got {role!r}")
    content = _text(raw.get("content"), f"{p}.content")
    calls: list[ToolCall] = []
    if role == "assistant" and raw.get("tool_calls") is not None:
        if not isinstance(raw["tool_calls"], list):
            raise invalid(f"{p}.tool_calls", "tool_calls must be a list")
        for j, c in enumerate(raw["tool_calls"]):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise invalid(f"{p}.tool_calls[{j}]", "a tool call needs function.name")
            args = fn.get("arguments", "")
            calls.append(ToolCall(str(c.get("id", "")), fn["name"],
                                  args if isinstance(args, str) else json.dumps(args)))
    if role == "assistant" and not content and not calls and raw.get("function_call") is not None:
        fc = raw["function_call"]
        if isinstance(fc, dict) and isinstance(fc.get("name"), str):
            calls.append(ToolCall("", fc["name"], str(fc.get("arguments", ""))))
    if role == "function":  # the deprecated form of a tool result
        role = "tool"
    return Message(role, content, tuple(calls), str(raw.get("tool_call_id") or ""), str(raw.get("name") or ""))


class _LRU(OrderedDict):
    """At most ``size`` entries, the least recently used evicted."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def hit(self, key: Any) -> Any:
        got = self.get(key)
        if got is not None:
            self.move_to_end(key)
        return got

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)


# What checking tools costs, paid once. An agent sends the same tools on every turn, and checking a JSON Schema costs
# ~1 ms (300 ms for 300 tools): a request whose ``tools`` are byte for byte those of a recent request reuses that
# request's tools whole (nothing decoded or checked again: ~0.1 ms for 300 tools); a new list (a tool added) still
# reuses each tool seen before, by its canonical JSON (``stored_tool``, the memo the engine reads its tools through).
TOOL_LISTS = _LRU(64)  # raw JSON of a request's tools (bytes) -> tuple of Tools


def _tool(name: str, description: str, params: Any) -> Tool:
    raw = {"name": name, "description": description, "inputSchema": params}
    try:
        key = json.dumps(raw, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return parse_tool(raw)  # not JSON: parse_tool says what is wrong
    return stored_tool(key)


def _tools(raw: Any, max_tools: int) -> tuple[Tool, ...]:
    if isinstance(raw, msgspec.Raw):  # undecoded (parse_body): the same bytes as a recent request's, the same tools
        key = bytes(raw)
        if (got := TOOL_LISTS.hit(key)) is not None and len(got) <= max_tools:
            return got
        try:
            tools = _tools(msgspec.json.decode(key), max_tools)
        except msgspec.DecodeError as e:  # not reached: the envelope's decoding checked the whole body
            raise invalid("tools", f"tools is not valid JSON: {e}") from e
        TOOL_LISTS.put(key, tools)
        return tools
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid("tools", "tools must be a list")
    if len(raw) > max_tools:
        raise invalid("tools", f"{len(raw)} tools; this server takes at most {max_tools} per request")
    out: list[Tool] = []
    seen: set[str] = set()
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise invalid(f"{p}.type", f"{p}: only tools of type 'function' are supported")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise invalid(f"{p}.function", f"{p}.function must be an object")
        name, desc = fn.get("name"), fn.get("description") or ""
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise invalid(f"{p}.function.name", f"{p}: function.name must match {NAME_RE.pattern}, got {name!r}")
        if not isinstance(desc, str):
            raise invalid(f"{p}.function.description", f"{p}: function.description must be a string")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        try:
            tool = _tool(name, desc, params)
        except InvalidArgument as e:  # SchemaError included: parameters is not a JSON Schema object
            raise invalid(f"{p}.function.parameters", f"{p}: {e.message.replace('inputSchema', 'parameters')}") from e
        if tool.name in seen:
            raise invalid(f"{p}.function.name", f"{p}: duplicate tool name {tool.name!r}")
        seen.add(tool.name)
        out.append(tool)
    return tuple(out)


def _function_name(raw: Any, param: str) -> str:
    fn = raw.get("function") if isinstance(raw, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else raw.get("name") if isinstance(raw, dict) else None
    if not isinstance(name, str) or not name:
        raise invalid(param, f"{param} must name a function: {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
    return name


def _tool_choice(raw: Any, tools: tuple[Tool, ...]) -> ToolChoice:
    known = {t.name for t in tools}
    if raw is None:
        return ToolChoice("auto")
    if isinstance(raw, str):
        if raw not in CHOICES:
            raise invalid("tool_choice", f"tool_choice must be one of {', '.join(CHOICES)} or a named function, "
                                         f"got {raw!r}")
        if raw == "required" and not tools:
            raise invalid("tool_choice", "tool_choice 'required' needs tools")
        return ToolChoice(raw)
    if not isinstance(raw, dict):
        raise invalid("tool_choice", "tool_choice must be a string or an object")
    if raw.get("type") == "allowed_tools":
        spec = raw.get("allowed_tools") if isinstance(raw.get("allowed_tools"), dict) else raw
        mode = spec.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid("tool_choice.allowed_tools.mode", f"mode must be auto or required, got {mode!r}")
        entries = spec.get("tools")
        if not isinstance(entries, list) or not entries:
            raise invalid("tool_choice.allowed_tools.tools", "allowed_tools needs a non-empty list of tools")
        names = tuple(_function_name(e, f"tool_choice.allowed_tools.tools[{j}]") for j, e in enumerate(entries))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise invalid("tool_choice", f"tool_choice allows {unknown[0]!r}, which is not in tools")
        return ToolChoice(mode, tuple(dict.fromkeys(names)))
    if raw.get("type", "function") != "function":
        raise invalid("tool_choice.type", f"tool_choice type {raw.get('type')!r} is not supported")
    name = _function_name(raw, "tool_choice")
    if name not in known:
        raise invalid("tool_choice", f"tool_choice names function {name!r}, which is not in tools")
    return ToolChoice("named", (name,))


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise invalid(key, f"{key} must be a positive integer, got {v!r}")
        return v
    return None


# The body fields parse_request reads; parse_body decodes these and leaves ``tools`` as raw JSON (all others ignored).
_BODY_FIELDS = ("model", "messages", "functions", "tool_choice", "function_call", "n", "stream", "stream_options",
                "max_tokens", "max_completion_tokens")
_Envelope = msgspec.defstruct("_Envelope", [("tools", msgspec.Raw, msgspec.Raw(b"null"))]
                              + [(f, Any, msgspec.UNSET) for f in _BODY_FIELDS])
_ENVELOPE = msgspec.json.Decoder(_Envelope)


def parse_body(body: bytes, *, model_name: str, max_messages: int = 1000, max_tools: int = 1000) -> ChatRequest:
    """``parse_request`` of an HTTP body's bytes. Only the fields Nexus reads are decoded; ``tools`` is decoded only
    when its bytes differ from a recent request's (an agent resends the same tools every turn)."""
    try:
        env = _ENVELOPE.decode(body)
    except msgspec.ValidationError as e:  # valid JSON, but not an object
        raise invalid(None, "the request body must be a JSON object") from e
    except msgspec.DecodeError as e:
        raise invalid(None, f"the request body is not valid JSON: {e}") from e
    fields = {f: v for f in _BODY_FIELDS if (v := getattr(env, f)) is not msgspec.UNSET}
    return parse_request({**fields, "tools": env.tools}, model_name=model_name, max_messages=max_messages,
                         max_tools=max_tools)


def parse_request(body: Any, *, model_name: str, max_messages: int = 1000, max_tools: int = 1000) -> ChatRequest:
    """Validate an OpenAI chat-completions request body (already JSON-decoded)."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model", "model is required")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise invalid("messages", "messages must be a non-empty list")
    if len(raw_messages) > max_messages:
        raise invalid("messages", f"{len(raw_messages)} messages; this server takes at most {max_messages}")
    messages = tuple(_message(i, m) for i, m in enumerate(raw_messages))
    if not any(m.role == "user" and m.content.strip() for m in messages):
        raise invalid("messages", "messages must contain a user message with text")
    tools = _tools(body.get("tools"), max_tools)
    if not tools and body.get("functions"):  # the deprecated form
        tools = _tools([{"type": "function", "function": f} for f in body["functions"]]
                       if isinstance(body["functions"], list) else body["functions"], max_tools)
    choice = _tool_choice(body.get("tool_choice", body.get("function_call")), tools)
    n = body.get("n")
    if n is not None and n != 1:
        raise invalid("n", "only n = 1 is supported")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("stream", "stream must be a boolean")
    opts = body.get("stream_options") or {}
    include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
    req = ChatRequest(model=model, messages=messages, tools=tools, tool_choice=choice, stream=stream,
                      include_usage=include_usage, max_tokens=_max_tokens(body))
    if model != model_name:  # after the body is known well-formed: a 400 outranks a 404
        err = NotFound(f"the model {model!r} does not exist; this server serves {model_name!r}")
        err.param = "model"  # type: ignore[attr-defined]
        raise err
    return req


# -- what to answer -----------------------------------------------------------------------------------------
def _turn(m: Message) -> tuple[str, str]:
    """A message as the (role, content) turn Route and Generate read: calls the assistant made become text."""
    if m.role == "assistant" and m.tool_calls:
        calls = "; ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        return "assistant", (m.content + "\n" if m.content else "") + f"Called {calls}"
    return m.role, m.content


def trailing_tool_results(messages: tuple[Message, ...]) -> list[Message]:
    """The tool results the conversation ends with (answered after the assistant's last calls)."""
    out: list[Message] = []
    for m in reversed(messages):
        if m.role != "tool":
            break
        out.append(m)
    return out[::-1]


def text_plan(req: ChatRequest, reason: str) -> Plan:
    """A text answer over the whole conversation: every message a (role, content) turn, system prompts included,
    the last one the query when it is the user's."""
    msgs = [m for m in req.messages if m.content.strip() or m.tool_calls]
    query = msgs[-1].content if msgs[-1].role == "user" else ""
    rest = msgs[:-1] if query else msgs
    return Plan("text", query=query, history=tuple(_turn(m) for m in rest), reason=reason)


def plan(req: ChatRequest) -> Plan:
    """Text for ``none`` / no tools / ``auto`` after a tool result; else a call among the allowed tools. (The
    front answers in text when the routed tool scores below ``min_tool_score``, services/openai/chat.py.)"""
    choice = req.tool_choice
    if choice.mode == "none":
        return text_plan(req, "tool_choice none")
    if not req.tools:
        return text_plan(req, "no tools")
    if choice.mode in ("auto",) and trailing_tool_results(req.messages):
        return text_plan(req, "after a tool result")
    last_user = max(i for i, m in enumerate(req.messages) if m.role == "user" and m.content.strip())
    history = tuple(_turn(m) for i, m in enumerate(req.messages)
                    if i != last_user and m.role not in ("system", "developer") and (m.content or m.tool_calls))
    candidates = choice.names or tuple(t.name for t in req.tools)
    return Plan("call", query=req.messages[last_user].content, history=history, candidates=candidates)


# -- response -----------------------------------------------------------------------------------------------
def completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # prompt tokens the engine did not prefill (spliced from the tool's compiled KV block, less its repair)
    cached_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass(frozen=True)
class Answer:
    """A whole answer: one tool call (``tool`` set) or text."""

    model: str
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))
    tool: str = ""
    call_id: str = ""
    arguments: str = ""
    text: str = ""
    # a text answer that stopped at max_tokens rather than at the model's end of turn
    truncated: bool = False
    usage: Usage = Usage()
    # what Nexus did (route, prefill path, timings): returned under the non-standard "nexus" key
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool else "length" if self.truncated else "stop"


def completion(a: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None if a.tool else a.text, "refusal": None}
    if a.tool:
        message["tool_calls"] = [{"id": a.call_id, "type": "function",
                                  "function": {"name": a.tool, "arguments": a.arguments}}]
    out = {"id": a.id, "object": "chat.completion", "created": a.created, "model": a.model,
           "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": a.finish_reason}],
           "usage": a.usage.to_json()}
    if a.info:
        out["nexus"] = a.info
    return out


def _chunk(a: Answer, delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    return {"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model,
            "choices": choices}


def call_start_chunk(a: Answer) -> dict[str, Any]:
    """The first chunk of a streamed call: the role and the call's id and name, its arguments still empty."""
    return _chunk(a, {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": a.call_id, "type": "function", "function": {"name": a.tool, "arguments": ""}}]})


def arguments_chunk(a: Answer, piece: str) -> dict[str, Any]:
    return _chunk(a, {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})


def text_start_chunk(a: Answer) -> dict[str, Any]:
    """The first chunk of a streamed text answer: the role, no text yet."""
    return _chunk(a, {"role": "assistant", "content": ""})


def text_chunk(a: Answer, text: str) -> dict[str, Any]:
    return _chunk(a, {"content": text})


def finish_chunk(a: Answer) -> dict[str, Any]:
    out = _chunk(a, {}, a.finish_reason)
    if a.info:
        out["nexus"] = a.info
    return out


def usage_chunk(a: Answer) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
    out = _chunk(a, None)
    out["usage"] = a.usage.to_json()
    return out


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def models_list(model_name: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_card(model_name, created)]}


def model_card(model_name: str, created: int) -> dict[str, Any]:
    return {"id": model_name, "object": "model", "created": created, "owned_by": "nexus"}
