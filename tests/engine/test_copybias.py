"""The copy bias on a toy vocabulary: which tokens it nudges, and when it stays out of the way."""

import numpy as np

from services.engine.copybias import CopyBias, JsonValueScanner

PIECES = ["EU", " AI", " Act", "E", "brazen", '"', '",', " enforcement", "config", "max", "_upload", "_mb", ".", "{", '"query', '": "', "}", "search"]


def ids(*names):
    return [PIECES.index(n) for n in names]


def test_scanner_tells_keys_from_values_and_tracks_the_value_text():
    sc = JsonValueScanner()
    sc.feed('{"query')
    assert sc.in_string and not sc.in_value  # a key
    sc.feed('": "EU A')
    assert sc.in_value and "".join(sc.partial) == "EU A"
    sc.feed('I", "tags": ["x\\"y')
    assert sc.in_value and "".join(sc.partial) == 'x"y'
    sc.feed('"], "n": 5}')
    assert not sc.in_string and not sc.stack


def test_value_start_prefers_words_of_the_request_a_little():
    cb = CopyBias(PIECES, start_bias=2.0, close_bias=3.0)
    cb.begin("Do a search for 'EU AI Act enforcement timeline' in config:max_upload_mb")
    cb.feed('{"query": "')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids("search")[0]] == 2.0 and out[ids("brazen")[0]] == 0.0
    assert out[ids("EU")[0]] == 2.0 and out[ids("E")[0]] == 2.0 and out[ids("config")[0]] == 2.0


def test_inside_a_value_it_keeps_to_the_copied_span_and_closes_at_the_quote():
    cb = CopyBias(PIECES, start_bias=2.0, close_bias=3.0, span_penalty=30.0)
    cb.begin("Do a search for 'EU AI Act' now")
    cb.feed('{"query": "EU')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids(" AI")[0]] == 0.0 and out[ids(" enforcement")[0]] == -30.0
    cb.feed(" AI Act")
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids('"')[0]] == 3.0 and out[ids('",')[0]] == 3.0  # the quoted span ends here


def test_sentence_punctuation_ends_a_span_but_a_dot_inside_a_name_does_not():
    cb = CopyBias(PIECES, span_penalty=30.0)
    cb.begin("Get the value of the Redis key config:max_upload_mb.")
    cb.feed('{"key": "config:max_upload_mb')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids('"')[0]] > 0
    cb.begin("read README.md now")
    cb.feed('{"path": "README')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids('"')[0]] == 0 and out[ids(".")[0]] == 0 and out[ids("brazen")[0]] == -30  # "." goes on


def test_keys_and_invented_text_are_left_alone():
    cb = CopyBias(PIECES)
    cb.begin("EU AI Act")
    cb.feed('{"')  # writing a key
    logits = np.arange(len(PIECES), dtype=np.float32)
    assert np.array_equal(cb(logits), logits)
    cb.feed('query": "brazen')  # a value that is not in the request: no continuation to favour
    assert np.array_equal(cb(logits), logits)


SPAN_PIECES = ["vercel", "/", "next", ".js", '"', '",', "x", " in", "octo", "-org", "/web", "Tok", "yo", "Asia",
               "\\\"", "good", " first", "label", ":", "api", "."]


def sid(*names):
    return [SPAN_PIECES.index(n) for n in names]


def test_span_penalty_keeps_a_copied_value_on_its_span_or_ends_it_at_a_word_boundary():
    cb = CopyBias(SPAN_PIECES, span_penalty=30.0)
    cb.begin("discussions in vercel/next.js ordered by creation")
    cb.feed('{"owner": "vercel')
    out = cb(np.zeros(len(SPAN_PIECES), dtype=np.float32))
    assert out[sid("/")[0]] == 0  # continues the span
    assert out[sid('"')[0]] == 0  # may end here: "/" is a word boundary (owner of owner/repo)
    assert out[sid("x")[0]] == -30 and out[sid(" in")[0]] == -30  # neither continues nor ends it
    cb.feed("/ne")  # mid-word: no boundary, only the continuation stays
    out = cb(np.zeros(len(SPAN_PIECES), dtype=np.float32))
    assert out[sid('"')[0]] == -30


