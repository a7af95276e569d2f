"""llama.cpp sequence-state blobs (synthetic, in the exact llama.cpp 0.3.36 layout): parity of the
native converter with the reference in both directions, V layouts, cell order, and clean
StateBlobError for every malformed blob."""

from __future__ import annotations

import struct

import nexus_native as nn
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_helpers import make_block, make_spec, random_planes
from nexus_native import reference as ref


def blob_from(k, v, transposed_in: bool, position: int, *, v_trans: bool, n_stream: int = 1, seq_id: int = 0):
    return ref.state_from_atb(
        k, v, int(transposed_in), position, v_trans=v_trans, n_stream=n_stream, seq_id=seq_id
    )


@pytest.mark.parametrize("v_trans", [False, True])
def test_blob_to_block_matches_reference(rng, v_trans):
    spec = make_spec()
    k, v = random_planes(rng, spec, 13)
    blob = blob_from(k, v, False, 40, v_trans=v_trans, seq_id=1)
    b = nn.AtbBlock.from_state(blob, spec, token_hash=77)
    r = ref.atb_from_state(blob, spec.n_embd, spec.n_layer)
    assert b.anchor == r["anchor"] == 40 and b.n_tokens == 13 and b.token_hash == 77
    assert b.v_layout == (nn.VLayout.TRANSPOSED if v_trans else nn.VLayout.ROWS)
    np.testing.assert_array_equal(b.k, r["k"])
    np.testing.assert_array_equal(b.v, r["v"])
    np.testing.assert_array_equal(b.k, k)
    np.testing.assert_array_equal(b.v, v.transpose(0, 2, 1) if v_trans else v)


@pytest.mark.parametrize("layout_in", [False, True])
@pytest.mark.parametrize("v_trans_out", [False, True])
@pytest.mark.parametrize("n_stream", [1, 3])
@pytest.mark.parametrize(
    ("rope", "n_rot"), [(nn.RopeType.NEOX, 32), (nn.RopeType.NORM, 40), (nn.RopeType.NORM, 64)]
)
def test_block_to_blob_is_byte_identical_to_reference(rng, layout_in, v_trans_out, n_stream, rope, n_rot):
    spec = make_spec(rope_type=rope, n_rot=n_rot)
    b = make_block(rng, spec, n_tokens=9, anchor=100, transposed=layout_in)
    for position, reanchor in ((100, True), (0, True), (2047, True), (5, False)):
        blob = b.to_state(position, v_trans=v_trans_out, n_stream=n_stream, seq_id=2, reanchor=reanchor)
        k = np.asarray(b.k)
        if reanchor and position != b.anchor:
            cache = ref.rope_cache(dict(spec.to_dict(), rope_type=rope.value), position - b.anchor)
            k = ref.rope_rotate(k, cache, spec.head_dim, spec.n_rot, rope.value)
        expect = ref.state_from_atb(
            k, b.v, int(layout_in), position, v_trans=v_trans_out, n_stream=n_stream, seq_id=2
        )
        assert blob == expect
        info = nn.state_info(blob)
        assert info["seq_id"] == 2 and info["n_stream"] == n_stream and info["cell_count"] == 9
        assert info["positions"].tolist() == list(range(position, position + 9))
        assert info["v_trans"] == v_trans_out
    assert b.anchor == 100  # to_state never modifies the block


@pytest.mark.parametrize("v_trans", [False, True])
def test_round_trip_block_blob_block(rng, v_trans):
    spec = make_spec()
    b = make_block(rng, spec, n_tokens=6, anchor=0, transposed=v_trans)
    c = nn.AtbBlock.from_state(b.to_state(0), spec)
    np.testing.assert_array_equal(c.k, b.k)
    np.testing.assert_array_equal(c.v, b.v)
    # layout conversion both ways is lossless
    d = nn.AtbBlock.from_state(b.to_state(0, v_trans=not v_trans), spec)
    e = nn.AtbBlock.from_state(d.to_state(0, v_trans=v_trans), spec)
    np.testing.assert_array_equal(e.v, b.v)


