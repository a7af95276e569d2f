"""The .atb codec: byte-exact parity with the reference encoder, round trips, sparse files, and clean
rejection (AtbError / AtbMismatchError, never a crash) of malformed or foreign blocks."""

from __future__ import annotations

import os
import struct
import zlib

import nexus_native as nn
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_helpers import make_block, make_spec, random_planes, spec_dict
from nexus_native import reference as ref


def resign_header(data: bytes | bytearray) -> bytes:
    """Recompute the header CRC so a tampered field reaches the deeper validation."""
    b = bytearray(data)
    struct.pack_into("<I", b, 124, zlib.crc32(bytes(b[:124])))
    return bytes(b)


def test_header_layout_constants():
    assert nn.ATB_HEADER_SIZE == ref.ATB_HEADER.size == 128
    assert nn.ATB_VERSION == 1
    assert nn.ATB_PAGE_ALIGN_LOG2 == 21 and nn.ATB_COMPACT_ALIGN_LOG2 == 6


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("align_log2", [6, 12, 21])
def test_encoding_is_byte_identical_to_the_reference_encoder(rng, transposed, align_log2):
    spec = make_spec(
        n_rot=48, rope_type=nn.RopeType.NEOX, freq_factors=np.linspace(1, 4, 24, dtype=np.float32)
    )
    k, v = random_planes(rng, spec, 11, transposed)
    layout = nn.VLayout.TRANSPOSED if transposed else nn.VLayout.ROWS
    b = nn.AtbBlock(spec, k, v, 5, token_hash=2**64 - 3, v_layout=layout)
    data = b.to_bytes(align_log2)
    expect = ref.encode_atb(spec_dict(spec), k, v, 5, 2**64 - 3, int(transposed), align_log2)
    assert data == expect
    assert len(data) == b.encoded_size(align_log2)
    # and the reference decoder reads the native bytes back
    dec = ref.decode_atb(data, spec_dict(spec))
    np.testing.assert_array_equal(dec["k"], k)
    np.testing.assert_array_equal(dec["v"], v)


