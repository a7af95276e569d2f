"""Alternate tool keys (max over a tool's two keys) and the lexical addend of the SLB score."""

import numpy as np
import pytest

from services.common.tools import parse_tool
from services.router.keys import LexicalIndex, alt_tool_text, query_part, tokens
from services.router.slb import SemanticIndex


def _tool(name, desc, props=()):
    return parse_tool({"name": name, "description": desc,
                       "inputSchema": {"type": "object", "properties": {p: {"type": "string"} for p in props}}})


def _unit(rng, n, d=384):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_alt_text_is_name_first_sentence_and_parameters():
    t = _tool("git_log", "Shows the commit logs. Long second sentence here.", ("repo_path", "max_count"))
    assert alt_tool_text(t) == "git log: Shows the commit logs. Parameters: repo_path, max_count"


def test_tokens_split_identifier_styles():
    assert tokens("get_pullRequest-files #12 in Octo/Web") == ["get", "pull", "request", "files", "12", "in", "octo",
                                                               "web"]


def test_query_part_drops_the_history_window():
    assert query_part("merge it\n[context] user: open a PR | assistant: done") == "merge it"
    assert query_part("plain query") == "plain query"


def test_lexical_scores_rank_the_tool_named_and_are_normalised():
    tools = [_tool("git_log", "Shows the commit logs", ("repo_path",)),
             _tool("git_status", "Shows the working tree status", ("repo_path",)),
             _tool("slack_post_message", "Post a new message to a Slack channel", ("channel_id", "text"))]
    lx = LexicalIndex.of_tools(tools)
    s = lx.scores("git log /srv/infra between May and June")
    assert int(np.argmax(s)) == 0 and s.max() == pytest.approx(1.0) and s[2] == 0.0 and 0 < s[1] < 1
    assert lx.scores("slack channel")[2] == pytest.approx(1.0)
    assert not lx.scores("zzz unrelated").any()  # no shared word: all zero, not nan


def test_alt_keys_score_the_max_of_a_tools_two_keys():
    rng = np.random.default_rng(1)
    text, alt, q = _unit(rng, 5), _unit(rng, 5), _unit(rng, 1)[0]
    names = [f"t{i}" for i in range(5)]
    idx = SemanticIndex(384, prefer_native=False)
    idx.replace_all(dict(zip(names, text, strict=True)))
    _, plain = idx.scores(q)
    assert plain == pytest.approx(text @ q, abs=0.01)
    idx.set_alt_keys({n: alt[i] for i, n in enumerate(names) if i != 3})  # t3 has no alternate key
    _, both = idx.scores(q)
    want = np.maximum(text @ q, alt @ q)
    want[3] = text[3] @ q
    assert both == pytest.approx(want, abs=0.01)
    # the alternate key follows the tool through rebuilds, and an alternate key equal to the query wins
    idx.upsert({"t9": _unit(rng, 1)[0]})
    idx.set_alt_keys({"t2": q})
    assert idx.search(q, 1)[0][0] == "t2"
    idx.set_alt_keys({})
    assert idx.scores(q)[1][:5] == pytest.approx(text @ q, abs=0.01)
    with pytest.raises(ValueError):
        idx.set_alt_keys({"t0": np.zeros(3, np.float32)})


def test_bonus_is_added_per_tool_and_ignored_when_stale():
    rng = np.random.default_rng(2)
    keys, q = _unit(rng, 4), _unit(rng, 1)[0]
    idx = SemanticIndex(384, prefer_native=False)
    idx.replace_all({f"t{i}": keys[i] for i in range(4)})
    base = dict(idx.search(q, 4))
    worst = min(base, key=base.get)
    bonus = np.zeros(4, np.float32)
    bonus[int(worst[1])] = 5.0
    top = idx.search(q, 4, bonus=bonus)
    assert top[0][0] == worst and top[0][1] == pytest.approx(base[worst] + 5.0)
    assert dict(idx.search(q, 4, bonus=np.ones(3, np.float32))) == base  # wrong length: registry swapped
