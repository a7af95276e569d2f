"""bench/routing_calibration.py's arms and plot (the arms recalibrate cached fold models: the bench's run)."""

from tests.conftest import load_bench


def _bench():
    return load_bench("routing_calibration")


def test_arms_compare_the_calibration_lines_and_the_wider_grid_against_validation_only():
    rc = _bench()
    assert rc.ARMS["validation"] == (False, rc.NARROW_GRID) and rc.ARMS["validation + calibration"][0] is True
    assert set(rc.NARROW_GRID) < set(rc.WIDE_GRID) and max(rc.WIDE_GRID) > max(rc.NARROW_GRID) == 1.5


def test_plot_writes_a_png(tmp_path):
    rc = _bench()
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"folds": [0, 1], "n": 640, "pooled": {arm: {"250": size, "10": size} for arm in rc.ARMS}}
    rc.plot(report, str(tmp_path / "c.png"))
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