def test_planes_start_on_2mib_boundaries_by_default(rng):
    b = make_block(rng, n_tokens=5)
    data = b.to_bytes()
    h = nn.read_atb_header(data)
    assert h["align_log2"] == 21 and h["data_offset"] == 2 << 20 and h["plane_stride"] == 2 << 20
    assert h["file_size"] == len(data) == (2 << 20) * (2 * b.n_layer) + h["plane_bytes"]
    for p in range(2 * b.n_layer):
        off = h["data_offset"] + p * h["plane_stride"]
        assert off % (2 << 20) == 0
        plane = b.k[p // 2] if p % 2 == 0 else b.v[p // 2]
        assert data[off : off + h["plane_bytes"]] == np.ascontiguousarray(plane).tobytes()


@pytest.mark.parametrize("transposed", [False, True])
def test_round_trip_bytes_preserves_everything(rng, transposed):
    spec = make_spec()
    b = make_block(rng, spec, n_tokens=9, anchor=1234, transposed=transposed)
    for align in (6, 21):
        c = nn.AtbBlock.from_bytes(b.to_bytes(align), spec)
        assert (c.n_tokens, c.anchor, c.token_hash, c.v_layout) == (9, 1234, 0xDEADBEEF, b.v_layout)
        assert c.spec == spec
        np.testing.assert_array_equal(c.k, b.k)
        np.testing.assert_array_equal(c.v, b.v)
        assert c.payload_crc() == b.payload_crc()


def test_save_load_is_atomic_and_sparse(rng, tmp_path):
    spec = make_spec(n_layer=4)
    b = make_block(rng, spec, n_tokens=30)
    path = tmp_path / "block.atb"
    b.save(path)
    st_ = os.stat(path)
    assert st_.st_size == b.encoded_size()
    # padding between the 2 MiB-aligned planes is a hole: the disk holds about the payload only
    assert st_.st_blocks * 512 < b.nbytes + (1 << 20)
    assert [p.name for p in tmp_path.iterdir()] == ["block.atb"]  # no tmp file left behind
    c = nn.AtbBlock.load(str(path), spec)
    np.testing.assert_array_equal(c.k, b.k)
    np.testing.assert_array_equal(c.v, b.v)
    assert path.read_bytes() == b.to_bytes()
    b.save(path, align_log2=nn.ATB_COMPACT_ALIGN_LOG2)
    assert os.path.getsize(path) == b.encoded_size(6) < 1 << 20
    np.testing.assert_array_equal(nn.AtbBlock.load(path, spec).k, b.k)


def test_load_missing_file_is_an_os_level_error(tmp_path):
    with pytest.raises(RuntimeError, match="open"):
        nn.AtbBlock.load(tmp_path / "nope.atb", make_spec())
    with pytest.raises(nn.AtbError, match="not a regular file"):
        nn.AtbBlock.load(tmp_path, make_spec())


def test_block_views_are_read_only_and_keep_the_block_alive(rng):
    b = make_block(rng)
    k = b.k
    del b
    assert k.shape == (3, 7, 128) and not k.flags.writeable
    k.sum()  # memory still valid
    with pytest.raises(ValueError):
        k[0, 0, 0] = 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fingerprint", bytes(16)),
        ("freq_base", 10000.0),
        ("freq_scale", 0.5),
        ("rope_type", nn.RopeType.NEOX),
        ("n_rot", 32),
        ("n_ctx_orig", 4096),
        ("ext_factor", 1.0),
        ("attn_factor", 0.5),
        ("beta_fast", 16.0),
        ("n_layer", 4),
        ("n_head_kv", 1),
        ("head_dim", 32),
        ("freq_factors", np.full(32, 2.0, np.float32)),
    ],
)
def test_block_for_another_model_or_rope_regime_is_rejected(rng, tmp_path, field, value):
    spec = make_spec()
    data = make_block(rng, spec).to_bytes(6)
    d = spec.to_dict()
    d[field] = value
    if field == "head_dim":
        d["n_rot"] = 32
    other = nn.ModelSpec(**d)
    with pytest.raises(nn.AtbMismatchError, match=field) as ei:
        nn.AtbBlock.from_bytes(data, other)
    assert isinstance(ei.value, nn.AtbError) and isinstance(ei.value, ValueError)
    assert "block != runtime" in str(ei.value)
    path = tmp_path / "x.atb"
    path.write_bytes(data)
    with pytest.raises(nn.AtbMismatchError):
        nn.AtbBlock.load(path, other)


def test_mismatch_message_names_both_values(rng):
    spec = make_spec()
    data = make_block(rng, spec).to_bytes(6)
    d = spec.to_dict()
    d["freq_base"] = 10000.0
    with pytest.raises(nn.AtbMismatchError, match=r"freq_base 100000 != 10000"):
        nn.AtbBlock.from_bytes(data, nn.ModelSpec(**d))


@pytest.fixture
def good(rng):
    spec = make_spec(n_layer=2)
    return spec, make_block(rng, spec, n_tokens=4).to_bytes(6)


def test_every_truncation_is_rejected(good):
    spec, data = good
    for n in list(range(0, 140)) + list(range(len(data) - 40, len(data))):
        with pytest.raises(nn.AtbError):
            nn.AtbBlock.from_bytes(data[:n], spec)
    with pytest.raises(nn.AtbError, match="size"):
        nn.AtbBlock.from_bytes(data + b"\0", spec)


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "message"),
    [
        (0, "<8s", b"GGUF\0\0\0\0", "magic"),
        (8, "<H", 2, "version"),
        (10, "<H", 64, "header_size"),
        (12, "<I", 1, "flags"),
        (32, "<I", 0, "n_tokens"),
        (32, "<I", 5, "plane stride"),
        (36, "<i", -1, "anchor"),
        (48, "<I", 1, "rope_type"),
        (52, "<I", 65, "n_rot"),
        (52, "<I", 130, "n_rot"),
        (56, "<f", float("nan"), "freq_base"),
        (60, "<f", 0.0, "freq_scale"),
        (68, "<f", float("inf"), "YaRN"),
        (88, "<I", 0, "n_layer"),
        (88, "<I", 3, "size"),
        (92, "<I", 100000, "n_head_kv"),
        (96, "<I", 63, "head_dim"),
        (100, "<B", 0, "dtype"),
        (101, "<B", 8, "dtype"),
        (102, "<B", 2, "V layout"),
        (103, "<B", 5, "alignment"),
        (103, "<B", 22, "alignment"),
        (103, "<B", 8, "data offset"),
        (104, "<Q", 64, "data offset"),
        (104, "<Q", 2**63, "data offset"),
        (112, "<Q", 2**64 - 64, "plane stride"),
    ],
)
def test_tampered_header_fields_are_rejected_with_a_reason(good, offset, fmt, value, message):
    spec, data = good
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    with pytest.raises(nn.AtbError, match=message):
        nn.AtbBlock.from_bytes(resign_header(b), spec)
    with pytest.raises(ValueError):
        ref.decode_atb(resign_header(b), spec_dict(spec))


