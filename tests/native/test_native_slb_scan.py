"""INT8 SLB: quantisation and scan parity (every ISA path) against the numpy reference, edge cases."""

from __future__ import annotations

import threading

import nexus_native as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from nexus_native import reference as ref

ISAS = nn.available_isas()


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_default_isa_is_the_best_available_one():
    assert nn.isa() in ISAS
    assert "scalar" in ISAS
    order = ["avx512vnni", "avx2", "neon", "scalar"]
    assert nn.isa() == next(i for i in order if i in ISAS)
    assert nn.Int8Index(8).isa == nn.isa()


def test_forcing_an_unsupported_or_unknown_isa_is_a_value_error():
    with pytest.raises(ValueError, match="unknown ISA"):
        nn.Int8Index(8, isa="sse9")
    missing = [i for i in ("avx2", "avx512vnni", "neon") if i not in ISAS]
    for name in missing:
        with pytest.raises(ValueError, match="not supported"):
            nn.Int8Index(8, isa=name)


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=70), elements=finite)
)
def test_quantize_int8_matches_reference_bit_for_bit(x):
    rq, rs = ref.quantize_int8(x)
    for isa in ISAS:
        q, s = nn.quantize_int8(x, isa=isa)
        np.testing.assert_array_equal(q, rq)
        np.testing.assert_array_equal(s, rs)
        assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == x.shape[:-1]


def test_quantize_int8_zero_vector_and_rounding_ties():
    q, s = nn.quantize_int8(np.zeros(5, np.float32))
    assert s == 0 and not q.any()
    # 127 * 0.5 / 1.0 = 63.5 -> 64 (half to even), -63.5 -> -64, 1.0 -> 127
    q, s = nn.quantize_int8(np.array([1.0, 0.5, -0.5, 0.0], np.float32))
    assert q.tolist() == [127, 64, -64, 0]
    assert s == np.float32(1.0) / np.float32(127)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("isa", ISAS)
def test_quantize_int8_rejects_non_finite(bad, isa):
    for n, at in ((10, 3), (40, 39), (17, 16)):  # in a full vector and in a masked tail
        x = np.ones(n, np.float32)
        x[at] = bad
        with pytest.raises(ValueError, match="non-finite"):
            nn.quantize_int8(x, isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 300),
    dim=st.sampled_from([1, 3, 31, 64, 65, 128, 384, 500]),
    k=st.integers(0, 320),
    seed=st.integers(0, 2**32 - 1),
)
def test_search_matches_reference_on_every_isa(isa, n, dim, k, seed):
    rng = np.random.default_rng(seed)
    x = unit_rows(rng, n, dim) if n else np.zeros((0, dim), np.float32)
    ix = nn.Int8Index(dim, isa=isa)
    r = ref.Int8IndexRef(dim)
    if n:
        np.testing.assert_array_equal(ix.add(x), r.add(x))
    q = unit_rows(rng, 1, dim)[0]
    ids, scores = ix.search(q, k)
    rids, rscores = r.search(q, k)
    np.testing.assert_array_equal(ids, rids)
    np.testing.assert_array_equal(scores, rscores)
    assert len(ids) == min(k, n)
    np.testing.assert_array_equal(ix.scores(q), r.scores(q))
    np.testing.assert_array_equal(ix.rows(), r.q)
    np.testing.assert_array_equal(ix.scales(), r.scale)


def test_all_isas_agree_exactly_on_a_large_index(rng):
    # > 256 rows exercises the chunked scan, k > 64 the partial-sort path, len*stride > 256 KiB the GIL-free path
    x = unit_rows(rng, 5000, 384)
    q = unit_rows(rng, 1, 384)[0]
    results = []
    for isa in ISAS:
        ix = nn.Int8Index(384, isa=isa)
        ix.add(x)
        results.append((ix.search(q, 10), ix.search(q, 100), ix.scores(q)))
    r = ref.Int8IndexRef(384)
    r.add(x)
    for (ids10, s10), (ids100, s100), sc in results:
        np.testing.assert_array_equal(ids10, r.search(q, 10)[0])
        np.testing.assert_array_equal(s10, r.search(q, 10)[1])
        np.testing.assert_array_equal(ids100, r.search(q, 100)[0])
        np.testing.assert_array_equal(s100, r.search(q, 100)[1])
        np.testing.assert_array_equal(sc, r.scores(q))


def test_scores_are_int_dot_times_both_scales(rng):
    x = unit_rows(rng, 20, 384)
    ix = nn.Int8Index(384)
    ix.add(x)
    q = x[4]
    qq, qs = nn.quantize_int8(q)
    expect = (ix.rows().astype(np.int32) @ qq.astype(np.int32)).astype(np.float32) * ix.scales() * qs
    np.testing.assert_array_equal(ix.scores(q), expect.astype(np.float32))
    ids, scores = ix.search(q, 1)
    assert ids[0] == 4 and abs(scores[0] - 1.0) < 0.01


def test_ties_rank_the_smaller_id_first(rng):
    v = unit_rows(rng, 1, 64)[0]
    ix = nn.Int8Index(64)
    ix.add(np.stack([v, v, v]), ids=np.array([30, 10, 20]))
    ids, scores = ix.search(v, 3)
    assert ids.tolist() == [10, 20, 30]
    assert scores[0] == scores[1] == scores[2]


