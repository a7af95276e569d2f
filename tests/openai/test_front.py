"""The OpenAI-compatible front (services/openai): the request/response mapping on its own, then the official
``openai`` client against the real front over the real cluster (router, compiler, engine with SmolLM2-135M)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx2 as httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.common import errors
from services.common.errors import InvalidArgument, NexusError, NotFound
from services.common.tools import Tool
from services.openai import protocol
from services.openai.app import HTTP_STATUS, create_app
from services.openai.backend import RegisteredTool, Registry
from services.openai.config import OpenAIConfig
from services.openai.protocol import Answer, Usage, parse_body, parse_request, plan
from services.openai.toolbook import ToolBook, alias_name, renamed
from tests.conftest import ServerThread, free_port


def fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


WEATHER = fn("get_weather", "Get the current weather forecast for a city.",
             {"city": {"type": "string", "description": "City name"},
              "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])
EMAIL = fn("send_email", "Send an email message to a recipient.",
           {"to": {"type": "string", "description": "Recipient email address"},
            "subject": {"type": "string"}, "body": {"type": "string"}}, ["to", "subject"])
CALENDAR = fn("create_calendar_event", "Create an event in the user's calendar.",
              {"title": {"type": "string"}, "date": {"type": "string", "description": "Date, YYYY-MM-DD"}},
              ["title", "date"])
TRANSLATE = fn("translate_text", "Translate a text into another language.",
               {"text": {"type": "string"}, "target_language": {"type": "string"}}, ["text", "target_language"])
TOOLS = [WEATHER, EMAIL, CALENDAR]
WEATHER_Q = "What's the weather in Paris right now?"


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def parse(body: dict, **kw):
    """Through the HTTP path (the body's bytes), checked against the decoded-dict path."""
    req = parse_body(json.dumps(body).encode(), model_name="nexus", **kw)
    assert req == parse_request(body, model_name="nexus", **kw)
    return req


def schema_of(tool: dict) -> dict:
    return tool["function"]["parameters"]


# -- the mapping, without servers -----------------------------------------------------------------------------
def test_a_full_request_maps_to_the_domain():
    req = parse({"model": "nexus", "tools": TOOLS, "tool_choice": "auto", "stream": True,
                 "stream_options": {"include_usage": True}, "max_completion_tokens": 64, "temperature": 0.3,
                 "seed": 7, "parallel_tool_calls": False, "some_future_field": {"x": 1},
                 "messages": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": [{"type": "text", "text": "weather in"},
                                                           {"type": "text", "text": "Rome"}]}]})
    assert [t.name for t in req.tools] == ["get_weather", "send_email", "create_calendar_event"]
    assert req.tools[0].input_schema == schema_of(WEATHER)
    assert req.stream and req.include_usage and req.max_tokens == 64
    assert req.tool_choice == protocol.ToolChoice("auto")
    assert req.messages[1].content == "weather in\nRome"
    p = plan(req)
    assert p.kind == "call" and p.query == "weather in\nRome" and p.history == ()
    assert p.candidates == ("get_weather", "send_email", "create_calendar_event")


def test_history_keeps_earlier_turns_and_calls_as_text_without_the_system_prompt():
    req = parse({"model": "nexus", "tools": TOOLS, "tool_choice": "required", "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        {"role": "user", "content": "mail that to bob@example.com"}]})
    p = plan(req)
    assert p.query == "mail that to bob@example.com"
    assert p.history == (("user", "weather in Oslo?"), ("assistant", 'Called get_weather({"city":"Oslo"})'),
                         ("tool", "sunny, 21 C"))


def test_tool_choice_forms():
    named = parse({"model": "nexus", "messages": user("x"), "tools": TOOLS,
                   "tool_choice": {"type": "function", "function": {"name": "send_email"}}})
    assert named.tool_choice == protocol.ToolChoice("named", ("send_email",))
    assert plan(named).candidates == ("send_email",)
    allowed = parse({"model": "nexus", "messages": user("x"), "tools": TOOLS, "tool_choice": {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "send_email"}},
            {"type": "function", "function": {"name": "get_weather"}}]}}})
    assert allowed.tool_choice == protocol.ToolChoice("required", ("send_email", "get_weather"))
    assert plan(parse({"model": "nexus", "messages": user("x"), "tools": TOOLS, "tool_choice": "none"})).kind == "text"
    assert plan(parse({"model": "nexus", "messages": user("x")})).kind == "text"  # no tools: text


