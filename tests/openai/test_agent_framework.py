"""One agent loop end to end with a real agent framework, the OpenAI Agents SDK (``openai-agents``), pointed at the
front's ``base_url``: its tools are the shipped tools of the cluster fixture, its model SmolLM2-135M behind Nexus.
The SDK sends the conversation and every tool on each turn, runs the tool the front calls, sends the result back,
and the front answers it in text the model generates (finish_reason "stop"), which ends the loop."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from services.openai.config import OpenAIConfig
from tests.conftest import ServerThread

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def front(cluster):
    from services.openai.server import run

    server = ServerThread(run, OpenAIConfig(port=0, router_addr=cluster["router"].addr,
                                            engine_addr=cluster["engine"].addr, grace_s=0.5,
                                            backend_wait_s=60)).start()
    yield server
    server.stop()


def test_an_openai_agents_sdk_agent_calls_a_shipped_tool_through_the_front(front, small_tools):
    from agents import Agent, FunctionTool, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers
    calls: list[tuple[str, dict]] = []

    def as_function_tool(tool) -> FunctionTool:
        async def invoke(ctx, arguments: str) -> str:
            calls.append((tool.name, json.loads(arguments)))
            return f"{tool.name} ran: pull request #42 opened"

        return FunctionTool(name=tool.name, description=tool.description, params_json_schema=tool.input_schema,
                            on_invoke_tool=invoke, strict_json_schema=False)

    async def run_agent():
        client = AsyncOpenAI(base_url=f"http://{front.addr}/v1", api_key="-", max_retries=0, timeout=300)
        try:
            agent = Agent(name="nexus-agent", instructions="You help with git and GitHub. Use the tools.",
                          model=OpenAIChatCompletionsModel(model="nexus", openai_client=client),
                          tools=[as_function_tool(t) for t in small_tools])
            return await Runner.run(agent, "open a pull request from feature-x into main in octo/demo", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run_agent())
    assert [name for name, _ in calls] == ["github_create_pull_request"]
    schema = next(t.input_schema for t in small_tools if t.name == "github_create_pull_request")
    jsonschema.validate(calls[0][1], schema)
    # the tool's result went back to the front as a `tool` message; the model answered it in text, ending the loop
    # after one call (another call would have been run, and a call every turn would exhaust max_turns)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    responses = result.raw_responses
    assert len(responses) == 2  # the call, then the text answer
    assert any(getattr(item, "type", "") == "message" for item in responses[-1].output)
