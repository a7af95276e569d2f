"""The slot reader's pieces: span search, question text, training examples, threshold choice; and the trained
production reader (from `make models`) on requests whose answers are unambiguous."""

import numpy as np
import pytest

from services.common.tools import parse_tool
from services.engine.slots import (
    balance_span,
    clean_span,
    slot_context,
    slot_params,
    slot_question,
    top_spans,
)
from training.data import QueryLine
from training.slots import (
    SlotExample,
    SlotHyperParams,
    choose_threshold,
    find_value,
    length_batches,
    make_examples,
)

TOOL = parse_tool({
    "name": "get_label", "description": "Get a label of a repository.",
    "inputSchema": {"type": "object", "required": ["owner", "repo", "name"], "properties": {
        "owner": {"type": "string", "description": "Repository owner (user or organization)"},
        "repo": {"type": "string", "description": "Repository name"},
        "name": {"type": "string", "description": "Label name"},
        "state": {"type": "string", "enum": ["open", "closed"]},
        "per_page": {"type": "integer"},
        "draft": {"type": "boolean"},
        "labels": {"type": "array", "items": {"type": "string"}}}}})


def test_top_spans_are_the_best_pairs_inside_the_context_scored_against_not_stated():
    start = np.array([1.0, 0.0, 5.0, 0.0, 0.0])
    end = np.array([1.0, 9.0, 0.0, 0.0, 3.0])
    mask = np.array([False, False, True, True, True])  # token 1 is question text: never an answer
    (i, j, score), second = top_spans(start, end, mask, k=2)
    assert (i, j) == (2, 4) and score == pytest.approx(5 + 3 - 2)
    assert second[2] <= score and (second[0], second[1]) != (2, 4)
    i, j, _ = top_spans(start, end, mask, max_tokens=2)[0]  # (2, 4) is 3 tokens long
    assert j - i < 2


def test_a_span_never_crosses_a_line_break_of_the_context():
    start = np.array([0.0, 6.0, 0.0, 1.0])
    end = np.array([0.0, 0.0, 0.0, 7.0])
    mask = np.array([False, True, True, True])
    assert top_spans(start, end, mask)[0][:2] == (1, 3)  # the best pair runs from line 0 into line 1
    lines = np.array([-1, 0, 0, 1])
    i, j, _ = top_spans(start, end, mask, lines=lines)[0]
    assert lines[i] == lines[j] and (i, j) != (1, 3)


def test_parameters_a_span_can_state_and_their_questions():
    names = [n for n, _ in slot_params(TOOL)]
    assert names == ["owner", "repo", "name", "state", "per_page"]  # no boolean, no array
    q = slot_question(TOOL, "per_page", dict(slot_params(TOOL))["per_page"])
    assert q.startswith("get label | per page (integer)")
    assert "open, closed" in slot_question(TOOL, "state", dict(slot_params(TOOL))["state"])


def test_long_sources_keep_their_tail_where_the_request_is():
    src = "word " * 400 + "the request"
    ctx, off = slot_context(src)
    assert src[off:] == ctx and ctx.endswith("the request") and len(ctx) <= 700


def test_find_value_prefers_a_whole_word_occurrence_in_the_request():
    ctx = "earlier: octo-org\nopen octo-org/web-app, label org"
    a, b = find_value(ctx, "octo-org")
    assert ctx[a:b] == "octo-org" and a > ctx.index("\n")  # in the request, not the history line
    a, b = find_value(ctx, "org")
    assert a == ctx.rindex("org")  # not the "org" inside "octo-org"
    assert find_value(ctx, "Asia/Tokyo") is None


def test_examples_point_at_stated_values_and_sample_unstated_parameters():
    ln = QueryLine(id="x-1", server="github", tool="get_label", query="label 'bug' details, octo-org/web-app",
                   args={"owner": "octo-org", "repo": "web-app", "name": "bug", "per_page": 5})
    ex = make_examples([ln], {"get_label": TOOL}, SlotHyperParams(max_negatives=1))
    pos = {e.param: e.context[e.start:e.end] for e in ex if e.start >= 0}
    assert pos == {"owner": "octo-org", "repo": "web-app", "name": "bug"}
    neg = [e.param for e in ex if e.start < 0]
    assert "per_page" in neg and len(neg) == 2  # stated as 5, not in the request: no span; + one unstated