def test_a_value_that_is_not_a_span_is_left_to_the_model_and_the_grammar():
    cb = CopyBias(SPAN_PIECES, span_penalty=30.0)
    cb.begin("What time is it in Tokyo?")
    cb.feed('{"timezone": "Asia')  # mapped value: not in the request
    logits = np.arange(len(SPAN_PIECES), dtype=np.float32)
    assert np.array_equal(cb(logits), logits)


def test_a_sentence_full_stop_ends_a_value_instead_of_joining_it():
    cb = CopyBias(SPAN_PIECES, span_penalty=30.0)
    cb.begin("Show the staged changes in api.")
    cb.feed('{"repo_path": "api')
    out = cb(np.zeros(len(SPAN_PIECES), dtype=np.float32))
    assert out[sid(".")[0]] == -30 and out[sid('"')[0]] > 0


def test_an_escaped_quote_continues_a_span_that_contains_a_quote():
    cb = CopyBias(SPAN_PIECES, span_penalty=30.0)
    cb.begin("search 'label:\"good first\" x'")
    cb.feed('{"q": "label:')
    out = cb(np.zeros(len(SPAN_PIECES), dtype=np.float32))
    assert out[sid('\\"')[0]] == 0 and out[sid("x")[0]] == -30  # writes the quote escaped, stays on the span


def test_reuse_penalty_steers_the_next_value_away_from_a_span_already_used():
    cb = CopyBias(SPAN_PIECES, reuse_penalty=4.0)
    cb.begin("vercel/next.js and octo-org/web")
    cb.feed('{"owner": "vercel", "repo": "')
    out = cb(np.zeros(len(SPAN_PIECES), dtype=np.float32))
    assert out[sid("vercel")[0]] < out[sid("next")[0]]  # "vercel" only starts where the owner started
    assert out[sid("octo")[0]] == out[sid("next")[0]]
    cb.begin("vercel/next.js")
    cb.feed('{"owner": "')  # nothing used yet: no penalty
    out = cb(np.zeros(len(SPAN_PIECES), dtype=np.float32))
    assert out[sid("vercel")[0]] >= out[sid("next")[0]]


def test_running_on_into_unquoted_words_costs_but_quoted_text_flows():
    pieces = ["Union", " Station", " to", " phrase", "my"]
    cb = CopyBias(pieces, word_penalty=3.0, span_penalty=30.0)
    cb.begin("route from Union Station to 'my phrase here'")
    cb.feed('{"origin": "Union')
    out = cb(np.zeros(len(pieces), dtype=np.float32))
    assert out[pieces.index(" Station")] == -3.0  # still on the span, but the next word costs 3
    assert out[pieces.index(" to")] == -30.0  # off the span
    cb.feed('", "q": "my')
    out = cb(np.zeros(len(pieces), dtype=np.float32))
    assert out[pieces.index(" phrase")] == 0.0  # inside quotes: the next word flows


HINT_PIECES = ["octo", "-org", "/", "web", "-app", "bug", '"', '",', "{", "}"]


def hid(name):
    return HINT_PIECES.index(name)


def test_scanner_names_the_top_level_member_being_written_and_none_for_nested_values():
    sc = JsonValueScanner()
    sc.feed('{"owner": "oc')
    assert sc.member == "owner"
    sc.feed('to", "files": [{"path": "a')
    assert sc.in_value and sc.member == ""  # nested: no top-level member
    sc.feed('"}], "repo": "')
    assert sc.member == "repo"


def test_slot_hint_steers_the_member_onto_its_span_and_closes_it_there():
    source = "label 'bug' details, octo-org/web-app"
    cb = CopyBias(HINT_PIECES, start_bias=2.0, close_bias=3.0, hint_bias=6.0)
    cb.begin(source, {"owner": (source.index("octo"), source.index("/web")),
                      "repo": (source.index("web"), len(source))})
    cb.feed('{"owner": "')
    out = cb(np.zeros(len(HINT_PIECES), dtype=np.float32))
    assert out[hid("octo")] > out[hid("bug")] and out[hid("octo")] > out[hid("web")]
    cb.feed("octo-org")
    out = cb(np.zeros(len(HINT_PIECES), dtype=np.float32))
    assert out[hid('"')] > out[hid("/")]  # the hinted span ends before the slash
    cb.feed('", "repo": "')
    out = cb(np.zeros(len(HINT_PIECES), dtype=np.float32))
    assert out[hid("web")] > out[hid("bug")] and out[hid("web")] > out[hid("octo")]


