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


def test_value_start_prefers_words_of_the_request_a_little_and_quoted_text_more():
    cb = CopyBias(PIECES, start_bias=2.0, continue_bias=5.0, close_bias=3.0, salient_bias=2.0)
    cb.begin("Do a search for 'EU AI Act enforcement timeline' in config:max_upload_mb")
    cb.feed('{"query": "')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids("search")[0]] == 2.0 and out[ids("brazen")[0]] == 0.0
    assert out[ids("EU")[0]] == 4.0 and out[ids("E")[0]] == 4.0  # quoted span
    assert out[ids("config")[0]] == 4.0  # identifier-like span


def test_inside_a_value_it_continues_the_copied_span_and_closes_at_the_quote():
    cb = CopyBias(PIECES, start_bias=2.0, continue_bias=5.0, close_bias=3.0)
    cb.begin("Do a search for 'EU AI Act' now")
    cb.feed('{"query": "EU')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids(" AI")[0]] == 5.0 and out[ids(" enforcement")[0]] == 0.0
    cb.feed(" AI Act")
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids('"')[0]] == 3.0 and out[ids('",')[0]] == 3.0  # the quoted span ends here


def test_sentence_punctuation_ends_a_span_but_a_dot_inside_a_name_does_not():
    cb = CopyBias(PIECES)
    cb.begin("Get the value of the Redis key config:max_upload_mb.")
    cb.feed('{"key": "config:max_upload_mb')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids('"')[0]] > 0
    cb.begin("read README.md now")
    cb.feed('{"path": "README')
    out = cb(np.zeros(len(PIECES), dtype=np.float32))
    assert out[ids('"')[0]] == 0 and out[ids(".")[0]] > 0


def test_keys_and_invented_text_are_left_alone():
    cb = CopyBias(PIECES)
    cb.begin("EU AI Act")
    cb.feed('{"')  # writing a key
    logits = np.arange(len(PIECES), dtype=np.float32)
    assert np.array_equal(cb(logits), logits)
    cb.feed('query": "brazen')  # a value that is not in the request: no continuation to favour
    assert np.array_equal(cb(logits), logits)