def test_a_text_turn_carries_the_whole_conversation_to_the_engine():
    convo = [{"role": "system", "content": "Answer in one sentence."},
             {"role": "user", "content": "weather in Oslo?"},
             {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "get_weather", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}]
    auto = plan(parse({"model": "nexus", "messages": convo, "tools": TOOLS}))
    # after a tool result: no user turn left to answer, the whole conversation (system prompt kept) is the history
    assert auto.kind == "text" and auto.reason == "after a tool result" and auto.query == ""
    assert auto.history == (("system", "Answer in one sentence."), ("user", "weather in Oslo?"),
                            ("assistant", "Called get_weather({})"), ("tool", "sunny, 21 C"))
    # required after a tool result: another call
    assert plan(parse({"model": "nexus", "messages": convo, "tools": TOOLS, "tool_choice": "required"})).kind == "call"
    none = plan(parse({"model": "nexus", "messages": convo + user("and tomorrow?"), "tools": TOOLS,
                       "tool_choice": "none"}))
    assert (none.kind, none.reason, none.query) == ("text", "tool_choice none", "and tomorrow?")
    assert none.history == auto.history
    assert plan(parse({"model": "nexus", "messages": user("hi")})).reason == "no tools"


@pytest.mark.parametrize("body, param", [
    ({"model": "nexus", "messages": []}, "messages"),
    ({"model": "nexus"}, "messages"),
    ({"model": "nexus", "messages": [{"role": "system", "content": "only a system prompt"}]}, "messages"),
    ({"model": "nexus", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": "nexus", "messages": user("x"), "tools": {"a": 1}}, "tools"),
    ({"model": "nexus", "messages": user("x"), "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]}, "tools[0].function.parameters"),
    ({"model": "nexus", "messages": user("x"), "tools": [{"type": "function", "function": {
        "name": "f", "parameters": "not a schema"}}]}, "tools[0].function.parameters"),
    ({"model": "nexus", "messages": user("x"), "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}}}}]},
     "tools[0].function.parameters"),
    ({"model": "nexus", "messages": user("x"), "tools": [{"type": "function", "function": {
        "name": "bad name!", "parameters": {"type": "object"}}}]}, "tools[0].function.name"),
    ({"model": "nexus", "messages": user("x"), "tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"model": "nexus", "messages": user("x"), "tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"model": "nexus", "messages": user("x"), "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "launch_rocket"}}}, "tool_choice"),
    ({"model": "nexus", "messages": user("x"), "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "nexus", "messages": user("x"), "tool_choice": "required"}, "tool_choice"),
    ({"model": "nexus", "messages": user("x"), "n": 2}, "n"),
    ({"model": "nexus", "messages": user("x"), "max_tokens": 0}, "max_tokens"),
    ({"model": "nexus", "messages": user("x"), "stream": "yes"}, "stream"),
])
def test_bad_requests_are_invalid_arguments_naming_the_field(body, param):
    with pytest.raises(InvalidArgument) as e:
        parse(body)
    assert type(e.value) is InvalidArgument and protocol.param_of(e.value) == param, e.value.message


def test_an_unknown_model_is_not_found_after_the_body_is_checked():
    with pytest.raises(NotFound) as e:
        parse({"model": "gpt-4o", "messages": user("x")})
    assert protocol.param_of(e.value) == "model"
    with pytest.raises(InvalidArgument):  # a malformed body stays a 400 whatever the model
        parse({"model": "gpt-4o", "messages": []})


def test_limits_on_messages_and_tools():
    with pytest.raises(InvalidArgument, match="at most 2"):
        parse({"model": "nexus", "messages": user("x") * 3}, max_messages=2)
    with pytest.raises(InvalidArgument, match="at most 2"):
        parse({"model": "nexus", "messages": user("x"), "tools": TOOLS}, max_tools=2)


def test_the_same_tools_bytes_reuse_the_checked_tools_and_a_new_list_reuses_each_known_tool(monkeypatch):
    import services.common.store as store
    import services.openai.protocol as protocol
    checked = []
    real = store.parse_tool
    monkeypatch.setattr(store, "parse_tool", lambda d: checked.append(json.loads(d)["name"]) or real(d))
    monkeypatch.setattr(protocol, "TOOL_LISTS", protocol._LRU(64))
    store.stored_tool.cache_clear()
    first = parse({"model": "nexus", "messages": user("x"), "tools": TOOLS})
    assert checked == [t["function"]["name"] for t in TOOLS]
    again = parse_body(json.dumps({"model": "nexus", "messages": user("y"), "tools": TOOLS}).encode(),
                       model_name="nexus")
    assert again.tools is first.tools and len(checked) == 3  # the whole list reused, nothing decoded or checked
    more = parse_body(json.dumps({"model": "nexus", "messages": user("y"), "tools": TOOLS + [TRANSLATE]}).encode(),
                      model_name="nexus")
    assert [t.name for t in more.tools] == [t.name for t in first.tools] + ["translate_text"]
    assert checked[3:] == ["translate_text"]  # only the new tool is checked
    with pytest.raises(InvalidArgument, match="at most 2"):  # a cached list still obeys the limit
        parse_body(json.dumps({"model": "nexus", "messages": user("y"), "tools": TOOLS}).encode(),
                   model_name="nexus", max_tools=2)


@pytest.mark.parametrize("body, message", [
    (b'{"model": "nexus", "messages": [', "not valid JSON"),
    (b'[{"model": "nexus"}]', "must be a JSON object"),
    (b'"nexus"', "must be a JSON object"),
    (b'{"model": "nexus", "messages": [{"role": "user", "content": "\xff"}]}', "not valid JSON"),  # not UTF-8
    (b'{"model": "nexus", "messages": [{"role": "user", "content": "hi"}], "tools": {"a": 1}}', "must be a list"),
])
def test_a_body_that_is_not_a_json_object_is_invalid(body, message):
    with pytest.raises(InvalidArgument, match=message):
        parse_body(body, model_name="nexus")


def test_answers_validate_as_the_openai_client_types():
    call = Answer(model="nexus", tool="get_weather", call_id="call_x", arguments='{"city": "Paris"}',
                  usage=Usage(100, 9, 40), info={"route": "routed"})
    c = ChatCompletion.model_validate(protocol.completion(call))
    assert c.choices[0].finish_reason == "tool_calls" and c.choices[0].message.content is None
    tc = c.choices[0].message.tool_calls[0]
    assert (tc.id, tc.type, tc.function.name, tc.function.arguments) == ("call_x", "function", "get_weather",
                                                                         '{"city": "Paris"}')
    assert c.usage.total_tokens == 109 and c.usage.prompt_tokens_details.cached_tokens == 40
    assert c.model_extra["nexus"] == {"route": "routed"}
    text = ChatCompletion.model_validate(protocol.completion(Answer(model="nexus", text="hello")))
    assert text.choices[0].finish_reason == "stop" and text.choices[0].message.content == "hello"
    cut = ChatCompletion.model_validate(protocol.completion(Answer(model="nexus", text="hel", truncated=True)))
    assert cut.choices[0].finish_reason == "length"
    words = Answer(model="nexus", text="hello")
    streamed = [ChatCompletionChunk.model_validate(ch) for ch in (
        protocol.text_start_chunk(words), protocol.text_chunk(words, "hel"), protocol.text_chunk(words, "lo"),
        protocol.finish_chunk(words))]
    assert streamed[0].choices[0].delta.role == "assistant" and streamed[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == "hello"
    assert streamed[-1].choices[0].finish_reason == "stop"
    chunks = [protocol.call_start_chunk(call), protocol.arguments_chunk(call, '{"city"'),
              protocol.finish_chunk(call), protocol.usage_chunk(call)]
    parsed = [ChatCompletionChunk.model_validate(ch) for ch in chunks]
    assert parsed[0].choices[0].delta.tool_calls[0].function.name == "get_weather"
    assert parsed[1].choices[0].delta.tool_calls[0].function.arguments == '{"city"'
    assert parsed[2].choices[0].finish_reason == "tool_calls" and parsed[3].choices == []
    assert parsed[3].usage.completion_tokens == 9


def test_every_error_class_has_an_http_status_and_only_a_bug_is_500():
    for cls in (errors.InvalidArgument, errors.SchemaError, errors.ResourceExhausted):
        assert HTTP_STATUS[cls.code][0] == 400
    assert HTTP_STATUS[errors.NotFound.code][0] == 404 and HTTP_STATUS[errors.Unauthenticated.code][0] == 401
    for cls in (errors.Unavailable, errors.FailedPrecondition, errors.DataCorruption):
        assert HTTP_STATUS[cls.code][0] == 503
    assert NexusError.code not in HTTP_STATUS  # INTERNAL: the one 500


class FakeRouter:
    """The registry side of the router as the front sees it: ListTools and RegisterTools, keyed by name."""

    def __init__(self, tools: list[Tool] = ()):
        self.tools = {t.name: t for t in tools}
        self.version = 1
        self.register_calls: list[list[str]] = []

    async def list_tools(self) -> Registry:
        return Registry(tuple(RegisteredTool(n, t.schema_hash) for n, t in sorted(self.tools.items())), self.version)

    async def register(self, tools_json):
        parsed = [Tool(d["name"], d["description"], d["inputSchema"]) for d in map(json.loads, tools_json)]
        self.register_calls.append([t.name for t in parsed])
        for t in parsed:
            self.tools[t.name] = t
        self.version += 1
        return [t.name for t in parsed], self.version, len(self.tools)


def test_the_toolbook_never_replaces_a_registered_tool_and_registers_only_new_ones():
    theirs = Tool("get_weather", "Another client's weather tool.", {"type": "object", "properties": {}})
    router = FakeRouter([theirs])
    book = ToolBook(router)
    ours = [Tool(t["function"]["name"], t["function"]["description"], schema_of(t)) for t in (WEATHER, EMAIL)]

    res = asyncio.run(book.resolve(ours))
    assert res.names == {"get_weather": alias_name(ours[0]), "send_email": "send_email"} and res.registered == 2
    assert router.tools["get_weather"] == theirs  # untouched
    assert router.tools[alias_name(ours[0])] == renamed(ours[0], alias_name(ours[0]))
    again = asyncio.run(book.resolve(ours))  # seen before: nothing registered, no registry call
    assert again.names == res.names and again.registered == 0 and len(router.register_calls) == 1
    # another front (or client) registered the same alias meanwhile: a fresh view finds it, nothing registered
    other = ToolBook(router)
    assert asyncio.run(other.resolve(ours)).registered == 0
    assert alias_name(ours[0]).startswith("get_weather.") and len(alias_name(ours[0])) == len("get_weather") + 13


# -- the HTTP adapter with a stand-in service: limits and error bodies ---------------------------------------
class HeldService:
    """Holds every request in prepare until released (to fill the front's concurrency slots)."""

    def __init__(self):
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def prepare(self, req):
        self.entered.set()
        await self.release.wait()
        raise RuntimeError("a bug in the service")


def test_saturation_is_429_and_a_bug_is_a_500_with_an_openai_body():
    async def main():
        svc = HeldService()

        async def health():
            return {"router": "SERVING", "engine": "SERVING"}

        app = create_app(OpenAIConfig(max_concurrent=1), svc, token=None, health=health, serving=lambda: True)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
            body = {"model": "nexus", "messages": user("hi"), "tools": TOOLS}
            first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
            await svc.entered.wait()
            second = await client.post("/v1/chat/completions", json=body)
            assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limit_error"
            svc.release.set()
            r = await first
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
            missing = await client.get("/v1/nothing")
            assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
            wrong = await client.get("/v1/chat/completions")
            assert wrong.status_code == 405 and "error" in wrong.json()

    asyncio.run(main())


# -- the real front over the real cluster ---------------------------------------------------------------------
def start_front(cluster, **kw) -> ServerThread:
    from services.openai.server import run

    cfg = OpenAIConfig(port=0, router_addr=cluster["router"].addr, engine_addr=cluster["engine"].addr, grace_s=0.5,
                       backend_wait_s=60)
    return ServerThread(run, replace(cfg, **kw)).start()


@pytest.fixture(scope="module")
def front(cluster):
    before = {t.name for t in cluster["client"].list_tools().tools}
    server = start_front(cluster)
    yield server
    server.stop()
    # leave the shared cluster's registry as the module found it (tests after this one count on it)
    added = [t.name for t in cluster["client"].list_tools().tools if t.name not in before]
    if added:
        cluster["client"].remove(added)


@pytest.fixture(scope="module")
def client(front):
    with openai.OpenAI(base_url=f"http://{front.addr}/v1", api_key="-", max_retries=0, timeout=600) as c:
        yield c


def registry(cluster) -> dict[str, str]:
    return {t.name: t.schema_hash for t in cluster["client"].list_tools().tools}


def the_call(completion, tools=TOOLS):
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    tool = next(t for t in tools if t["function"]["name"] == call.function.name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema_of(tool))
    return call.function.name, args


@pytest.mark.integration
def test_health_and_models(front, client):
    h = httpx.get(f"http://{front.addr}/health", timeout=10)
    assert h.status_code == 200 and h.json()["router"] == h.json()["engine"] == "SERVING"
    assert [m.id for m in client.models.list().data] == ["nexus"]
    assert client.models.retrieve("nexus").id == "nexus"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


@pytest.mark.integration
def test_auto_routes_among_the_requests_tools_and_keeps_the_registry(cluster, client):
    before = registry(cluster)
    r = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS)
    name, args = the_call(r)
    assert name == "get_weather" and "paris" in args["city"].lower()
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    info = r.model_extra["nexus"]
    assert info["route"] == "routed" and info["schema_valid"]
    after = registry(cluster)
    assert {k: after[k] for k in before} == before  # nothing registered before is lost or changed
    assert {"get_weather", "send_email", "create_calendar_event"} <= set(after)
    # the same tools again: already registered, nothing to register
    again = client.chat.completions.create(model="nexus", messages=user("Email alice@example.com about lunch"),
                                           tools=TOOLS)
    assert the_call(again)[0] == "send_email" and again.model_extra["nexus"]["tools_registered"] == 0


@pytest.mark.integration
def test_shipped_tools_already_registered_cost_nothing(cluster, client, small_tools):
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.input_schema}} for t in small_tools]
    r = client.chat.completions.create(model="nexus", messages=user(
        "open a pull request from feature-x into main in octo/demo"), tools=tools)
    name, _ = the_call(r, tools)
    assert name == "github_create_pull_request" and r.model_extra["nexus"]["tools_registered"] == 0


@pytest.mark.integration
def test_routing_is_restricted_to_the_requests_own_tools(cluster, client):
    client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS)  # weather registered
    others = [EMAIL, TRANSLATE]
    r = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=others)
    assert the_call(r, others)[0] in ("send_email", "translate_text")
    assert r.model_extra["nexus"]["route"] == "routed"  # Route's own answer among the allowed tools
    # a shipped tool fits better, but it is not the request's: never a candidate
    pr = client.chat.completions.create(model="nexus", messages=user(
        "open a pull request from feature-x into main in octo/demo"), tools=[WEATHER, EMAIL])
    assert the_call(pr, [WEATHER, EMAIL])[0] in ("get_weather", "send_email")


@pytest.mark.integration
def test_a_tool_whose_name_is_taken_is_served_under_an_alias_without_replacing_the_other(cluster, client):
    before = registry(cluster)
    assert "get_current_time" in before
    mine = fn("get_current_time", "Tell the current time on the user's wall clock in a given city.",
              {"city": {"type": "string"}}, ["city"])
    r = client.chat.completions.create(model="nexus", messages=user("what time is it in Tokyo?"),
                                       tools=[mine, EMAIL], tool_choice="required")
    name, _ = the_call(r, [mine, EMAIL])
    assert name == "get_current_time"
    assert r.model_extra["nexus"]["registered_as"].startswith("get_current_time.")
    assert registry(cluster)["get_current_time"] == before["get_current_time"]


@pytest.mark.integration
def test_named_and_required_tool_choice(client):
    r = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "send_email"}})
    assert the_call(r)[0] == "send_email" and r.model_extra["nexus"]["route"] == "named"
    # a generous bound, as agent frameworks send, is lowered to the engine's limit rather than refused
    r = client.chat.completions.create(model="nexus", messages=user("Put 'dentist' in my calendar on 2026-03-14"),
                                       tools=TOOLS, tool_choice="required", max_tokens=100_000)
    name, args = the_call(r)
    assert name == "create_calendar_event" and args["date"] == "2026-03-14"


def the_text(completion, finish_reason="stop") -> str:
    """A text answer the engine generated: no call, text content, the usage of a real generation."""
    choice = completion.choices[0]
    assert choice.finish_reason == finish_reason and not choice.message.tool_calls
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    info = completion.model_extra["nexus"]
    assert info["answer"] == "text" and info["prefill_path"] == "text" and "route" not in info
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    return choice.message.content


# a system prompt under which greedy SmolLM2-135M ends its answer to WEATHER_Q (without it, it runs on to max_tokens)
BRIEF = [{"role": "system", "content": "Answer in one short sentence."}]


@pytest.mark.integration
def test_tool_choice_none_answers_in_generated_text(client):
    r = client.chat.completions.create(model="nexus", messages=BRIEF + user(WEATHER_Q), tools=TOOLS,
                                       tool_choice="none")
    text = the_text(r)
    assert r.model_extra["nexus"]["reason"] == "tool_choice none"
    # no tools at all: the same prompt (tools never reach a text answer's prompt), greedy: the same text
    bare = client.chat.completions.create(model="nexus", messages=BRIEF + user(WEATHER_Q))
    assert the_text(bare) == text and bare.model_extra["nexus"]["reason"] == "no tools"
    assert bare.usage == r.usage
    # the system prompt is the model's: without it, another prompt and another answer
    plain = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS,
                                           tool_choice="none", max_tokens=32)
    assert the_text(plain, plain.choices[0].finish_reason) != text
    assert plain.usage.prompt_tokens != r.usage.prompt_tokens


