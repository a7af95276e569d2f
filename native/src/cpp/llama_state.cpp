#include "llama_state.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "rope.hpp"

namespace nx {

namespace {

constexpr uint32_t kMaxStreams = 4096;
constexpr uint32_t kMaxSeqIdsPerCell = 4096;
constexpr uint32_t kMaxLayers = 4096;

[[noreturn]] void fail(const std::string& m) { throw StateBlobError("invalid llama.cpp state blob: " + m); }

// Bounds-checked little-endian cursor: every read is checked against the blob length first.
struct Cursor {
    const uint8_t* p;
    std::size_t n, off = 0;
    std::size_t left() const { return n - off; }
    template <typename T>
    T get(const char* what) {
        if (left() < sizeof(T)) fail(std::string("truncated while reading ") + what + " at offset " + std::to_string(off));
        T v;
        std::memcpy(&v, p + off, sizeof(T));
        off += sizeof(T);
        return v;
    }
    std::size_t skip(uint64_t bytes, const char* what) {
        if (bytes > left()) fail(std::string("truncated ") + what + " at offset " + std::to_string(off) + " (need " +
                                 std::to_string(bytes) + " bytes, " + std::to_string(left()) + " left)");
        const std::size_t at = off;
        off += (std::size_t)bytes;
        return at;
    }
};

}  // namespace

StateLayout parse_state(const uint8_t* p, std::size_t n) {
    Cursor c{p, n};
    StateLayout L;
    const uint32_t magic = c.get<uint32_t>("magic");
    if (magic != kStateIoMagic) fail("bad magic (not a llama_state_seq_get_data blob of this llama.cpp version)");
    L.seq_id = c.get<int32_t>("seq_id");
    L.n_stream = c.get<uint32_t>("n_stream");
    if (L.n_stream < 1 || L.n_stream > kMaxStreams) fail("n_stream " + std::to_string(L.n_stream) + " out of range");
    bool seen = false;
    for (uint32_t s = 0; s < L.n_stream; ++s) {
        const uint32_t cells = c.get<uint32_t>("cell_count");
        if (cells == 0) continue;
        if (seen) fail("cells in more than one stream (not a single-sequence blob)");
        seen = true;
        L.stream = s;
        L.cell_count = cells;
        // each cell needs at least 8 bytes of meta: reject absurd counts before allocating
        if (cells > c.left() / 8) fail("cell_count " + std::to_string(cells) + " larger than the blob");
        L.pos.resize(cells);
        for (uint32_t i = 0; i < cells; ++i) {
            L.pos[i] = c.get<int32_t>("cell pos");
            const uint32_t n_seq = c.get<uint32_t>("n_seq_id");
            if (n_seq > kMaxSeqIdsPerCell) fail("n_seq_id " + std::to_string(n_seq) + " out of range");
            c.skip(4ull * n_seq, "seq ids");
        }
        const uint32_t v_trans = c.get<uint32_t>("v_trans");
        if (v_trans > 1) fail("v_trans " + std::to_string(v_trans) + " is neither 0 nor 1 (or the model stores cell ext, unsupported)");
        L.v_trans = v_trans == 1;
        L.n_layer = c.get<uint32_t>("n_layer");
        if (L.n_layer < 1 || L.n_layer > kMaxLayers) fail("n_layer " + std::to_string(L.n_layer) + " out of range");
        L.k.resize(L.n_layer);
        for (auto& pl : L.k) {
            pl.type = c.get<int32_t>("K type");
            pl.row_size = c.get<uint64_t>("K row size");
            if (pl.row_size == 0 || pl.row_size > c.left() / cells) fail("K row size " + std::to_string(pl.row_size) + " inconsistent with the blob length");
            pl.offset = c.skip(pl.row_size * cells, "K rows");
        }
        L.v.resize(L.n_layer);
        for (auto& pl : L.v) {
            pl.type = c.get<int32_t>("V type");
            if (!L.v_trans) {
                pl.row_size = c.get<uint64_t>("V row size");
                if (pl.row_size == 0 || pl.row_size > c.left() / cells) fail("V row size " + std::to_string(pl.row_size) + " inconsistent with the blob length");
                pl.offset = c.skip(pl.row_size * cells, "V rows");
            } else {
                pl.el_size = c.get<uint32_t>("V element size");
                pl.n_embd_v = c.get<uint32_t>("V n_embd_v_gqa");
                if (pl.el_size == 0 || pl.n_embd_v == 0) fail("zero V element size or width");
                const uint64_t per_cell = (uint64_t)pl.el_size * pl.n_embd_v;  // < 2^64, both u32
                if (per_cell > c.left() / cells) fail("transposed V size inconsistent with the blob length");
                pl.row_size = per_cell;
                pl.offset = c.skip(per_cell * cells, "transposed V data");
            }
        }
    }
    if (c.left() != 0) fail(std::to_string(c.left()) + " trailing bytes after the last stream");
    return L;
}

AtbBlock atb_from_state(const uint8_t* p, std::size_t n, const ModelSpec& spec, uint64_t token_hash) {
    spec.validate();
    const StateLayout L = parse_state(p, n);
    if (L.cell_count == 0) fail("the sequence holds no cells");
    if (L.cell_count > kAtbMaxTokens) fail("too many cells for one block");
    if (L.n_layer != spec.n_layer)
        fail("n_layer " + std::to_string(L.n_layer) + " != model's " + std::to_string(spec.n_layer));
    const uint64_t row = 2ull * spec.n_embd();
    for (uint32_t l = 0; l < L.n_layer; ++l) {
        const auto &k = L.k[l], &v = L.v[l];
        if (k.type != (int32_t)kGgmlTypeF16 || v.type != (int32_t)kGgmlTypeF16)
            fail("layer " + std::to_string(l) + ": K/V cache type " + std::to_string(k.type) + "/" + std::to_string(v.type) +
                 " unsupported (only F16 = 1; run the context with type_k = type_v = F16)");
        if (k.row_size != row)
            fail("layer " + std::to_string(l) + ": K row size " + std::to_string(k.row_size) + " != n_head_kv * head_dim * 2 = " + std::to_string(row));
        if (!L.v_trans && v.row_size != row)
            fail("layer " + std::to_string(l) + ": V row size " + std::to_string(v.row_size) + " != " + std::to_string(row));
        if (L.v_trans && (v.el_size != 2 || v.n_embd_v != spec.n_embd()))
            fail("layer " + std::to_string(l) + ": transposed V geometry (el_size " + std::to_string(v.el_size) + ", n_embd_v " +
                 std::to_string(v.n_embd_v) + ") != (2, " + std::to_string(spec.n_embd()) + ")");
    }
    // order cells by position; a block is one contiguous run of positions
    const uint32_t nc = L.cell_count;
    std::vector<uint32_t> order(nc);
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return L.pos[a] < L.pos[b]; });
    const int32_t m0 = L.pos[order[0]];
    if (m0 < 0) fail("negative cell position " + std::to_string(m0));
    for (uint32_t i = 0; i < nc; ++i)
        if ((int64_t)L.pos[order[i]] != (int64_t)m0 + i)
            fail("cell positions are not one contiguous run (expected " + std::to_string((int64_t)m0 + i) + ", found " +
                 std::to_string(L.pos[order[i]]) + ")");
    bool identity = true;
    for (uint32_t i = 0; i < nc && identity; ++i) identity = order[i] == i;

    AtbBlock b(spec, nc, m0, token_hash, L.v_trans ? VLayout::Transposed : VLayout::Rows);
    const std::size_t E = spec.n_embd();
    for (uint32_t l = 0; l < L.n_layer; ++l) {
        const uint8_t* ks = p + L.k[l].offset;
        const uint8_t* vs = p + L.v[l].offset;
        if (identity) {
            std::memcpy(b.k(l), ks, b.plane_bytes());
            std::memcpy(b.v(l), vs, b.plane_bytes());
            continue;
        }
        for (uint32_t i = 0; i < nc; ++i) std::memcpy(b.k(l) + i * E, ks + (std::size_t)order[i] * row, row);
        if (!L.v_trans) {
            for (uint32_t i = 0; i < nc; ++i) std::memcpy(b.v(l) + i * E, vs + (std::size_t)order[i] * row, row);
        } else {
            uint16_t* dst = b.v(l);
            for (std::size_t j = 0; j < E; ++j) {
                const uint8_t* src = vs + j * nc * 2;
                for (uint32_t i = 0; i < nc; ++i) std::memcpy(dst + j * nc + i, src + (std::size_t)order[i] * 2, 2);
            }
        }
    }
    return b;
}