def test_slot_hints_do_nothing_without_a_hint_bias_or_off_the_span():
    source = "label 'bug' details, octo-org/web-app"
    hints = {"owner": (source.index("octo"), source.index("/web"))}
    plain, hinted = CopyBias(HINT_PIECES), CopyBias(HINT_PIECES, hint_bias=6.0)
    plain.begin(source)
    hinted.begin(source, hints)
    for cb in (plain, hinted):
        cb.feed('{"owner": "bug')  # the model chose another span: the hint no longer applies
    z = np.zeros(len(HINT_PIECES), dtype=np.float32)
    assert np.array_equal(plain(z), hinted(z))
    off = CopyBias(HINT_PIECES, hint_bias=0.0)
    off.begin(source, hints)
    off.feed('{"owner": "')
    plain.begin(source)
    plain.feed('{"owner": "')
    assert np.array_equal(off(z), plain(z))


def test_slot_hints_outside_the_source_are_dropped():
    cb = CopyBias(HINT_PIECES, hint_bias=6.0)
    cb.begin("short", {"owner": (2, 99), "repo": (3, 3), "x": (0, 5)})
    assert cb.hints == {"x": (0, 5)}


NUM_PIECES = ["12", "1", "80", "800", " 1", "0", ",", "}", ' "', "{", "5"]


def test_scanner_follows_a_bare_top_level_number():
    sc = JsonValueScanner()
    sc.feed('{"width": ')
    assert sc.bare_member == "width" and sc.bare == []
    sc.feed("12")
    assert "".join(sc.bare) == "12"
    sc.feed('80, "name": "x')
    assert sc.bare_member == "" and sc.member == "name"
    sc.feed('", "files": [{"size": 3')
    assert sc.bare_member == ""  # nested


def test_number_hint_steers_the_digits_and_ends_the_number():
    source = "capture #pricing-table at 1280 by 800"
    cb = CopyBias(NUM_PIECES, hint_bias=6.0)
    cb.begin(source, {"width": (source.index("1280"), source.index("1280") + 4),
                      "height": (source.index("800"), source.index("800") + 3)})
    cb.feed('{"width": ')
    out = cb(np.zeros(len(NUM_PIECES), dtype=np.float32))
    assert out[NUM_PIECES.index("12")] == 6.0 and out[NUM_PIECES.index(" 1")] == 6.0
    assert out[NUM_PIECES.index("800")] == 0.0
    cb.feed("1280")
    out = cb(np.zeros(len(NUM_PIECES), dtype=np.float32))
    assert out[NUM_PIECES.index(",")] == 6.0 and out[NUM_PIECES.index("0")] == 0.0
    cb.feed(', "height": ')
    out = cb(np.zeros(len(NUM_PIECES), dtype=np.float32))
    assert out[NUM_PIECES.index("800")] == 6.0 and out[NUM_PIECES.index("12")] == 0.0


def test_a_hint_that_is_not_a_number_leaves_the_digits_alone():
    source = "about 8 options"
    cb = CopyBias(NUM_PIECES, hint_bias=6.0)
    cb.begin(source, {"count": (6, 15)})  # "8 options": a string's span, so only a string's opening quote gains
    cb.feed('{"count": ')
    z = np.zeros(len(NUM_PIECES), dtype=np.float32)
    out = cb(z)
    assert out[NUM_PIECES.index(' "')] == 6.0  # the grammar forbids it where the member is a number
    out[NUM_PIECES.index(' "')] = 0.0
    assert np.array_equal(out, z)


def test_string_hint_reaches_tokens_that_open_the_string_and_running_past_its_end_costs():
    pieces = ['"', ' "', '"trans', ' "driv', "transit", "/", '",', "octo", "-org"]
    source = "directions from Union Station by transit, octo-org/web"
    cb = CopyBias(pieces, hint_bias=6.0)
    t = source.index("transit")
    cb.begin(source, {"mode": (t, t + 7), "owner": (source.index("octo"), source.index("/web"))})
    cb.feed('{"mode": ')
    out = cb(np.zeros(len(pieces), dtype=np.float32))
    assert out[pieces.index('"trans')] == 6.0 and out[pieces.index(' "driv')] == 0.0
    assert out[pieces.index('"')] == 6.0 and out[pieces.index(' "')] == 6.0  # a bare quote commits to nothing
    plain = CopyBias(pieces)
    plain.begin(source)
    for c in (cb, plain):
        c.feed('"transit", "owner": "octo-org')
    z = np.zeros(len(pieces), dtype=np.float32)
    gap, plain_gap = (c(z)[pieces.index('",')] - c(z)[pieces.index("/")] for c in (cb, plain))
    assert gap - plain_gap == 12.0  # the hint: +6 to close, -6 to run on


