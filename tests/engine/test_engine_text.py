"""Text answers (a Generate without a tool): the conversation as chat messages, then the real SmolLM2 model answering
it greedily, no grammar, alongside tool calls on the same context."""

import json

import pytest

from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.store import LocalStore
from services.engine.config import EngineConfig
from services.engine.engine import Engine, Result, Token
from services.engine.text import TOOL_RESULT, TextResult, chat_messages, droppable
from services.runtime.prompt import Turn


def test_the_conversation_becomes_chat_messages_any_template_takes():
    history = [Turn("system", "Be brief."), Turn("user", "weather in Oslo?"),
               Turn("assistant", 'Called get_weather({"city": "Oslo"})'), Turn("tool", "sunny, 21 C"),
               Turn("tool", "wind 3 m/s"), Turn("developer", "No emojis."), Turn("user", "   ")]
    msgs = chat_messages(history, "and tomorrow?")
    assert msgs == [
        {"role": "system", "content": "Be brief.\n\nNo emojis."},  # the system turns first, joined
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": 'Called get_weather({"city": "Oslo"})'},
        # tool results are user turns (not every template knows a tool role), consecutive ones joined
        {"role": "user", "content": f"{TOOL_RESULT}sunny, 21 C\n\n{TOOL_RESULT}wind 3 m/s\n\nand tomorrow?"}]
    assert droppable(msgs) == 1  # never the system prompt
    assert chat_messages([Turn("user", "hi")], "") == [{"role": "user", "content": "hi"}]
    assert droppable([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]) is None
    assert droppable([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]) == 0


@pytest.fixture(scope="module")
def engine(tmp_path_factory, small_tools):
    store = LocalStore(tmp_path_factory.mktemp("estore"))
    store.registry_put(small_tools)
    return Engine(EngineConfig(store_url=str(store.root)), store)


def answer(engine, query, history=(), **kw) -> tuple[list[str], TextResult]:
    events = list(engine.generate_text(query, history, **kw))
    tokens = [e.text for e in events if isinstance(e, Token)]
    (result,) = [e for e in events if isinstance(e, TextResult)]
    assert len(events) == len(tokens) + 1 and events[-1] is result
    return tokens, result


def call(engine, query, tool) -> str:
    (result,) = [e for e in engine.generate(query, tool) if isinstance(e, Result)]
    return result.arguments_json


def test_a_text_answer_streams_ends_its_turn_and_is_deterministic(engine):
    # (greedy SmolLM2-135M ends this one; others it runs on to max_tokens: test_max_tokens_cuts_the_answer)
    tokens, result = answer(engine, "What is 2 + 2?")
    assert len(tokens) > 2 and "".join(tokens).strip() == result.text and result.text
    assert not result.truncated and result.completion_tokens < engine.config.default_max_tokens
    assert result.prompt_tokens > 5 and 0 < result.first_token_ms <= result.total_ms
    assert answer(engine, "What is 2 + 2?")[1].text == result.text
    with pytest.raises(ValueError):
        json.loads(result.text)  # prose, not a grammar's JSON


def test_the_history_and_a_tool_result_reach_the_prompt(engine):
    _, alone = answer(engine, "What is the weather in Paris?")
    history = [Turn("system", "You report the weather."), Turn("user", "What is the weather in Paris?"),
               Turn("assistant", 'Called get_weather({"city": "Paris"})'), Turn("tool", "Paris: sunny, 24 C")]
    _, after = answer(engine, "", history)
    assert after.text and after.prompt_tokens > alone.prompt_tokens + 10


def test_max_tokens_cuts_the_answer(engine):
    tokens, result = answer(engine, "Write a long story about a dragon.", max_tokens=5)
    assert result.truncated and result.completion_tokens == 5 and tokens


def test_text_answers_leave_tool_calls_as_they_were(engine):
    """The text path decodes into the same live sequence: a call before and after one gives the same arguments."""
    query, tool = "open a pull request from feature-x into main in octo/demo", "github_create_pull_request"
    before = call(engine, query, tool)
    answer(engine, "Tell me a joke.")
    assert call(engine, query, tool) == before
    answer(engine, "Tell me a joke.")
    assert call(engine, "show the git status of /home/me/repo", "git_status") == call(
        engine, "show the git status of /home/me/repo", "git_status")


def test_a_conversation_over_the_context_loses_its_oldest_turns(tmp_path, small_tools):
    store = LocalStore(tmp_path)
    store.registry_put(small_tools)
    small = Engine(EngineConfig(store_url=str(store.root), n_ctx=1024, warm_heads=1), store)
    try:
        turn = "tell me about the weather in a few words " * 10  # ~90 tokens per turn
        history = [Turn("system", "Be brief.")] + [Turn("user" if i % 2 == 0 else "assistant", turn)
                                                   for i in range(20)]
        _, result = answer(small, "What was my question?", history, max_tokens=16)
        assert result.dropped_turns > 0 and result.prompt_tokens + 16 <= small.n_ctx
        assert result.completion_tokens > 0
        with pytest.raises(ResourceExhausted):
            answer(small, "x " * 1000)  # the last turn alone does not fit (~1,000 tokens + 256)
        # and the engine still calls tools after both
        json.loads(call(small, "show the git status of /home/me/repo", "git_status"))
    finally:
        small.close()


def test_nothing_to_answer_and_bad_bounds_are_invalid(engine):
    with pytest.raises(InvalidArgument):
        answer(engine, "  ", [Turn("system", "only a system prompt")])
    with pytest.raises(InvalidArgument):
        answer(engine, "hi", max_tokens=-1)
    with pytest.raises(InvalidArgument):
        answer(engine, "x" * (engine.config.max_query_chars + 1))
