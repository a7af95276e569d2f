"""The argument evaluation's scoring and sampling (pure functions; the end-to-end run is `nexus eval args`)."""

from evals.args import arg_hits, placeholder_count, sample_lines, tune_split, values_match
from training.data import QueryLine, load_queries


def test_values_match_types():
    assert values_match(" a ", "a") and values_match(3, 3.0) and not values_match(True, 1)
    assert values_match(["x", 1], ["x", 1]) and not values_match(["x"], ["x", 1])
    assert values_match({"a": 1}, {"a": 1.0}) and not values_match({"a": 1, "b": 2}, {"a": 1})


def test_arg_hits_counts_only_stated_args():
    assert arg_hits('{"owner": "octo", "repo": "x", "extra": 1}', {"owner": "octo", "repo": "demo"}) == (1, 2)
    assert arg_hits("not json", {"a": 1}) == (0, 1)
    assert arg_hits("{}", {}) == (0, 0)


def test_placeholders_are_counted_anywhere():
    assert placeholder_count('{"a": "<owner>", "b": ["your_repo", "ok"], "c": {"d": "..."}}') == 3
    assert placeholder_count('{"a": "octo"}') == 0


def test_tune_and_heldout_are_disjoint_and_cover():
    from tests.conftest import QUERIES

    lines = load_queries(QUERIES)
    tune, held = tune_split(lines)
    assert tune and held and len(tune) + len(held) == len(lines)
    assert not {ln.id for ln in tune} & {ln.id for ln in held}


def test_sample_is_seeded_and_stratified():
    lines = [QueryLine(id=f"t-{i}", server=s, tool="x", query="q", args={}, history=())
             for i, s in enumerate(["a"] * 5 + ["b"] * 5)]
    s1, s2 = sample_lines(lines, 4, 3), sample_lines(lines, 4, 3)
    assert [x.id for x in s1] == [x.id for x in s2]
    assert {x.server for x in s1} == {"a", "b"}


def test_a_fresh_sample_leaves_out_the_lines_of_an_earlier_report():
    import pytest

    from evals.args import select_lines
    from services.common.errors import InvalidArgument

    lines = [QueryLine(id=f"t-{i:04d}", server=s, tool="x", query="q", args={}, history=())
             for i, s in enumerate(["a", "b"] * 20)]
    first = select_lines(lines, "heldout", 8, 0)
    assert all(int(ln.id[2:]) % 4 for ln in first)  # held-out: no tune line (id divisible by 4)
    fresh = select_lines(lines, "heldout", 8, 0, exclude=[ln.id for ln in first])
    assert len(fresh) == 8 and not {ln.id for ln in first} & {ln.id for ln in fresh}
    held = [ln.id for ln in lines if int(ln.id[2:]) % 4]
    with pytest.raises(InvalidArgument):
        select_lines(lines, "heldout", 8, 0, exclude=held)


def test_line_record_lists_each_arm_with_its_hits():
    from evals.args import Row, line_record
    from services.engine.engine import Result

    def res(args: str, valid: bool = True) -> Result:
        return Result("t", args, 1.0, 2.0, 3.0, 1.0, 10, 5, "text", "", valid)

    gold = {"owner": "octo", "repo": "demo"}
    ok = Row("t-1", "t", "t", True, gold, res('{"owner": "octo", "repo": "x"}'), res("{}"), None,
             res('{"owner": "octo", "repo": "x"}'), 0, res('{"owner": "octo", "repo": "demo"}'))
    rec = line_record(ok)
    assert rec["stated"] == 2 and rec["hybrid"]["hits"] == 1 and rec["engine"]["hits"] == 2
    assert rec["e2e"] is None and rec["gold"] == gold
    wrong = Row("t-2", "t", "u", False, gold, res("{}"), res("{}"), None, res('{"owner": "octo"}', False), 0, None)
    rec = line_record(wrong)
    assert rec["routed"] == "u" and rec["engine"] is None
    assert rec["e2e"] == {"arguments": '{"owner": "octo"}', "hits": 1, "schema_valid": False}


def test_exclude_from_must_name_a_report_of_this_evaluation(tmp_path):
    import pytest

    from cli.main import main

    bad = tmp_path / "other.json"
    bad.write_text('{"sizes": {}}')
    for path in (bad, tmp_path / "missing.json"):
        with pytest.raises(SystemExit, match="not a report of `nexus eval args`"):
            main(["eval", "args", "--queries", "q.jsonl", "--tools", "t", "--json", str(tmp_path / "o.json"),
                  "--exclude-from", str(path)])