KEY_PIECES = ['{', '"', '"run', '"job', '_id', 'run', 'job', '":', ' 5', '55', ',', ' "', '"tail', '_lines', '}',
              ' "run', '"owner', 'owner']


def _kp(*names):
    return [KEY_PIECES.index(n) for n in names]


def test_key_steering_spells_hinted_keys_and_avoids_silent_ones():
    src = "Why did run 555 in octo/app fail?"
    cb = CopyBias(KEY_PIECES, key_bias=5.0)
    cb.begin(src, {"run_id": (12, 15)}, silent=["job_id", "tail_lines", "run_id"])  # a hinted key is never silent
    cb.feed("{")
    out = cb(np.zeros(len(KEY_PIECES), dtype=np.float32))
    assert out[_kp('"run')].tolist() == [5.0] and out[_kp('"job', '"tail')].tolist() == [-5.0, -5.0]
    assert out[_kp('"', '"owner', '}')].tolist() == [0.0, 0.0, 0.0]  # neutral: a bare quote, other keys, closing
    cb.feed('"')  # a bare quote opened the key: its text continues in plain pieces
    out = cb(np.zeros(len(KEY_PIECES), dtype=np.float32))
    assert out[_kp("run", "job", "owner")].tolist() == [5.0, -5.0, 0.0]
    cb.feed('run')
    out = cb(np.zeros(len(KEY_PIECES), dtype=np.float32))
    assert out[_kp("_id")].tolist() == [5.0]
    cb.feed('_id": 555, ')  # written: run_id is no longer wanted, its value is not a key
    assert cb.scanner.top_keys == ["run_id"]
    out = cb(np.zeros(len(KEY_PIECES), dtype=np.float32))
    assert out[_kp('"run', '"job', '"tail')].tolist() == [0.0, -5.0, -5.0]


def test_key_steering_is_off_without_a_bias_and_leaves_nested_keys_and_values_alone():
    src = "Why did run 555 fail?"
    cb = CopyBias(KEY_PIECES)
    cb.begin(src, {"run_id": (8, 11)}, silent=["job_id"])
    cb.feed("{")
    assert not cb(np.zeros(len(KEY_PIECES), dtype=np.float32)).any()
    cb = CopyBias(KEY_PIECES, key_bias=5.0)
    cb.begin(src, {"run_id": (8, 11)}, silent=["job_id"])
    cb.feed('{"opts": {')  # a nested object's keys are not parameters
    assert not cb(np.zeros(len(KEY_PIECES), dtype=np.float32)).any()
    cb.feed('"run')
    assert cb.scanner.top_key is None


def _after(pieces, source, written, **kw):
    """The copy bias (``kw``) on zero logits once ``written`` is generated for a request ``source``, by piece."""
    cb = CopyBias(pieces, **kw)
    cb.begin(source)
    cb.feed(written)
    return dict(zip(pieces, cb(np.zeros(len(pieces), dtype=np.float32)), strict=True))


SPAN = {"close_bias": 3.0, "span_penalty": 30.0}


def test_a_parenthesis_the_value_opened_does_not_end_it():
    pieces = [")", " FROM", '"', '",', "*"]
    out = _after(pieces, "Count them: SELECT count(*) FROM invoices; then stop (see /srv/app) now",
                 '{"sql": "SELECT count(*', **SPAN)
    # the query goes on: ")" continues the span (it lost the 30-point span penalty before), no close bias here
    assert out[")"] == 0.0 and out['"'] == 0.0 and out["*"] == -30.0
    out = _after(pieces, "then stop (see /srv/app) now", '{"path": "/srv/app', **SPAN)
    assert out['"'] > 0 and out[")"] < 0  # a parenthesis the value did not open ends it