@pytest.mark.integration
def test_a_tool_result_turn_answers_in_text_then_required_calls_again(client):
    first = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    convo = user(WEATHER_Q) + [first.choices[0].message.model_dump(exclude_none=True),
                               {"role": "tool", "tool_call_id": call.id, "content": "Paris: sunny, 24 C"}]
    r = client.chat.completions.create(model="nexus", messages=convo, tools=TOOLS)
    text = the_text(r)
    assert r.model_extra["nexus"]["reason"] == "after a tool result"
    # the model read the call and its result: a longer prompt than the question alone
    alone = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS, tool_choice="none",
                                           max_tokens=1)
    assert r.usage.prompt_tokens > alone.usage.prompt_tokens + 10
    convo += [{"role": "assistant", "content": text},
              {"role": "user", "content": "Email that forecast to tom@example.com with subject Weather"}]
    name, args = the_call(client.chat.completions.create(model="nexus", messages=convo, tools=TOOLS))
    # (how well the 135M model copies the address after the model's own sentence is the argument benchmark's)
    assert name == "send_email" and args["to"].startswith("tom")


@pytest.mark.integration
def test_a_text_answer_streams_in_content_chunks(client):
    whole = client.chat.completions.create(model="nexus", messages=BRIEF + user(WEATHER_Q), tools=TOOLS,
                                           tool_choice="none")
    stream = client.chat.completions.create(model="nexus", messages=BRIEF + user(WEATHER_Q), tools=TOOLS,
                                            tool_choice="none", stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2  # in pieces, as sampled
    assert "".join(pieces).strip() == whole.choices[0].message.content
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


@pytest.mark.integration
def test_a_text_answer_cut_at_max_tokens_finishes_with_length(client):
    r = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), max_tokens=3)
    the_text(r, finish_reason="length")
    assert r.usage.completion_tokens == 3