def test_examples_cut_their_context_from_the_given_source():
    ln = QueryLine(id="x-2", server="github", tool="get_label", query="label 'bug' details, octo-org/web-app",
                   args={"owner": "octo-org", "repo": "web-app", "name": "bug"}, history=())
    default = make_examples([ln], {"get_label": TOOL}, SlotHyperParams(max_negatives=1))
    routed = make_examples([ln], {"get_label": TOOL}, SlotHyperParams(max_negatives=1),
                           source=lambda line: "request: " + line.query)
    assert {e.context for e in routed} == {"request: label 'bug' details, octo-org/web-app"} != {
        e.context for e in default}
    assert {e.param: e.context[e.start:e.end] for e in routed if e.start >= 0} == {
        e.param: e.context[e.start:e.end] for e in default if e.start >= 0}
    assert [e.param for e in routed] == [e.param for e in default]  # the same questions and negatives


def test_length_batches_cover_every_example_once_and_pad_less_than_a_plain_shuffle():
    import random

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(20, 190, size=1003)]
    plain = length_batches(lengths, 16, 1, random.Random(0))
    bucketed = length_batches(lengths, 16, 50, random.Random(0))
    for batches in (plain, bucketed):
        assert sorted(i for b in batches for i in b) == list(range(1003))
        assert all(1 <= len(b) <= 16 for b in batches) and len(batches) == (1003 + 15) // 16

    def padded(batches):
        return sum(max(lengths[i] for i in b) * len(b) for b in batches)

    assert padded(bucketed) < 0.7 * padded(plain)
    assert bucketed == length_batches(lengths, 16, 50, random.Random(0))  # deterministic for a seed
    assert bucketed != length_batches(lengths, 16, 50, random.Random(1))  # and a different draw per epoch


def test_threshold_trades_hints_on_stated_against_silence_on_unstated():
    ctx = "pause 5 seconds"
    stated = SlotExample("a", "time", "q", ctx, 6, 7)
    unstated = SlotExample("b", "text", "q", ctx, -1, -1)
    preds = [(6, 7, 2.0), (0, 5, 1.0)]
    t, fig = choose_threshold([stated, unstated], preds)
    assert 1.0 <= t < 2.0 and fig["val_accuracy"] == 1.0 and fig["val_hint_precision"] == 1.0


@pytest.fixture(scope="module")
def reader():
    from services.engine.slots import SlotModel

    path = "var/models/slots"
    if not SlotModel.exists(path):
        pytest.fail("no slot model at var/models/slots: run `make setup` (it links the shipped one)")
    return SlotModel(path, threads=1)


@pytest.mark.parametrize("query,want", [
    ("label 'bug' details, octo-org/web-app", {"owner": "octo-org", "repo": "web-app"}),
    ("get the 'good first issue' label of acme/widgets", {"owner": "acme", "repo": "widgets"}),
])
def test_trained_reader_splits_owner_and_repo_and_leaves_unstated_numbers(reader, query, want):
    # owner/repo is the pattern the 135M model got wrong most often alone; which span is the label *name*
    # is less reliable (the reader's figure over the tune split is the test below, not single answers)
    hints = reader.hints(TOOL, query)
    assert {k: query[h.start:h.end] for k, h in hints.items() if k in want} == want
    assert "per_page" not in hints


def test_trained_reader_hints_never_cross_a_turn_of_the_window(reader):
    tool = parse_tool({"name": "resources_get", "description": "Get a Kubernetes resource",
                       "inputSchema": {"type": "object", "properties": {
                           "apiVersion": {"type": "string", "description": "apiVersion of the resource"},
                           "kind": {"type": "string", "description": "kind of the resource"},
                           "name": {"type": "string", "description": "Name of the resource"},
                           "namespace": {"type": "string", "description": "Namespace of the resource"}}}})
    # the reader's free answer for namespace was "shop.\nDeployments in shop" (held-out line t-0629)
    source = ("List the apps/v1 Deployments in namespace shop.\nDeployments in shop: checkout, cart, catalog."
              "\nshow me the full spec of cart")
    hints = reader.hints(tool, source)
    assert hints and all("\n" not in h.text(source) for h in hints.values())
    assert hints["namespace"].text(source) == "shop"


def test_trained_reader_was_validated_on_the_tune_split(reader):
    meta = reader.meta
    assert meta["n_val_lines"] > 100 and meta["n_train_lines"] > 1000
    assert meta["val_stated_exact"] > 0.6 and meta["val_hint_precision"] > 0.6


def test_a_quoted_span_ends_at_its_closing_quote():
    ctx = "label 'bug' details, octo-org/web-app"
    a = ctx.index("bug")
    assert ctx[slice(*clean_span(ctx, a, ctx.index(" details") + 8))] == "bug"
    assert ctx[slice(*clean_span(ctx, ctx.index("octo"), len(ctx)))] == "octo-org/web-app"  # not quoted
    assert clean_span(" x ", 0, 3) == (1, 2)
    ctx = "Shrink https://example.com/data/large.csv into large.csv.gz"
    a = ctx.index("https")
    assert ctx[slice(*clean_span(ctx, a, len(ctx)))] == "https://example.com/data/large.csv"  # a URL ends at a space
    ctx = "move it to /home/ann/My Documents/notes.txt now"
    a, b = ctx.index("/home"), ctx.index(" now")
    assert clean_span(ctx, a, b) == (a, b)  # a path may hold spaces


