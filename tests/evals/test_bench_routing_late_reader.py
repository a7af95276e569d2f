"""bench/routing_late_reader.py: the distillation teacher's cache and the figure (the training it measures is
services/training/late_reader.py's, tests/router/test_late_training.py)."""

import pytest

from tests.conftest import load_bench


def test_teacher_pairs_are_read_once_and_kept_by_what_they_depend_on(tmp_path, monkeypatch):
    import sys

    from services.training.data import QueryLine

    lr = load_bench("routing_late_reader")
    gate, slots = tmp_path / "gate", tmp_path / "slots"
    gate.mkdir()
    slots.mkdir()
    (gate / "gate.json").write_text("{}")
    (slots / "slots.json").write_text("{}")
    calls = []

    def fake(lines, tools, g, sl, progress=True):  # the slot reader's reading is the stated-probe bench's
        calls.append(len(lines))
        return [(ln.query, ["q?"], [1.5]) for ln in lines]

    import routing_stated_probe  # importable: load_bench put bench/ on the path

    monkeypatch.setattr(sys.modules["routing_stated_probe"], "teacher_pairs", fake)
    assert routing_stated_probe.teacher_pairs is fake
    lines = [QueryLine(id="a", server="s", tool="t", query="hello there", args={}, history=())]
    out = tmp_path / "out"
    first = lr.teacher_for(lines, [], str(gate), str(slots), out, progress=False)
    assert first == [("hello there", ["q?"], [1.5])] and calls == [1]
    assert lr.teacher_for(lines, [], str(gate), str(slots), out, progress=False) == first and calls == [1]
    (slots / "slots.json").write_text('{"data_hash": "another reader"}')
    lr.teacher_for(lines, [], str(gate), str(slots), out, progress=False)
    assert calls == [1, 1] and len(list(out.glob("teacher-*.json"))) == 2


def test_plot_writes_a_png(tmp_path):
    lr = load_bench("routing_late_reader")
    lat = {"p50": 10.0, "p90": 20.0, "p95": 30.0, "p99": 40.0}
    fig = {"auc": 0.97, "accuracy": 0.93, "threshold": 0.0}
    report = {"stated": {"slot reader": fig, "late reader": fig},
              "read_ms_per_escalation": {"slot reader": lat, "late reader (head)": lat}}
    lr.plot(report, str(tmp_path / "l.png"))
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    gain = {"choose_top1_slb": 0.8, "choose_top1": 0.8, "best_if_kept": {"top1": 0.803}}
    report["choose_production"] = {"slot reader": {**gain, "choose_top1": 0.81}, "late reader": gain}
    lr.plot(report, str(tmp_path / "c.png"))  # a third panel: the gain on the production model's choosing lines
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cf = {"slb_top1": 0.8, "top1": 0.805}
    report["choose_production"] = {k: {**v, "crossfit": cf} for k, v in report["choose_production"].items()}
    lr.plot(report, str(tmp_path / "x.png"))  # with the cross-fit: a third bar per reader
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bench_names_a_missing_input_before_loading_anything(tmp_path, capsys):
    lr = load_bench("routing_late_reader")
    with pytest.raises(SystemExit) as e:
        lr.main(["--gate", str(tmp_path / "nogate")])
    assert e.value.code == 2 and "make setup" in capsys.readouterr().err