@pytest.mark.integration
def test_streaming_a_call_in_openai_chunks(client):
    whole = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS)
    stream = client.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    head = chunks[0].choices[0].delta
    assert head.role == "assistant" and head.tool_calls[0].function.name == "get_weather"
    assert head.tool_calls[0].id.startswith("call_") and head.tool_calls[0].function.arguments == ""
    pieces = [c.choices[0].delta.tool_calls[0].function.arguments for c in chunks[1:]
              if c.choices and c.choices[0].delta.tool_calls]
    assert len(pieces) > 2  # in pieces, as sampled
    assert json.loads("".join(pieces)) == json.loads(whole.choices[0].message.tool_calls[0].function.arguments)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


@pytest.mark.integration
def test_the_stream_ends_with_done_and_a_text_turn_streams_too(front):
    body = {"model": "nexus", "messages": BRIEF + user(WEATHER_Q), "tools": TOOLS, "tool_choice": "none",
            "stream": True}
    with httpx.stream("POST", f"http://{front.addr}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1]).strip()
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.integration
def test_bad_inputs_are_4xx_openai_errors_and_leave_the_registry_alone(cluster, front, client):
    before = registry(cluster)
    bad_schema = fn("broken", "x", {}, [])
    bad_schema["function"]["parameters"] = {"type": "object", "properties": {"a": {"type": "nope"}}}
    cases = [
        dict(messages=[], tools=TOOLS),
        dict(messages=user("x"), tools=[bad_schema]),
        dict(messages=user("x"), tools=[{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}]),
        dict(messages=user("x"), tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
    ]
    for kw in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="nexus", **kw)
        assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error", kw
        assert e.value.body["message"]
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=user(WEATHER_Q), tools=TOOLS)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    raw = httpx.post(f"http://{front.addr}/v1/chat/completions", content=b'{"model": "nexus", "messages": [',
                     headers={"content-type": "application/json"}, timeout=30)
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    # a request over the services' length limit is the caller's too: 400
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="nexus", messages=user("weather " * 3000), tools=TOOLS,
                                       tool_choice="required")
    assert registry(cluster) == before


