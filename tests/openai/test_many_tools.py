"""An agent's first request carrying many new tools, through the front on a cluster of its own (a fresh store, an
empty registry): the tools are registered with what routing and generation need, their KV blocks compile in the
background (the engine prefills a signature as text until its block is stored, then splices it), and the same tools
again cost no registration. Timings are bench/openai_front.py's (reports/openai_front.json), not asserted here."""

from __future__ import annotations

import json
import time

import grpc
import jsonschema
import openai
import pytest

from nexus.v1 import compiler_pb2, compiler_pb2_grpc
from services.openai.config import OpenAIConfig
from tests.conftest import ServerThread, load_bench, start_compiler, start_engine, start_router

pytestmark = pytest.mark.integration

bench = load_bench("openai_front")


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    from services.openai.server import run

    store = str(tmp_path_factory.mktemp("fresh-store"))
    compiler = start_compiler(store)  # KV blocks on, as served
    engine = start_engine(store)
    router = start_router(store, compiler.addr)
    front = ServerThread(run, OpenAIConfig(port=0, router_addr=router.addr, engine_addr=engine.addr, grace_s=0.5,
                                           backend_wait_s=60)).start()
    yield {"compiler": compiler, "engine": engine, "router": router, "front": front}
    for s in (front, router, engine, compiler):  # the compiler drops the blocks still queued
        s.stop()


@pytest.fixture(scope="module")
def client(fresh):
    with openai.OpenAI(base_url=f"http://{fresh['front'].addr}/v1", api_key="-", max_retries=0, timeout=600) as c:
        yield c


def the_call(r, tools):
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    tool = next(t for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    return call.function.name


def mcp_json(tool: dict) -> str:
    fn = tool["function"]
    return json.dumps({"name": fn["name"], "description": fn["description"], "inputSchema": fn["parameters"]})


def test_a_new_tool_is_called_at_once_and_spliced_once_its_block_is_compiled(fresh, client):
    tools = [t for t in bench.synthetic_tools(300, "solo") if t["function"]["name"] == "solo_create_invoice"]
    query, expected = bench.request_for("solo")
    r = client.chat.completions.create(model="nexus", messages=[{"role": "user", "content": query}], tools=tools)
    assert the_call(r, tools) == expected and r.model_extra["nexus"]["tools_registered"] == 1
    # the block compiles in the compiler's background; a cached Compile says when it is stored
    compiler = compiler_pb2_grpc.CompilerServiceStub(grpc.insecure_channel(fresh["compiler"].addr))
    deadline = time.monotonic() + 180
    while True:
        c = compiler.Compile(compiler_pb2.CompileRequest(tool=mcp_json(tools[0]), defer_kv_block=True), timeout=30)
        if not c.kv_block_pending:
            break
        assert time.monotonic() < deadline, "the KV block was not compiled in the background"
        time.sleep(0.5)
    assert compiler_pb2.ARTIFACT_KIND_KV_BLOCK in {a.kind for a in c.artifacts}
    again = client.chat.completions.create(model="nexus", messages=[{"role": "user", "content": query}], tools=tools)
    info = again.model_extra["nexus"]
    assert info["tools_registered"] == 0 and info["prefill_path"] == "splice", info


def test_300_new_tools_then_the_same_300_again(fresh, client):
    """Runs last in the module: its 300 KV blocks are still compiling when the cluster stops."""
    tools = bench.synthetic_tools(300, "acme")
    assert len({t["function"]["name"] for t in tools}) == 300
    query, expected = bench.request_for("acme")
    messages = [{"role": "user", "content": query}]
    first = client.chat.completions.create(model="nexus", messages=messages, tools=tools)
    name = the_call(first, tools)
    info = first.model_extra["nexus"]
    assert info["tools_registered"] == 300 and info["route"] == "routed" and info["schema_valid"]
    again = client.chat.completions.create(model="nexus", messages=messages, tools=tools)
    assert again.model_extra["nexus"]["tools_registered"] == 0
    assert the_call(again, tools) == name  # same request, same registry: same tool
    assert name == expected  # the tool the request names (a routing sanity check, not a benchmark)