def test_header_and_payload_corruption_fail_their_checksums(good):
    spec, data = good
    b = bytearray(data)
    b[40] ^= 1  # token hash, without re-signing
    with pytest.raises(nn.AtbError, match="header checksum"):
        nn.AtbBlock.from_bytes(bytes(b), spec)
    h = nn.read_atb_header(data)
    for plane in range(4):
        b = bytearray(data)
        b[h["data_offset"] + plane * h["plane_stride"] + 3] ^= 0x40
        with pytest.raises(nn.AtbError, match="payload checksum"):
            nn.AtbBlock.from_bytes(bytes(b), spec)
    # a flip inside the zero padding is not payload: still valid
    b = bytearray(data)
    b[h["data_offset"] + h["plane_bytes"] + 1] ^= 1
    if h["plane_stride"] > h["plane_bytes"] + 1:
        nn.AtbBlock.from_bytes(bytes(b), spec)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_random_garbage_and_bit_flips_never_crash(good, data):
    spec, blob = good
    choice = data.draw(st.integers(0, 2))
    if choice == 0:
        buf = data.draw(st.binary(max_size=400))
    elif choice == 1:
        b = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(b) - 1))
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        buf = bytes(b)
    else:
        b = bytearray(blob[:128])
        i = data.draw(st.integers(0, 123))
        b[i] = data.draw(st.integers(0, 255))
        buf = resign_header(b) + blob[128:]
    try:
        out = nn.AtbBlock.from_bytes(buf, spec)
    except nn.AtbError:
        return
    assert out.n_tokens >= 1  # only reachable when the flips left the block valid (e.g. padding)


def test_read_atb_header_matches_the_reference_parser(good):
    _, data = good
    h, r = nn.read_atb_header(data), ref.parse_atb_header(data)
    for key in ("n_tokens", "anchor", "token_hash", "n_layer", "n_head_kv", "head_dim", "n_rot",
                "data_offset", "plane_stride", "payload_crc", "header_crc", "align_log2", "file_size"):  # fmt: skip
        assert h[key] == r[key], key
    assert h["fingerprint"] == r["fingerprint"]


def test_block_constructor_validates_shapes(rng):
    spec = make_spec()
    k, v = random_planes(rng, spec, 4)
    with pytest.raises(ValueError, match="k must"):
        nn.AtbBlock(spec, k[:2], v, 0)
    with pytest.raises(ValueError, match="v must"):
        nn.AtbBlock(spec, k, v[:, :3], 0)
    with pytest.raises(ValueError, match="TRANSPOSED"):
        nn.AtbBlock(spec, k, v, 0, v_layout=nn.VLayout.TRANSPOSED)
    with pytest.raises(ValueError, match="anchor"):
        nn.AtbBlock(spec, k, v, -1)
    b = nn.AtbBlock(spec, k.astype(np.float32), v, 3)  # dtype is cast
    np.testing.assert_array_equal(b.k, k)


def test_model_spec_validation_and_equality():
    with pytest.raises(ValueError, match="16 bytes"):
        make_spec(fingerprint=b"short")
    with pytest.raises(ValueError, match="n_rot"):
        make_spec(n_rot=65)
    with pytest.raises(ValueError, match="freq_factors"):
        make_spec(freq_factors=np.ones(5, np.float32))
    with pytest.raises(ValueError, match="freq_base"):
        make_spec(freq_base=-1.0)
    a = make_spec()
    assert a == nn.ModelSpec(**a.to_dict()) and a.diff(a) == []
    assert a.n_rot == a.head_dim == 64 and a.n_embd == 128
    b = make_spec(freq_base=1.0)
    assert a != b and a.diff(b) == ["freq_base 100000 != 1"]