def shuffled_blob(rng, spec, n, v_trans):
    """A blob whose cells are stored out of position order (as after cache fragmentation)."""
    k, v = random_planes(rng, spec, n)
    perm = rng.permutation(n)
    kp, vp = k[:, perm], v[:, perm]
    blob = bytearray(blob_from(kp, vp, False, 0, v_trans=v_trans))
    for i, p in enumerate(perm):  # rewrite cell positions: cell i holds token p
        struct.pack_into("<i", blob, 16 + 12 * i, 50 + int(p))
    return bytes(blob), k, v


@pytest.mark.parametrize("v_trans", [False, True])
def test_cells_in_any_order_are_sorted_by_position(rng, v_trans):
    spec = make_spec()
    blob, k, v = shuffled_blob(rng, spec, 17, v_trans)
    b = nn.AtbBlock.from_state(blob, spec)
    assert b.anchor == 50
    np.testing.assert_array_equal(b.k, k)
    np.testing.assert_array_equal(b.v, v.transpose(0, 2, 1) if v_trans else v)
    r = ref.atb_from_state(blob, spec.n_embd, spec.n_layer)
    np.testing.assert_array_equal(b.v, r["v"])


def test_non_contiguous_positions_are_rejected(rng):
    spec = make_spec()
    k, v = random_planes(rng, spec, 4)
    blob = bytearray(blob_from(k, v, False, 10, v_trans=False))
    struct.pack_into("<i", blob, 16 + 12 * 3, 99)
    with pytest.raises(nn.StateBlobError, match="contiguous"):
        nn.AtbBlock.from_state(bytes(blob), spec)
    struct.pack_into("<i", blob, 16 + 12 * 3, 11)  # duplicate position
    with pytest.raises(nn.StateBlobError, match="contiguous"):
        nn.AtbBlock.from_state(bytes(blob), spec)


def test_blob_that_does_not_fit_the_model_is_rejected(rng):
    spec = make_spec()
    k, v = random_planes(rng, spec, 3)
    blob = blob_from(k, v, False, 0, v_trans=False)
    with pytest.raises(nn.StateBlobError, match="n_layer"):
        nn.AtbBlock.from_state(blob, make_spec(n_layer=4))
    with pytest.raises(nn.StateBlobError, match="row size"):
        nn.AtbBlock.from_state(blob, make_spec(n_head_kv=1))
    b = bytearray(blob)
    struct.pack_into("<i", b, 16 + 36 + 8, 8)  # first K plane type := Q8_0
    with pytest.raises(nn.StateBlobError, match="only F16"):
        nn.AtbBlock.from_state(bytes(b), spec)
    blob_t = blob_from(k, v, False, 0, v_trans=True)
    with pytest.raises(nn.StateBlobError, match="row size|geometry"):
        nn.AtbBlock.from_state(blob_t, make_spec(head_dim=32))


def test_empty_and_multi_stream_blobs():
    spec = make_spec()
    empty = struct.pack("<IiII", ref.STATE_IO_MAGIC, 0, 2, 0) + struct.pack("<I", 0)
    assert nn.state_info(empty)["cell_count"] == 0
    with pytest.raises(nn.StateBlobError, match="no cells"):
        nn.AtbBlock.from_state(empty, spec)


def test_cells_in_a_later_stream_are_found(rng):
    spec = make_spec()
    k, v = random_planes(rng, spec, 2)
    one = blob_from(k, v, False, 0, v_trans=False)
    # n_stream = 2, stream 0 empty, stream 1 holds the cells
    blob = one[:8] + struct.pack("<II", 2, 0) + one[12:]
    info = nn.state_info(blob)
    assert info["stream"] == 1 and info["cell_count"] == 2
    np.testing.assert_array_equal(nn.AtbBlock.from_state(blob, spec).k, k)
    two = one[:8] + struct.pack("<I", 2) + one[12:] + one[12:]
    with pytest.raises(nn.StateBlobError, match="more than one stream"):
        nn.state_info(two)


