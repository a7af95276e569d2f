"""The committed hand-written training lines (data/routing_augment) against the real registry: every line
parses, names a registry tool, validates against its schema, and every tool has its three batches of 4."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "data" / "mcp_tools"
sys.path.insert(0, str(ROOT / "data"))

from check_augment import check_lines, load_registry, main  # noqa: E402


def test_committed_augment_lines_validate_and_cover_every_tool_three_times():
    registry = load_registry(TOOLS)
    files = sorted((ROOT / "data" / "routing_augment").glob("*.jsonl"))
    errors, uncopied, per = check_lines(files, registry, per_tool=12)
    assert errors == []
    assert sum(per.values()) == 12 * sum(len(t) for t in registry.values())
    # mapped values (Tokyo -> Asia/Tokyo, wording -> search syntax) are the exception, not the rule
    assert len(uncopied) < 0.1 * sum(per.values())  # 207 of 4,056 lines when written
    prefix = {"-b2": "b-", "-b3": "c-"}
    for f in files:  # batch 1 ids a-..., batch 2 (files *-b2.jsonl) ids b-..., batch 3 (*-b3.jsonl) ids c-...
        ids = [json.loads(x)["id"] for x in f.read_text().splitlines()]
        assert all(i.startswith(prefix.get(f.stem[-3:], "a-")) for i in ids), f.name


def test_checker_reports_bad_lines(tmp_path):
    registry = load_registry(TOOLS)
    good = {"id": "x-1", "server": "time", "tool": "get_current_time", "query": "time in Tokyo?",
            "args": {"timezone": "Asia/Tokyo"}, "history": []}
    bad = [
        dict(good, id="x-2", tool="no_such_tool"),
        dict(good, id="x-3", args={"zone": "UTC"}),  # not a property
        dict(good, id="x-4", args={"timezone": 5}),  # wrong type
        dict(good, id="x-5", history=[{"role": "robot", "content": "hi"}]),
        dict(good, id="x-1"),  # duplicate id
    ]
    f = tmp_path / "lines.jsonl"
    f.write_text("\n".join(json.dumps(d) for d in [good, *bad]) + "\n")
    errors, uncopied, per = check_lines([f], registry)
    assert len(errors) == 5, errors
    # lines 1, 5 and 6 validate; "Asia/Tokyo" is not in their text (a mapped value, listed for a second look)
    assert uncopied == [f"lines.jsonl:{n}: get_current_time.timezone = 'Asia/Tokyo'" for n in (1, 5, 6)]
    assert main([str(f), "--tools", str(TOOLS)]) == 1
    f.write_text(json.dumps(good) + "\n")
    assert main([str(f), "--tools", str(TOOLS)]) == 0
    assert main([str(f), "--tools", str(TOOLS), "--per-tool", "1"]) == 1  # convert_time has no line


def test_committed_calibration_lines_validate_and_are_never_training_lines():
    """data/routing_calibration (batch 4): 4 lines per tool, schema-valid, ids d-..., and no id or request shared
    with the training lines of data/routing_augment (the SLB calibration refuses in-sample lines)."""
    registry = load_registry(TOOLS)
    files = sorted((ROOT / "data" / "routing_calibration").glob("*.jsonl"))
    errors, uncopied, per = check_lines(files, registry, per_tool=4)
    assert errors == [] and sum(per.values()) == 4 * sum(len(t) for t in registry.values())
    assert len(uncopied) < 0.1 * sum(per.values())  # 24 of 1,352 lines when written
    rows = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert all(r["id"].startswith("d-") for r in rows)
    train = [json.loads(x) for f in (ROOT / "data" / "routing_augment").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert not {r["id"] for r in rows} & {r["id"] for r in train}
    def request(r):  # the whole request: a short follow-up ("Now the other one.") differs by its history
        return r["query"].strip().lower(), json.dumps(r["history"]).lower()

    assert not {request(r) for r in rows} & {request(r) for r in train}
