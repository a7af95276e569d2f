"""RoPE reanchor: cos/sin table and rotation parity with the numpy reference on every ISA, and
bit-exact parity with ggml's own CPU RoPE (llama.cpp's K-shift kernel) for NORM, NEOX, partial
rotation, YaRN and freq_factors."""

from __future__ import annotations

import nexus_native as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_ggml import GgmlRope
from native_helpers import make_block, make_spec, spec_dict
from nexus_native import reference as ref

ISAS = nn.available_isas()


def spec_variants():
    yield "norm", make_spec()
    yield "neox", make_spec(rope_type=nn.RopeType.NEOX, freq_base=1e6)
    yield "partial-norm", make_spec(n_rot=40)
    yield "partial-neox", make_spec(n_rot=24, rope_type=nn.RopeType.NEOX)
    yield "linear-scaled", make_spec(freq_scale=0.25)
    yield "yarn", make_spec(freq_scale=0.25, ext_factor=1.0, attn_factor=0.8, n_ctx_orig=4096)
    yield "yarn-neox-ff", make_spec(
        rope_type=nn.RopeType.NEOX, freq_scale=0.5, ext_factor=0.7, attn_factor=1.1, n_ctx_orig=2048,
        freq_factors=np.linspace(1.0, 6.0, 32, dtype=np.float32),
    )  # fmt: skip
    yield "freq-factors", make_spec(freq_factors=np.geomspace(1.0, 8.0, 32).astype(np.float32))


SPECS = dict(spec_variants())
DELTAS = [1, -1, 7, -300, 1000, 4095, 100000]


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("fma", [True, False])
def test_rope_cache_matches_reference_exactly(name, fma):
    spec = SPECS[name]
    for delta in DELTAS + [0]:
        np.testing.assert_array_equal(
            nn.rope_cache(spec, delta, fma=fma), ref.rope_cache(spec_dict(spec), delta, fma=fma)
        )


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("fma", [True, False])
def test_rotation_matches_reference_bit_for_bit(rng, name, isa, fma):
    spec = SPECS[name]
    k = (rng.standard_normal((37, spec.n_head_kv, spec.head_dim)) * 4).astype(np.float16)
    for delta in DELTAS:
        got = k.copy()
        nn.rope_reanchor(got, delta, spec, isa=isa, fma=fma)
        cache = ref.rope_cache(spec_dict(spec), delta, fma=fma)
        expect = ref.rope_rotate(k, cache, spec.head_dim, spec.n_rot, spec.rope_type.value, fma=fma)
        np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))
        # dims beyond n_rot are never touched
        np.testing.assert_array_equal(got[..., spec.n_rot :], k[..., spec.n_rot :])


@pytest.fixture(scope="module")
def ggml():
    return GgmlRope()


@pytest.mark.parametrize("name", list(SPECS))
def test_reanchor_is_bit_identical_to_ggml_cpu_rope(ggml, rng, name):
    spec = SPECS[name]
    k = (rng.standard_normal((50, spec.n_head_kv, spec.head_dim)) * 3).astype(np.float16)
    for delta in DELTAS:
        expect = ggml.rope(k, delta, spec)
        for isa in ISAS:
            got = k.copy()
            nn.rope_reanchor(got, delta, spec, isa=isa)  # default fma=True: llama-cpp-python's FMA build
            diff = np.count_nonzero(got.view(np.uint16) != expect.view(np.uint16))
            assert diff == 0, f"{name} delta={delta} isa={isa}: {diff} elements differ from ggml's RoPE"


@settings(max_examples=60, deadline=None)
@given(
    head_dim=st.sampled_from([2, 8, 14, 32, 64, 80, 128]),
    rot_frac=st.sampled_from([1.0, 0.5, 0.25]),
    neox=st.booleans(),
    delta=st.integers(-50000, 50000),
    n=st.integers(1, 9),
    seed=st.integers(0, 2**31),
)
def test_all_isas_agree_on_odd_geometries(head_dim, rot_frac, neox, delta, n, seed):
    n_rot = max(2, int(head_dim * rot_frac) // 2 * 2)
    spec = make_spec(head_dim=head_dim, n_rot=n_rot, rope_type=nn.RopeType.NEOX if neox else nn.RopeType.NORM)
    k = (np.random.default_rng(seed).standard_normal((n, spec.n_head_kv, head_dim)) * 5).astype(np.float16)
    outs = []
    for isa in ISAS:
        got = k.copy()
        nn.rope_reanchor(got, delta, spec, isa=isa)
        outs.append(got.view(np.uint16))
    cache = ref.rope_cache(spec_dict(spec), delta)
    expect = ref.rope_rotate(k, cache, head_dim, n_rot, spec.rope_type.value).view(np.uint16)
    for o in outs:
        np.testing.assert_array_equal(o, expect)


def test_delta_zero_is_the_identity_and_inverse_rotation_restores(rng):
    spec = make_spec()
    k = rng.standard_normal((20, 2, 64)).astype(np.float16)
    got = k.copy()
    nn.rope_reanchor(got, 0, spec)
    np.testing.assert_array_equal(got.view(np.uint16), k.view(np.uint16))
    nn.rope_reanchor(got, 1234, spec)
    assert np.count_nonzero(got != k) > 0
    nn.rope_reanchor(got, -1234, spec)
    # two float16 roundings: back within a couple of half-precision ulps
    np.testing.assert_allclose(got.astype(np.float32), k.astype(np.float32), rtol=4e-3, atol=4e-3)


def test_rotation_preserves_pair_norms(rng):
    spec = make_spec(rope_type=nn.RopeType.NEOX)
    k = rng.standard_normal((10, 2, 64)).astype(np.float16)
    got = k.copy()
    nn.rope_reanchor(got, 777, spec)
    n0 = k[..., :32].astype(np.float32) ** 2 + k[..., 32:].astype(np.float32) ** 2
    n1 = got[..., :32].astype(np.float32) ** 2 + got[..., 32:].astype(np.float32) ** 2
    np.testing.assert_allclose(n1, n0, rtol=3e-3, atol=1e-3)


def test_block_reanchor_equals_kernel_and_moves_the_anchor(rng):
    spec = make_spec()
    b = make_block(rng, spec, n_tokens=5, anchor=10)
    k = np.array(b.k)
    b.reanchor(250)
    assert b.anchor == 250
    expect = k.copy()
    nn.rope_reanchor(expect, 240, spec)
    np.testing.assert_array_equal(b.k, expect)
    with pytest.raises(ValueError, match="position"):
        b.reanchor(-5)


def test_reanchor_argument_checks():
    spec = make_spec()
    with pytest.raises(ValueError, match="float16"):
        nn.rope_reanchor(np.zeros((2, 64), np.float32), 1, spec)
    with pytest.raises(ValueError, match="contiguous"):
        nn.rope_reanchor(np.zeros((2, 128), np.float16)[:, ::2], 1, spec)
    ro = np.zeros((2, 64), np.float16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        nn.rope_reanchor(ro, 1, spec)
    with pytest.raises(ValueError, match="multiple of head_dim"):
        nn.rope_reanchor(np.zeros(65, np.float16), 1, spec)