def test_every_truncation_and_extension_is_rejected(rng):
    spec = make_spec(n_layer=2)
    k, v = random_planes(rng, spec, 3)
    for v_trans in (False, True):
        blob = blob_from(k, v, False, 0, v_trans=v_trans)
        for n in range(len(blob)):
            with pytest.raises(nn.StateBlobError):
                nn.state_info(blob[:n])
            with pytest.raises(ValueError):
                ref.parse_state(blob[:n])
        with pytest.raises(nn.StateBlobError, match="trailing"):
            nn.state_info(blob + b"\0")


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "message"),
    [
        (0, "<I", 0x12345678, "magic"),
        (8, "<I", 0, "n_stream"),
        (8, "<I", 10**6, "n_stream"),
        (12, "<I", 2**31, "cell_count"),
        (16 + 4, "<I", 2**30, "n_seq_id"),
        (16 + 36, "<I", 2, "v_trans"),
        (16 + 40, "<I", 0, "n_layer"),
        (16 + 40, "<I", 10**5, "n_layer"),
        (16 + 48, "<Q", 0, "row size"),
        (16 + 48, "<Q", 2**63, "row size"),
        (16 + 48, "<Q", 2**64 - 1, "row size"),
    ],
)
def test_tampered_blob_fields_are_rejected_with_a_reason(rng, offset, fmt, value, message):
    spec = make_spec()
    k, v = random_planes(rng, spec, 3)
    blob = bytearray(blob_from(k, v, False, 0, v_trans=False))
    struct.pack_into(fmt, blob, offset, value)
    with pytest.raises(nn.StateBlobError, match=message):
        nn.AtbBlock.from_state(bytes(blob), spec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_blobs_never_crash(rng, data):
    spec = make_spec(n_layer=2)
    k, v = random_planes(rng, spec, 2)
    good = bytearray(blob_from(k, v, False, 0, v_trans=data.draw(st.booleans())))
    if data.draw(st.booleans()):
        buf = bytes(good[:12]) + data.draw(st.binary(max_size=300))
    else:
        for _ in range(data.draw(st.integers(1, 6))):
            i = data.draw(st.integers(0, min(len(good), 200) - 1))
            good[i] = data.draw(st.integers(0, 255))
        buf = bytes(good)
    try:
        nn.AtbBlock.from_state(buf, spec)
    except nn.StateBlobError:
        pass


def test_to_state_argument_checks(rng):
    b = make_block(rng)
    with pytest.raises(ValueError, match="position"):
        b.to_state(-1)
    with pytest.raises(ValueError, match="position"):
        b.to_state(2**31 - 3)
    with pytest.raises(ValueError, match="n_stream"):
        b.to_state(0, n_stream=0)
    with pytest.raises(ValueError, match="seq_id"):
        b.to_state(0, seq_id=-1)


@pytest.mark.parametrize("v_trans", [False, True])
def test_to_state_into_a_reused_buffer_equals_to_state(rng, v_trans):
    b = make_block(rng, n_tokens=12, anchor=4)
    n = b.state_size(v_trans=v_trans, n_stream=2)
    for out in (bytearray(n + 10), np.zeros(n, np.uint8)):
        for position in (4, 900):
            assert b.to_state_into(out, position, v_trans=v_trans, n_stream=2) == n
            assert bytes(out[:n]) == b.to_state(position, v_trans=v_trans, n_stream=2)
    with pytest.raises(ValueError, match="needs"):
        b.to_state_into(bytearray(n - 1), 0, v_trans=v_trans, n_stream=2)
    with pytest.raises(BufferError):
        b.to_state_into(bytes(n), 0, v_trans=v_trans, n_stream=2)
    with pytest.raises(ValueError, match="contiguous"):
        b.to_state_into(np.zeros((2, n), np.uint8), 0)