def test_add_replace_remove_keep_parity_with_reference(rng):
    ix, r = nn.Int8Index(96), ref.Int8IndexRef(96)
    x = unit_rows(rng, 50, 96)
    np.testing.assert_array_equal(ix.add(x[:30]), r.add(x[:30]))
    np.testing.assert_array_equal(
        ix.add(x[30:], ids=np.arange(100, 120)), r.add(x[30:], ids=np.arange(100, 120))
    )
    for id_ in (0, 17, 29, 100, 119, 5):
        ix.remove(id_)
        r.remove(id_)
    ix.replace(7, x[49])
    r.replace(7, x[49])
    assert ix.next_id == r.next_id == 120
    assert len(ix) == len(r) == 44 and 17 not in ix and 18 in ix
    np.testing.assert_array_equal(ix.ids(), r.ids)
    for q in unit_rows(rng, 5, 96):
        for a, b in zip(ix.search(q, 12), r.search(q, 12), strict=True):
            np.testing.assert_array_equal(a, b)
    ix.clear()
    assert len(ix) == 0 and ix.search(x[0], 5)[0].size == 0


def test_growth_keeps_rows_64_byte_aligned_and_intact(rng):
    ix = nn.Int8Index(100, capacity=1)
    assert ix.stride == 128
    x = unit_rows(rng, 1000, 100)
    for i in range(0, 1000, 7):
        ix.add(x[i : i + 7])
    assert ix.capacity >= 1000
    np.testing.assert_array_equal(ix.rows(), ref.quantize_int8(x)[0])


@pytest.mark.parametrize("k", [0, 1, 5, 1000])
def test_k_larger_than_n_and_empty_index(k):
    ix = nn.Int8Index(16)
    ids, scores = ix.search(np.ones(16, np.float32), k)
    assert ids.shape == (0,) and scores.shape == (0,) and ids.dtype == np.int64 and scores.dtype == np.float32
    ix.add(np.eye(16, dtype=np.float32)[:3])
    ids, _ = ix.search(np.ones(16, np.float32), k)
    assert len(ids) == min(k, 3)


def test_bad_arguments_raise_clean_exceptions():
    with pytest.raises(ValueError):
        nn.Int8Index(0)
    ix = nn.Int8Index(8)
    ix.add(np.eye(8, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        ix.search(np.ones(7, np.float32), 3)
    with pytest.raises(ValueError, match="shape"):
        ix.search(np.ones((2, 8), np.float32), 3)
    with pytest.raises(ValueError, match="k must be"):
        ix.search(np.ones(8, np.float32), -1)
    with pytest.raises(ValueError, match="non-finite"):
        ix.search(np.full(8, np.nan, np.float32), 3)
    with pytest.raises(ValueError, match="shape"):
        ix.add(np.ones((2, 9), np.float32))
    with pytest.raises(ValueError, match="already"):
        ix.add(np.ones(8, np.float32), ids=np.array([3]))
    with pytest.raises(ValueError, match="repeated"):
        ix.add(np.ones((2, 8), np.float32), ids=np.array([50, 50]))
    with pytest.raises(ValueError, match="non-finite"):
        ix.add(np.full((1, 8), np.inf, np.float32))
    assert len(ix) == 8  # failed adds changed nothing
    with pytest.raises(KeyError):
        ix.remove(99)
    with pytest.raises(KeyError):
        ix.replace(99, np.ones(8, np.float32))


def test_float64_and_list_queries_are_converted():
    ix = nn.Int8Index(4)
    ix.add(np.eye(4, dtype=np.float32))
    assert ix.search([0.0, 0.0, 1.0, 0.0], 1)[0].tolist() == [2]
    assert ix.search(np.array([0, 1.0, 0, 0]), 1)[0].tolist() == [1]


def test_concurrent_searches_without_the_gil_agree_with_a_serial_run(rng):
    x = unit_rows(rng, 3000, 384)  # large enough that search releases the GIL
    ix = nn.Int8Index(384)
    ix.add(x)
    queries = unit_rows(rng, 16, 384)
    expect = [ix.search(q, 5)[0].tolist() for q in queries]
    got: dict[int, list[list[int]]] = {}

    def work(t: int) -> None:
        got[t] = [ix.search(q, 5)[0].tolist() for q in queries for _ in range(3)][::3]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(got[t] == expect for t in range(4))


def test_memory_read_sum_and_stream_read_sum_match_numpy(rng):
    for n in (0, 1, 31, 127, 128, 255, 256, 1000, 1 << 20):
        buf = rng.integers(0, 256, n, dtype=np.uint8)
        assert nn.memory_read_sum(buf) == int(buf.sum(dtype=np.uint64))
    ix = nn.Int8Index(100)
    ix.add(unit_rows(rng, 10, 100))
    rows_u8 = ix.rows().view(np.uint8)
    # padding bytes (stride 128 - dim 100) are zero, so the sum over the padded rows equals the rows' sum
    assert ix.stream_read_sum() == int(rows_u8.sum(dtype=np.uint64))


def test_crc32_matches_zlib(rng):
    import zlib

    for n in (0, 1, 7, 8, 9, 1000, 12345):
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert nn.crc32(b) == zlib.crc32(b)
        assert nn.crc32(b, 0x1234) == zlib.crc32(b, 0x1234)


@pytest.mark.parametrize("isa", ISAS)
def test_subnormal_vectors_quantise_without_overflow(isa):
    x = np.array([1e-40, -5e-41, 0.0, 2.5e-41], np.float32)
    q, s = nn.quantize_int8(x, isa=isa)
    rq, rs = ref.quantize_int8(x)
    np.testing.assert_array_equal(q, rq)
    np.testing.assert_array_equal(s, rs)
    assert q[0] == 127 and q[2] == 0 and -64 <= q[1] <= -63