def test_a_semicolon_that_ends_the_request_belongs_to_the_statement():
    pieces = [";", '"', '",']
    src = "count the rows: SELECT count(*) FROM invoices;"
    out = _after(pieces, src, '{"sql": "SELECT count(*) FROM invoices', **SPAN)
    assert out[";"] == 0.0 and out['"'] == 0.0  # was cut: ";" read as sentence end (close bias on '"')
    out = _after(pieces, src, '{"sql": "SELECT count(*) FROM invoices;', **SPAN)
    assert out['"'] > 0  # the text ends: the value closes
    out = _after(pieces, "tag it urgent; then close it", '{"label": "urgent', **SPAN)
    assert out['"'] > 0 and out[";"] < 0  # a semicolon inside prose still ends it


def test_a_quote_mark_the_value_opened_does_not_end_it():
    pieces = ["']", '"', '",', "'"]
    out = _after(pieces, "The link matches the selector a[href='/signup'].", '{"selector": "a[href=\'/signup',
                 close_bias=3.0, span_penalty=30.0)
    # tune line t-0884 closed at "/signup": the quote read as the end of a quoted span and gained the close bias
    assert out['"'] == 0.0 and out["']"] == 0.0 and out["'"] == 0.0
    out = _after(pieces, "label it 'needs triage' please", '{"label": "needs triage', close_bias=3.0)
    assert out['"'] == 3.0  # a quoted span still ends at its closing quote


def test_the_object_stays_open_while_a_hinted_parameter_is_unwritten():
    pieces = ["}", " }", '"}', '",', ",", '"', "5"]
    z = np.zeros(len(pieces), dtype=np.float32)
    src = "Why did run 5550001234 in octo-org/web-app fail?"
    hints = {"owner": (src.index("octo"), src.index("/web")), "run_id": (12, 22)}
    cb = CopyBias(pieces, hint_bias=10.0, pending_bias=8.0)
    cb.begin(src, hints)
    cb.feed('{"owner": "octo-org", "repo": "web-app"')
    out = cb(z)
    # tune line t-0292 closed here and left out run_id
    assert out[pieces.index("}")] == -8.0 and out[pieces.index(" }")] == -8.0 and out[pieces.index(",")] == 0.0
    cb.feed(', "repo": "web-ap')  # inside a string value: the quote that also closes the object loses it
    out = cb(z)
    assert out[pieces.index('"}')] < 0 and out[pieces.index('",')] >= 0
    cb.begin(src, hints)
    cb.feed('{"owner": "octo-org", "run_id": 5550001234')
    assert cb(z)[pieces.index("}")] == 10.0  # all hinted parameters written: no penalty (the number hint ends here)
    cb.begin(src, hints)
    cb.feed('{"owner": "octo-org", "items": [{"a": 1')
    assert cb(z)[pieces.index("}")] == 0.0  # a nested object closes freely


def test_an_enum_choice_spells_its_option_holds_the_object_open_and_replaces_the_span_hint():
    pieces = ["get", "_diff", "_files", '"', '",', '"}', "}", ' "get', "diff", " Show"]
    z = np.zeros(len(pieces), dtype=np.float32)
    src = "Show me the diff for acme-corp/billing-service#57."
    cb = CopyBias(pieces, hint_bias=10.0, pending_bias=8.0, start_bias=2.0, span_penalty=30.0)
    # the reader's span for method ("diff") is replaced by the choice; tune line t-0424 wrote "get"
    cb.begin(src, {"method": (src.index("diff"), src.index("diff") + 4)}, choices={"method": "\"get_diff\""})
    assert "method" not in cb.hints
    cb.feed('{"owner": "acme-corp"')
    out = dict(zip(pieces, cb(z), strict=True))
    assert out["}"] == -8.0  # pending: the object stays open until method is written
    cb.feed(', "method":')
    out = dict(zip(pieces, cb(z), strict=True))
    assert out[' "get'] == 10.0 and out['"'] == 10.0 and out["diff"] == 0.0  # the value opens toward the option
    cb.feed(' "get')
    out = dict(zip(pieces, cb(z), strict=True))
    # the option's next tokens gain, the others lose (a mapped value: no copy bias, "get" is no span of src)
    assert out["_diff"] == 10.0 and out["_files"] == -10.0 and out["\""] == -10.0 and out[" Show"] == -10.0
    cb.feed("_diff")
    out = dict(zip(pieces, cb(z), strict=True))
    assert out['"'] == 10.0 and out['",'] == 10.0 and out['"}'] == 10.0  # whole: it closes (all keys written)
    cb.begin(src, choices={"method": "\"get_diff\""})
    cb.feed('{"method": "get_files')
    assert np.array_equal(cb(z), z)  # the model left the choice: the grammar and the model decide
    off = CopyBias(pieces, hint_bias=0.0, pending_bias=0.0)
    off.begin(src, choices={"method": "\"get_diff\""})
    off.feed('{"method": "get')
    assert off(z)[pieces.index("_diff")] == 0.0  # no hint bias: no choice bias


