import pytest

from services.common.errors import InvalidArgument
from services.common.validation import bounded_count, check_request


@pytest.mark.parametrize("query, hist, match", [("", 0, "empty"), ("  \n", 0, "empty"), ("x" * 11, 0, "11 characters"),
                                                 ("ok", 4, "4 turns")])
def test_check_request_refuses(query, hist, match):
    with pytest.raises(InvalidArgument, match=match):
        check_request(query, hist, max_query_chars=10, max_history_turns=3)


def test_check_request_accepts_limits():
    check_request("x" * 10, 3, max_query_chars=10, max_history_turns=3)


def test_bounded_count():
    assert bounded_count("k", None, default=5, limit=9) == 5
    assert bounded_count("k", 0, default=5, limit=9) == 5
    assert bounded_count("k", 9, default=5, limit=9) == 9
    for bad in (-1, 10, 2**31 - 1):
        with pytest.raises(InvalidArgument, match="k must be in 1..9"):
            bounded_count("k", bad, default=5, limit=9)