std::size_t state_blob_size(const AtbBlock& b, bool v_trans, uint32_t n_stream) {
    const std::size_t n = b.n_tokens(), L = b.spec().n_layer, plane = b.plane_bytes();
    std::size_t s = 8 + 4 + 4ull * n_stream + 12 * n + 8;
    s += L * (4 + 8 + plane);
    s += v_trans ? L * (4 + 4 + 4 + plane) : L * (4 + 8 + plane);
    return s;
}

namespace {
void transpose16(const uint16_t* src, std::size_t rows, std::size_t cols, uint8_t* dst) {
    // src [rows][cols] -> dst [cols][rows]; dst may be unaligned (inside a byte blob)
    constexpr std::size_t B = 32;
    for (std::size_t r0 = 0; r0 < rows; r0 += B)
        for (std::size_t c0 = 0; c0 < cols; c0 += B) {
            const std::size_t r1 = std::min(rows, r0 + B), c1 = std::min(cols, c0 + B);
            for (std::size_t c = c0; c < c1; ++c)
                for (std::size_t r = r0; r < r1; ++r) std::memcpy(dst + (c * rows + r) * 2, src + r * cols + c, 2);
        }
}
}  // namespace

void write_state_blob(const AtbBlock& b, int32_t position, bool v_trans, uint32_t n_stream, int32_t seq_id,
                      bool reanchor, Isa isa, bool fused, uint8_t* out, std::size_t out_size) {
    if (n_stream < 1 || n_stream > kMaxStreams) throw std::invalid_argument("n_stream must be in [1, 4096]");
    if (position < 0 || (int64_t)position + b.n_tokens() - 1 > INT32_MAX) throw std::invalid_argument("position out of range");
    if (seq_id < 0) throw std::invalid_argument("seq_id must be >= 0");
    if (out_size != state_blob_size(b, v_trans, n_stream)) throw std::invalid_argument("output buffer has the wrong size");
    const uint32_t n = b.n_tokens(), L = b.spec().n_layer;
    const std::size_t E = b.spec().n_embd(), plane = b.plane_bytes();
    uint8_t* w = out;
    auto put = [&](const void* v, std::size_t s) {
        std::memcpy(w, v, s);
        w += s;
    };
    auto u32 = [&](uint32_t v) { put(&v, 4); };
    auto i32 = [&](int32_t v) { put(&v, 4); };
    auto u64 = [&](uint64_t v) { put(&v, 8); };

    u32(kStateIoMagic);
    i32(seq_id);
    u32(n_stream);
    u32(n);  // stream 0 holds the cells; llama.cpp restores them into the destination's own stream
    for (uint32_t i = 0; i < n; ++i) {
        i32(position + (int32_t)i);
        u32(1);
        i32(seq_id);
    }
    u32(v_trans ? 1 : 0);
    u32(L);
    std::vector<float> cache;
    const int64_t delta = (int64_t)position - b.anchor();
    if (reanchor && delta != 0) {
        cache.resize(b.spec().n_rot);
        rope_cache(b.spec(), delta, cache.data(), fused);
    }
    for (uint32_t l = 0; l < L; ++l) {
        i32((int32_t)kGgmlTypeF16);
        u64(2ull * E);
        if (cache.empty()) {
            put(b.k(l), plane);
        } else {  // rotate while copying (one pass over K); the block itself stays at its anchor
            rope_rotate_f16(b.k(l), reinterpret_cast<uint16_t*>(w), (std::size_t)n * b.spec().n_head_kv,
                            b.spec().head_dim, b.spec().n_rot, b.spec().rope_type, cache.data(), isa, fused);
            w += plane;
        }
    }
    const bool same = (b.v_layout() == VLayout::Transposed) == v_trans;
    for (uint32_t l = 0; l < L; ++l) {
        i32((int32_t)kGgmlTypeF16);
        if (!v_trans) {
            u64(2ull * E);
        } else {
            u32(2);
            u32((uint32_t)E);
        }
        if (same) {
            put(b.v(l), plane);
        } else if (v_trans) {
            transpose16(b.v(l), n, E, w);  // [n][E] -> [E][n]
            w += plane;
        } else {
            transpose16(b.v(l), E, n, w);  // [E][n] -> [n][E]
            w += plane;
        }
    }
    for (uint32_t s = 1; s < n_stream; ++s) u32(0);
    if ((std::size_t)(w - out) != out_size) throw std::logic_error("state blob size accounting error");
}

}  // namespace nx
