"""bench/routing_batch.py's pure parts: which augment files form the new batch, the paired fixed/broken count,
the plot. (The arms themselves train gate models, ~20 min each: the bench's run, not a test's.)"""

import pytest

from tests.conftest import load_bench


def _bench():
    return load_bench("routing_batch")


def test_split_batch_separates_the_new_files(tmp_path):
    rb = _bench()
    for name in ("git.jsonl", "git-b2.jsonl", "git-b4.jsonl", "time-b4.jsonl", "README.md"):
        (tmp_path / name).write_text("")
    old, every = rb.split_batch(tmp_path, "*-b4.jsonl")
    assert [f.name for f in old] == ["git-b2.jsonl", "git.jsonl"]
    assert [f.name for f in every] == ["git-b2.jsonl", "git-b4.jsonl", "git.jsonl", "time-b4.jsonl"]
    with pytest.raises(SystemExit, match="nothing to compare"):
        rb.split_batch(tmp_path, "*-b9.jsonl")
    # or a directory whose files are added to the augment files
    batch = tmp_path / "batch"
    batch.mkdir()
    (batch / "git-new.jsonl").write_text("")
    old, every = rb.split_batch(tmp_path, str(batch))
    assert len(old) == 4 and every == old + [batch / "git-new.jsonl"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds no"):
        rb.split_batch(tmp_path, str(tmp_path / "empty"))


def test_paired_counts_fixed_and_broken_by_line_id():
    rb = _bench()
    base = [{"id": "a", "correct": True}, {"id": "b", "correct": False}, {"id": "c", "correct": False},
            {"id": "d", "correct": True}]
    other = [{"id": "d", "correct": False}, {"id": "c", "correct": True}, {"id": "b", "correct": True},
             {"id": "a", "correct": True}]
    assert rb.paired(base, other) == {"fixed": 2, "broken": 1, "net": 1}
    assert rb.paired(base, base) == {"fixed": 0, "broken": 0, "net": 0}


def test_plot_writes_a_png(tmp_path):
    rb = _bench()
    size = {"accuracy": 0.9, "ci95": [0.85, 0.93], "registry_size": 250}
    report = {"fold": 0, "n": 320, "new": "*-b4.jsonl", "sizes": ["250"],
              "arms": {arm: {"sizes": {"250": size}} for arm in rb.ARMS}}
    rb.plot(report, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
