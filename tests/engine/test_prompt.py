import json

from services.engine.engine import JsonObjectTracker
from services.runtime.prompt import ChatTemplate, Turn, build_messages, prune_history, split_prompt, surrogate


def test_prune_keeps_recent_turns_and_replaces_tool_payloads():
    payload = json.dumps([{"id": i, "title": "x" * 50} for i in range(100)])
    hist = [Turn("user", f"turn {i}") for i in range(10)] + [Turn("tool", payload), Turn("user", "merge it")]
    out = prune_history(hist, max_turns=3, turn_chars=200)
    assert [t.content for t in out][-1] == "merge it"
    assert len(out) == 3
    tool_turn = out[1]
    assert tool_turn.content.startswith("Tool result: [tool output: JSON list with 100 items")
    assert len(tool_turn.content) < 200


def test_surrogate_keeps_short_payloads_verbatim():
    assert surrogate("ok", 100) == "ok"


def test_chatml_fallback_renders_generation_prompt():
    text = ChatTemplate(None).render(build_messages("f(a: str)", "do it", []))
    assert text.endswith("<|im_start|>assistant\n")
    assert "<|im_start|>user\nFunction: f(a: str)\nRequest: do it<|im_end|>" in text


def test_split_prompt_cuts_around_the_view_and_keeps_the_head_constant():
    tpl = ChatTemplate(None)
    a = split_prompt(tpl, "f(a: str)", "do it", [])
    b = split_prompt(tpl, "g(b?: int)", "something else entirely", [])
    assert a.head + a.view + a.tail == tpl.render(build_messages("f(a: str)", "do it", []))
    assert a.head == b.head and a.head.endswith("Function:") and a.view == " f(a: str)"
    assert a.tail.startswith("\nRequest: do it")
    with_history = split_prompt(tpl, "f(a: str)", "do it", [Turn("user", "earlier")])
    assert with_history.head != a.head and "earlier" in with_history.head


def test_tracker_finds_first_value_and_end():
    tr = JsonObjectTracker()
    hits = [tr.feed(p) for p in ['{"', 'own', 'er":', ' "', 'octo', '", "x": {"a": "}"}', "}"]]
    assert hits.index(True) == 3  # the token that opens the first value
    assert tr.done


def test_tracker_empty_object():
    tr = JsonObjectTracker()
    assert not tr.feed("{}") and tr.done