@pytest.mark.parametrize("context,answer,want", [
    ("the selector a[href='/signup']. Click it", "a[href='/signup", "a[href='/signup']"),  # tune line t-0884
    ("puppeteer eval: localStorage.clear()", "localStorage.clear", "localStorage.clear()"),  # t-0896
    ("run: SELECT count(*) FROM invoices;", "SELECT count(*) FROM invoices", "SELECT count(*) FROM invoices;"),
    ("fly to O'Hare today", "O'Hare", "O'Hare"),  # an apostrophe opens nothing
    ("label 'bug' and tag it; then go", "tag it", "tag it"),  # a semicolon inside prose stays out
    ("run get_weather(city) then (later) stop", "get_weather", "get_weather(city)"),
    ("stop now (see /srv/app) please", "stop now", "stop now"),  # a parenthesis after a space is no call
    ("SELECT count(*\nFROM x)", "SELECT count(*", "SELECT count(*"),  # never across a line
])
def test_a_span_closes_what_it_opened(context, answer, want):
    a = context.index(answer)
    x, y = balance_span(context, a, a + len(answer))
    assert context[x:y] == want


def _reader_with(scores, candidates=0, threshold=0.0, order=True):
    """A SlotModel whose network is replaced by fixed candidate lists (this layer's logic only)."""
    from services.engine.slots import SlotModel

    m = object.__new__(SlotModel)
    m.threshold, m.candidates, m.order_numbers = threshold, candidates, order
    m.score = lambda questions, context, k=1: [scores[q.split(" | ")[1].split(" (")[0]][:k] for q in questions]
    return m


def test_one_phrase_states_one_parameter_best_first():
    q = "open a pull request from feature-x into main in octo/demo"
    span = {w: (q.index(w), q.index(w) + len(w)) for w in ("feature-x", "main", "octo", "demo")}
    scores = {"owner": [(*span["octo"], 9.0)], "repo": [(*span["demo"], 6.0)], "name": [(*span["main"], 0.5)],
              "state": [], "per page": [],
              # the reader's first choice for both is "main": the stronger keeps it, the other takes its next
              "head": [(*span["main"], 3.0), (*span["feature-x"], 2.0)]}
    tool = parse_tool({"name": "pr", "description": "", "inputSchema": {"type": "object", "properties": {
        "owner": {"type": "string"}, "repo": {"type": "string"}, "head": {"type": "string"},
        "name": {"type": "string"}}}})
    hints = {k: q[h.start:h.end] for k, h in _reader_with(scores, candidates=3).hints(tool, q).items()}
    assert hints == {"owner": "octo", "repo": "demo", "head": "main"}  # name's "main" overlaps head's
    hints = {k: q[h.start:h.end] for k, h in _reader_with(scores).hints(tool, q).items()}
    assert hints == {"owner": "octo", "repo": "demo", "head": "main", "name": "main"}  # overlaps allowed


def test_number_parameters_take_only_numbers_and_scores_below_threshold_give_no_hint():
    q = "pause 5 seconds"
    tool = parse_tool({"name": "wait", "description": "", "inputSchema": {"type": "object", "properties": {
        "time": {"type": "number"}, "text": {"type": "string"}}}})
    scores = {"time": [(6, 15, 4.0), (6, 7, 3.0)], "text": [(0, 5, -1.0)]}
    # the best span "5 seconds" is not a number: the best one that is takes its place ("text" stays below)
    for candidates in (0, 2):
        hints = _reader_with(scores, candidates=candidates).hints(tool, q)
        assert {k: q[h.start:h.end] for k, h in hints.items()} == {"time": "5"} and hints["time"].score == 3.0
    scores["time"] = [(6, 15, 4.0), (0, 5, 3.0)]
    assert _reader_with(scores).hints(tool, q) == {}  # no number among its spans: no hint


def test_silent_parameters_are_the_unhinted_ones_a_span_could_state_except_enums():
    from types import SimpleNamespace

    from services.engine.engine import Engine

    hints = {"owner": (0, 4), "repo": (5, 9)}
    silent = Engine.slot_silent(SimpleNamespace(_slots=object()), TOOL, hints)
    # "state" is an enum: its value is mapped from the wording ("closed issues"), which the reader answers
    # "no span", so its key must not be steered away from; booleans and arrays are not the reader's
    assert silent == ["name", "per_page"]
    assert Engine.slot_silent(SimpleNamespace(_slots=None), TOOL, hints) == []