def test_a_boolean_choice_spells_the_bare_literal():
    pieces = ["true", " true", "false", " false", "t", "rue", "}", ",", '"']
    z = np.zeros(len(pieces), dtype=np.float32)
    cb = CopyBias(pieces, hint_bias=10.0, pending_bias=8.0)
    cb.begin("take it out of draft", choices={"draft": "false"})
    cb.feed('{"draft":')
    out = dict(zip(pieces, cb(z), strict=True))
    assert out["false"] == 10.0 and out[" false"] == 10.0 and out["true"] == 0.0 and out['"'] == 0.0
    cb.feed(" false")
    out = dict(zip(pieces, cb(z), strict=True))
    assert out["}"] == 10.0 and out[","] == 10.0  # written: the value ends (no longer pending)
    cb.begin("take it out of draft", choices={"draft": "false"})
    cb.feed('{"owner": "x"')
    assert dict(zip(pieces, cb(z), strict=True))["}"] == -8.0  # pending until written


def test_a_key_the_grammar_orders_after_a_pending_parameter_loses_the_pending_bias():
    pieces = ['"name', '"all', '"namespace', '"label', "_namespaces", "space", "}", '"']
    z = np.zeros(len(pieces), dtype=np.float32)
    order = ["all_namespaces", "label_selector", "name", "namespace"]  # param_order: the grammar's key order
    cb = CopyBias(pieces, hint_bias=10.0, pending_bias=8.0)
    cb.begin("Which pods are hogging memory, in all namespaces?", choices={"all_namespaces": "true"}, order=order)
    cb.feed("{")
    out = dict(zip(pieces, cb(z), strict=True))
    # tune line t-0616 wrote "name" first, after which the grammar no longer allows all_namespaces
    assert out['"name'] == -8.0 and out['"namespace'] == -8.0 and out['"label'] == -8.0 and out['"all'] == 0.0
    cb.feed('"all')
    out = dict(zip(pieces, cb(z), strict=True))
    assert out["_namespaces"] == 0.0  # spelling on toward the pending key is left alone
    cb.feed('_namespaces": true, ')
    out = dict(zip(pieces, cb(z), strict=True))
    assert out['"name'] == 0.0 and out['"label'] == 0.0  # nothing pending any more
    free = CopyBias(pieces, hint_bias=10.0, pending_bias=8.0)
    free.begin("in all namespaces", choices={"all_namespaces": "true"})  # no order given: no guard
    free.feed("{")
    assert dict(zip(pieces, free(z), strict=True))['"name'] == 0.0


def test_hint_penalty_keeps_a_value_on_its_hinted_span_once_started():
    pieces = ["i", "12", "c", '"', " tasks"]
    z = np.zeros(len(pieces), dtype=np.float32)
    src = "cancel run build-c12 in namespace ci now"
    hint = {"namespace": (src.index("ci now"), src.index("ci now") + 2)}
    cb = CopyBias(pieces, hint_bias=10.0, hint_penalty=10.0)
    cb.begin(src, hint)
    cb.feed('{"namespace": "c')
    out = dict(zip(pieces, cb(z), strict=True))
    off = CopyBias(pieces, hint_bias=10.0)
    off.begin(src, hint)
    off.feed('{"namespace": "c')
    was = dict(zip(pieces, off(z), strict=True))
    # tune line t-0704 wrote "c12" (of build-c12, a continuation too) for the hinted "ci"
    assert was["12"] == 0.0 and out["12"] == -10.0 and out['"'] == was['"'] - 10.0
    assert out["i"] == was["i"] == 10.0  # the hint's
    cb.begin(src, hint)
    cb.feed('{"namespace": "')
    assert dict(zip(pieces, cb(z), strict=True))["12"] == 0.0  # the value's first token is the start bias's
