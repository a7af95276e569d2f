"""bench/routing_exemplar_loss.py's training score and plot (the training run is the bench's)."""

from tests.conftest import load_bench


def _bench():
    return load_bench("routing_exemplar_loss")


def test_logits_are_the_router_score_with_the_own_row_left_out():
    import torch

    rb = _bench()
    keys = torch.eye(3)
    bank = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0.6, 0.8, 0]])
    bank_tool = torch.tensor([[0, 1, 1]])
    q = torch.tensor([[0.6, 0.8, 0.0]])
    got = rb.exemplar_logits(q, keys, bank, bank_tool, 2.0)
    # tool 0: key .6 + 2 * .6; tool 1: key .8 + 2 * 1.0 (row 2); tool 2 has no row: key + 2 * key
    assert torch.allclose(got, torch.tensor([[1.8, 2.8, 0.0]]))
    loo = rb.exemplar_logits(q, keys, bank, bank_tool, 2.0, self_rows=[2])
    assert torch.allclose(loo, torch.tensor([[1.8, 0.8 + 2 * 0.8, 0.0]]))  # its own row is not its exemplar
    assert torch.allclose(got, rb.exemplar_logits(q, keys, bank, bank_tool, 2.0))  # the bank is not modified


def test_plot_writes_a_png(tmp_path):
    rb = _bench()
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"fold": 0, "n": 319, "arms": {a: {"sizes": {"10": size, "250": size}} for a in ("x", "y")}}
    rb.plot(report, str(tmp_path / "e.png"))
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