XY = parse_tool({"name": "drag", "description": "", "inputSchema": {"type": "object", "properties": {
    "endX": {"type": "number"}, "endY": {"type": "number"}, "startX": {"type": "number"},
    "startY": {"type": "number"}, "label": {"type": "string"}}}})


def test_number_parameters_sharing_a_span_take_the_numbers_in_the_order_stated():
    q = "drag 50,60 -> 300,260 and call it 8.25"
    at = {w: (q.index(w), q.index(w) + len(w)) for w in ("50", "60", "300", "260", "8.25")}
    at["25"] = (at["8.25"][0] + 2, at["8.25"][1])
    # the reader's best for all four is "50" (tune line t-0800 wrote 50 four times); end* come first in the schema
    cands = [(*at["50"], 9.0), (*at["300"], 8.0), (*at["25"], 7.5), (*at["60"], 7.0), (*at["260"], 6.0),
             (*at["8.25"], 5.0)]
    scores = {"end x": cands, "end y": cands, "start x": cands, "start y": cands, "label": [(*at["8.25"], 4.0)]}
    hints = {k: q[h.start:h.end] for k, h in _reader_with(scores).hints(XY, q).items()}
    # start before end, x before y; "25" of "8.25" is no number of its own and "8.25" is the label's
    assert hints == {"startX": "50", "startY": "60", "endX": "300", "endY": "260", "label": "8.25"}
    off = {k: q[h.start:h.end] for k, h in _reader_with(scores, order=False).hints(XY, q).items()}
    assert set(off.values()) == {"50", "8.25"}
    few = {k: [(*at["50"], 9.0), (*at["60"], 7.0)] for k in ("end x", "end y", "start x", "start y")}
    hints = {k: q[h.start:h.end] for k, h in _reader_with({**few, "label": []}).hints(XY, q).items()}
    assert hints == dict.fromkeys(("endX", "endY", "startX", "startY"), "50")  # two numbers for four: unchanged


MOVE = parse_tool({"name": "browser_mouse_move_xy", "description": "Move mouse to a given position",
                   "inputSchema": {"type": "object", "properties": {
                       "x": {"type": "number", "description": "X coordinate"},
                       "y": {"type": "number", "description": "Y coordinate"}}}})


@pytest.mark.parametrize("tool,query,want", [
    (MOVE, "Move the mouse to position x=640, y=360.", {"x": "640", "y": "360"}),  # tune t-0792: 360 for both
    (XY, "drag 50,50 -> 300,260", {"startX": "50", "startY": "50", "endX": "300", "endY": "260"}),
])
def test_trained_reader_gives_number_pairs_in_the_order_stated(reader, tool, query, want):
    hints = reader.hints(tool, query)
    assert {k: query[h.start:h.end] for k, h in hints.items() if k in want} == want


def test_train_slots_fine_tunes_a_reader_that_loads_and_keeps_it_while_the_data_match(tmp_path):
    """A real (tiny) fine-tune from the all-MiniLM-L6-v2 weights: one step over a few lines, its threshold chosen on
    their examples, written atomically; the same data again keeps it, other data retrains."""
    from services.engine.slots import SlotModel
    from training.slots import train_slots

    lines = [QueryLine(id=f"s{i}", server="github", tool="get_label", query=q, args=a) for i, (q, a) in enumerate([
        ("get the bug label of octo-org/web-app", {"owner": "octo-org", "repo": "web-app", "name": "bug"}),
        ("show label triage in acme/api", {"owner": "acme", "repo": "api", "name": "triage"}),
        ("what does the wontfix label in me/site look like", {"owner": "me", "repo": "site", "name": "wontfix"}),
    ])]
    hp = SlotHyperParams(epochs=1, batch_size=16)
    out = tmp_path / "slots"
    doc = train_slots(lines, lines, [TOOL], out, hp, progress=False)
    assert doc["n_train"] == len(make_examples(lines, {"get_label": TOOL}, hp)) and doc["n_train_lines"] == 3
    assert np.isfinite(doc["train_loss_last"]) and 0.0 <= doc["val_accuracy"] <= 1.0
    assert SlotModel.exists(out) and not (tmp_path / "slots.tmp").exists()
    model = SlotModel(out, threads=1)
    assert model.threshold == doc["threshold"]
    assert len(model.score(["owner?", "repo?"], "get the bug label of octo-org/web-app")) == 2
    assert train_slots(lines, lines, [TOOL], out, hp, progress=False) == doc  # cached: the same data
    again = train_slots(lines[:2], lines, [TOOL], out, hp, progress=False)
    assert again["data_hash"] != doc["data_hash"] and again["n_train_lines"] == 2