@pytest.mark.integration
def test_a_configured_token_is_required(cluster):
    server = start_front(cluster, auth_token="s3cret")
    try:
        base = f"http://{server.addr}/v1"
        with openai.OpenAI(base_url=base, api_key="wrong", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError) as e:
                bad.models.list()
            assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
        assert httpx.post(f"{base}/chat/completions", json={}, timeout=10).status_code == 401
        with openai.OpenAI(base_url=base, api_key="s3cret", max_retries=0) as good:
            assert [m.id for m in good.models.list().data] == ["nexus"]
        assert httpx.get(f"http://{server.addr}/health", timeout=10).status_code == 200  # health stays open
    finally:
        server.stop()


@pytest.mark.integration
def test_a_backend_that_is_down_is_503(cluster):
    dead = f"127.0.0.1:{free_port()}"
    server = start_front(cluster, router_addr=dead, engine_addr=dead, backend_wait_s=0.2)
    try:
        assert httpx.get(f"http://{server.addr}/health", timeout=10).status_code == 503
        with openai.OpenAI(base_url=f"http://{server.addr}/v1", api_key="-", max_retries=0) as c:
            with pytest.raises(openai.InternalServerError) as e:
                c.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS)
        assert e.value.status_code == 503 and e.value.body["type"] == "server_error"
    finally:
        server.stop()



