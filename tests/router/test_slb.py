"""SLB: INT8 quantization semantics, native/numpy parity, top-k order, registry masks and exemplar keys."""

import numpy as np
import pytest

from services.router.slb import NumpyInt8Index, SemanticIndex, int8_backend, pool_exemplars, quantize_int8


def _unit(rng, n, d=384):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_quantize_is_symmetric_per_vector():
    q, s = quantize_int8(np.array([[0.5, -1.0, 0.25, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32))
    assert q.dtype == np.int8 and q[0].tolist() == [64, -127, 32, 0]  # rint(63.5) = 64 (half to even)
    assert s[0] == pytest.approx(1.0 / 127) and s[1] == 0.0 and q[1].tolist() == [0, 0, 0, 0]


def test_quantize_rejects_non_finite():
    with pytest.raises(ValueError):
        quantize_int8(np.array([1.0, np.nan], np.float32))


def test_int8_scores_track_float_cosine():
    rng = np.random.default_rng(0)
    keys, q = _unit(rng, 250), _unit(rng, 1)[0]
    idx = NumpyInt8Index(384)
    idx.add(keys)
    assert np.max(np.abs(idx.scores(q) - keys @ q)) < 0.01


def _native():
    """The native module, which `make setup` builds: its absence is a failure, not a skip."""
    try:
        import nexus_native
    except ImportError as e:
        pytest.fail(f"nexus_native is not importable ({e}): run `make setup` (it builds native/)")
    return nexus_native


def test_native_scan_matches_numpy_reference():
    nn = _native()
    assert hasattr(nn, "Int8Index")
    rng = np.random.default_rng(1)
    keys, queries = _unit(rng, 250), _unit(rng, 5)
    ref, nat = NumpyInt8Index(384), int8_backend(384, prefer_native=True)
    assert not isinstance(nat, NumpyInt8Index)
    ref.add(keys[:100])
    ref.add(keys[100:])
    nat.add(keys[:100])
    nat.add(keys[100:])
    for q in queries:
        np.testing.assert_allclose(nat.scores(q), ref.scores(q), rtol=0, atol=1e-6)


@pytest.mark.parametrize("native", [False, True])
def test_search_orders_and_masks(native):
    if native:
        _native()
    rng = np.random.default_rng(2)
    keys = _unit(rng, 40)
    names = [f"t{i:02d}" for i in range(40)]
    index = SemanticIndex(384, prefer_native=native)
    index.replace_all(dict(zip(names, keys, strict=True)))
    q = keys[7] * 0.8 + keys[3] * 0.2
    top = index.search(q, 5)
    assert top[0][0] == "t07" and [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    mask = np.zeros(40, bool)
    mask[[3, 11, 20]] = True
    masked = index.search(q, 5, allowed=mask)
    assert [n for n, _ in masked][0] == "t03" and {n for n, _ in masked} == {"t03", "t11", "t20"}


def test_ties_break_by_registry_order():
    v = np.zeros(384, np.float32)
    v[0] = 1.0
    index = SemanticIndex(384, prefer_native=False)
    index.replace_all({"b": v, "a": v, "c": -v})
    assert [n for n, _ in index.search(v, 3)] == ["b", "a", "c"]


def test_exemplar_keys_lift_their_tool_and_spare_tools_without_them():
    rng = np.random.default_rng(3)
    keys = _unit(rng, 3)
    query = _unit(rng, 1)[0]
    index = SemanticIndex(384, exemplar_weight=1.0, prefer_native=False)
    index.replace_all({"a": keys[0], "b": keys[1], "c": keys[2]})
    plain = dict(index.search(query, 3))
    # without exemplars every tool scores (1 + w) * text: the ranking is the plain cosine ranking
    assert sorted(plain, key=plain.get) == sorted(plain, key=lambda n: float(keys["abc".index(n)] @ query))
    index.set_exemplars({"c": np.vstack([query, -query])})  # c has an exemplar identical to the query
    top = index.search(query, 3)
    assert top[0][0] == "c" and top[0][1] == pytest.approx(float(keys[2] @ query) + 1.0, abs=0.02)


@pytest.mark.parametrize("native", [False, True])
def test_exemplars_alternate_keys_and_the_gap_score_each_tool_apart(native):
    if native:
        _native()
    rng = np.random.default_rng(5)
    keys, alt = _unit(rng, 3), _unit(rng, 3)
    query = _unit(rng, 1)[0]
    alt[2] = query  # c's alternate key is the query itself
    ex_a = _unit(rng, 2)
    index = SemanticIndex(384, exemplar_weight=0.5, prefer_native=native, exemplar_gap=0.1)
    index.set_alt_keys({"a": alt[0], "b": alt[1], "c": alt[2]})
    index.set_exemplars({"a": ex_a})  # a is the only (so the last) tool with exemplars
    index.replace_all({"a": keys[0], "b": keys[1], "c": keys[2]})
    names, got = index.scores(query)
    text = {n: max(float(keys[i] @ query), float(alt[i] @ query)) for i, n in enumerate("abc")}
    want = {"a": text["a"] + 0.5 * float((ex_a @ query).max()),  # its exemplars only, never the alternate rows
            "b": text["b"] + 0.5 * (text["b"] + 0.1), "c": text["c"] + 0.5 * (text["c"] + 0.1)}
    assert names == ["a", "b", "c"]
    assert list(got) == pytest.approx([want[n] for n in names], abs=0.02)
    assert want["a"] < 0.5 * want["c"]  # the alternate row that equals the query does not lift a


def test_pooling_is_the_max_at_zero_and_log_mean_exp_above():
    sims = np.array([0.9, 0.2, 0.85, 0.5, 0.1, 0.7], np.float32)
    starts = np.array([0, 3, 4])  # groups [0.9, 0.2, 0.85], [0.5], [0.1, 0.7]
    assert pool_exemplars(sims, starts).tolist() == pytest.approx([0.9, 0.5, 0.7])
    t = 0.05
    want = [float(t * np.log(np.mean(np.exp(np.asarray(g) / t)))) for g in ([0.9, 0.2, 0.85], [0.5], [0.1, 0.7])]
    got = pool_exemplars(sims, starts, t)
    assert got.dtype == np.float32 and got.tolist() == pytest.approx(want, abs=1e-5)
    assert np.all(got <= pool_exemplars(sims, starts) + 1e-6) and got[1] == pytest.approx(0.5)  # one row: itself
    assert pool_exemplars(sims, starts, 100.0).tolist() == pytest.approx([0.65, 0.5, 0.4], abs=1e-3)  # -> the mean
    # two close exemplars beat one stray one of the same max
    assert pool_exemplars(np.array([0.8, 0.79, 0.8, 0.1], np.float32), np.array([0, 2]), 0.02).tolist()[0] > \
        pool_exemplars(np.array([0.8, 0.79, 0.8, 0.1], np.float32), np.array([0, 2]), 0.02).tolist()[1]


@pytest.mark.parametrize("native", [False, True])
def test_the_index_pools_exemplars_at_its_temperature(native):
    if native:
        _native()
    rng = np.random.default_rng(6)
    keys, ex = _unit(rng, 2), _unit(rng, 3)
    query = _unit(rng, 1)[0]
    index = SemanticIndex(384, exemplar_weight=2.0, prefer_native=native, exemplar_gap=0.05,
                          exemplar_temperature=0.03)
    index.set_exemplars({"a": ex})
    index.replace_all({"a": keys[0], "b": keys[1]})
    _, got = index.scores(query)
    sims = (ex @ query).astype(np.float32)
    lme = float(sims.max() + 0.03 * np.log(np.mean(np.exp((sims - sims.max()) / 0.03))))
    kb = float(keys[1] @ query)
    assert list(got) == pytest.approx([float(keys[0] @ query) + 2.0 * lme, kb + 2.0 * (kb + 0.05)], abs=0.03)
    with pytest.raises(ValueError, match="temperature"):
        SemanticIndex(384, exemplar_temperature=-0.1)


@pytest.mark.parametrize("native", [False, True])
def test_a_tool_bias_is_added_to_its_tool_through_registry_changes(native):
    if native:
        _native()
    rng = np.random.default_rng(7)
    keys, ex, query = _unit(rng, 3), _unit(rng, 2), _unit(rng, 1)[0]
    index = SemanticIndex(384, exemplar_weight=1.5, prefer_native=native, exemplar_temperature=0.02)
    index.set_exemplars({"a": ex})
    index.replace_all({"a": keys[0], "b": keys[1]})
    _, before = index.scores(query)
    index.set_tool_bias({"b": 0.25, "later": -0.5})
    _, after = index.scores(query)
    assert list(after) == pytest.approx([before[0], before[1] + 0.25], abs=1e-6)
    assert index.search(query, 1, bonus=np.array([0.0, 10.0], np.float32))[0][0] == "b"
    index.upsert({"later": keys[2]})  # a tool named by the bias gets it when registered; the others keep theirs
    names, s = index.scores(query)
    text_only = SemanticIndex(384, prefer_native=native)
    text_only.replace_all({"later": keys[2]})
    assert names == ["a", "b", "later"] and s[2] == pytest.approx(text_only.scores(query)[1][0] * 2.5 - 0.5, abs=0.02)
    index.set_tool_bias({})
    assert list(index.scores(query)[1][:2]) == pytest.approx(list(before), abs=1e-6)
    with pytest.raises(ValueError, match="not finite"):
        index.set_tool_bias({"a": float("nan")})


def test_upsert_remove_and_vector_roundtrip():
    rng = np.random.default_rng(4)
    keys = _unit(rng, 3)
    index = SemanticIndex(384, prefer_native=False)
    index.replace_all({"a": keys[0], "b": keys[1]})
    index.upsert({"c": keys[2], "a": keys[1]})
    assert index.names() == ["a", "b", "c"] and np.allclose(index.vector("a"), keys[1])
    index.remove(["b", "missing"])
    assert index.names() == ["a", "c"] and "b" not in index
    with pytest.raises(ValueError):
        index.replace_all({"bad": np.zeros(3, np.float32)})
