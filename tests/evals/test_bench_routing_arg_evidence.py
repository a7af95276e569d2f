"""bench/routing_arg_evidence.py's reader cache and plot (the features are services/router/argevidence.py's, tested
in tests/router/test_argevidence.py; the arms' run is the bench's)."""

import pytest

from tests.conftest import load_bench


def test_reader_cache_asks_the_real_reader_once_per_request_and_tool(all_tools):
    from services.engine.slots import SlotModel

    path = "var/models/slots"
    if not SlotModel.exists(path):
        pytest.fail("no slot model at var/models/slots: run `make setup` (make models trains it)")
    ae = load_bench("routing_arg_evidence")
    by_name = {t.name: t for t in all_tools}
    reader = SlotModel(path, threads=1)
    cache = ae.ReaderCache(reader, by_name)
    text = "list the pods in the kube-system namespace"
    ns, plain = cache.read(text, ["pods_list_in_namespace", "pods_list"])
    assert ae.candidate_feature(ns, "req_min", reader.threshold) > 0
    assert ae.candidate_feature(plain, "req_min", reader.threshold) == 0.0
    assert len(cache.line_seconds) == 1
    assert cache.read(text, ["pods_list"]) == [plain] and len(cache.line_seconds) == 1  # cached: no new reading
    # the batch that reads them: every question padded to the longest (question + request tokens)
    tools = ["pods_list_in_namespace", "pods_list"]
    lens = [cache.tokens[(text, t, n)] for t, rd in zip(tools, (ns, plain), strict=True) for n, _, _ in rd]
    assert len(lens) == len(ns) + len(plain) and all(n > len(text.split()) for n in lens)
    assert cache.padded_tokens(text, tools, [ns, plain], False) == len(lens) * max(lens)
    req = [cache.tokens[(text, "pods_list_in_namespace", n)] for n, r, _ in ns if r]  # pods_list requires none
    assert cache.padded_tokens(text, tools, [ns, plain], True) == len(req) * max(req) < len(lens) * max(lens)
    assert cache.padded_tokens(text, ["pods_list"], [plain], True) == 0


def test_plot_writes_a_png(tmp_path):
    ae = load_bench("routing_arg_evidence")
    size = {"accuracy": 0.9, "ci95": [0.87, 0.92]}
    report = {"n": 962, "draws": 3, "pooled": {arm: {"10": size, "250": size} for arm in ("none", "arg evidence")}}
    ae.plot(report, str(tmp_path / "a.png"))
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