@pytest.mark.integration
@pytest.mark.parametrize("cmd", [["-m", "services.openai"], ["-m", "cli.main", "serve", "openai"]],
                         ids=["python-m", "nexus-serve"])
def test_the_front_serves_from_its_main_and_nexus_serve_and_stops_cleanly_on_sigterm(cmd):
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import REPO

    dead = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "NEXUS_OPENAI_BACKEND_WAIT_S": "0.1", "NEXUS_OPENAI_MODEL_NAME": "m1"}
    proc = subprocess.Popen([sys.executable, *cmd, "--port", "0", "--router", dead, "--engine", dead], cwd=REPO,
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:  # JSON log lines: the bound port, then "serving"
            rec = json.loads(line) if line.startswith("{") else {}
            if rec.get("msg") == "listening":
                port = rec["port"]
            if rec.get("msg") == "serving":
                break
        assert port, "no listening line"
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 503  # no backends
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["m1"]  # NEXUS_OPENAI_* env read
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def test_a_flag_of_another_service_is_a_config_error():
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-m", "services.openai", "--store", "var/store"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "store_url" in out.stderr


@pytest.mark.integration
def test_auto_answers_in_text_when_no_tool_scores_the_minimum(cluster):
    """min_tool_score: with "auto", a request whose routed tool scores below it gets text (the score and the reason
    in the answer's nexus info); "required" still calls a tool. Scores are cosines: 10 is never reached."""
    server = start_front(cluster, min_tool_score=10.0)
    try:
        with openai.OpenAI(base_url=f"http://{server.addr}/v1", api_key="-", max_retries=0, timeout=600) as c:
            r = c.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS, max_tokens=16)
            the_text(r, r.choices[0].finish_reason)
            info = r.model_extra["nexus"]
            assert info["reason"].startswith("no tool fits: the routed tool scores") and info["score"] < 10
            one = c.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS[:1], max_tokens=16)
            assert one.model_extra["nexus"]["reason"].startswith("no tool fits")  # one tool is routed too
            req = c.chat.completions.create(model="nexus", messages=user(WEATHER_Q), tools=TOOLS,
                                            tool_choice="required")
            the_call(req)
    finally:
        server.stop()
