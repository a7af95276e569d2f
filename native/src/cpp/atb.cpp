#include "atb.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "rope.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .atb codec assumes a little-endian host");

namespace nx {

namespace {

template <typename T>
T rd(const uint8_t* p, std::size_t off) {
    T v;
    std::memcpy(&v, p + off, sizeof(T));
    return v;
}
template <typename T>
void wr(uint8_t* p, std::size_t off, T v) {
    std::memcpy(p + off, &v, sizeof(T));
}

std::string u64s(uint64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& m) { throw AtbError("invalid .atb: " + m); }

}  // namespace

// ---- header -------------------------------------------------------------------------------------

AtbHeader AtbHeader::parse(const uint8_t* p, std::size_t available) {
    if (available < kAtbHeaderSize)
        fail("truncated header (" + u64s(available) + " bytes, need " + std::to_string(kAtbHeaderSize) + ")");
    if (std::memcmp(p, kAtbMagic, 8) != 0) fail("bad magic (not an Aeon Tool Block)");
    AtbHeader h;
    h.version = rd<uint16_t>(p, 8);
    if (h.version != kAtbVersion)
        fail("unsupported version " + std::to_string(h.version) + " (this reader handles " +
             std::to_string(kAtbVersion) + ")");
    if (rd<uint16_t>(p, 10) != kAtbHeaderSize) fail("header_size field is not 128");
    h.header_crc = rd<uint32_t>(p, 124);
    if (crc32(p, 124) != h.header_crc) fail("header checksum mismatch (corrupted header)");
    h.flags = rd<uint32_t>(p, 12);
    if (h.flags != 0) fail("unknown flags 0x" + std::to_string(h.flags));
    std::memcpy(h.spec.fingerprint.data(), p + 16, 16);
    h.n_tokens = rd<uint32_t>(p, 32);
    h.anchor = rd<int32_t>(p, 36);
    h.token_hash = rd<uint64_t>(p, 40);
    h.spec.rope_type = (RopeType)rd<uint32_t>(p, 48);
    h.spec.n_rot = rd<uint32_t>(p, 52);
    h.spec.freq_base = rd<float>(p, 56);
    h.spec.freq_scale = rd<float>(p, 60);
    h.spec.n_ctx_orig = rd<uint32_t>(p, 64);
    h.spec.ext_factor = rd<float>(p, 68);
    h.spec.attn_factor = rd<float>(p, 72);
    h.spec.beta_fast = rd<float>(p, 76);
    h.spec.beta_slow = rd<float>(p, 80);
    h.freq_factors_crc = rd<uint32_t>(p, 84);
    h.spec.n_layer = rd<uint32_t>(p, 88);
    h.spec.n_head_kv = rd<uint32_t>(p, 92);
    h.spec.head_dim = rd<uint32_t>(p, 96);
    h.k_type = p[100];
    h.v_type = p[101];
    h.v_layout = (VLayout)p[102];
    h.align_log2 = p[103];
    h.data_offset = rd<uint64_t>(p, 104);
    h.plane_stride = rd<uint64_t>(p, 112);
    h.payload_crc = rd<uint32_t>(p, 120);

    try {
        h.spec.validate();
    } catch (const std::invalid_argument& e) {
        fail(std::string("header field out of range: ") + e.what());
    }
    if (h.n_tokens < 1 || h.n_tokens > kAtbMaxTokens) fail("n_tokens " + u64s(h.n_tokens) + " out of range");
    if (h.anchor < 0 || (int64_t)h.anchor + h.n_tokens - 1 > INT32_MAX) fail("anchor " + std::to_string(h.anchor) + " out of range");
    if (h.k_type != kGgmlTypeF16 || h.v_type != kGgmlTypeF16)
        fail("K/V dtype " + std::to_string(h.k_type) + "/" + std::to_string(h.v_type) + " unsupported (only F16 = 1)");
    if (h.v_layout != VLayout::Rows && h.v_layout != VLayout::Transposed)
        fail("unknown V layout " + std::to_string((uint32_t)h.v_layout));
    if (h.align_log2 < kAtbMinAlignLog2 || h.align_log2 > kAtbMaxAlignLog2)
        fail("plane alignment 2^" + std::to_string(h.align_log2) + " out of range");
    const uint64_t align = 1ull << h.align_log2;
    h.plane_bytes = (uint64_t)h.n_tokens * h.spec.n_embd() * 2;  // < 2^24 * 2^25 * 2: no overflow
    const uint64_t want_offset = round_up(kAtbHeaderSize, align);
    const uint64_t want_stride = round_up(h.plane_bytes, align);
    if (h.data_offset != want_offset) fail("data offset " + u64s(h.data_offset) + " != expected " + u64s(want_offset));
    if (h.plane_stride != want_stride) fail("plane stride " + u64s(h.plane_stride) + " != expected " + u64s(want_stride));
    const uint64_t n_planes = 2ull * h.spec.n_layer;
    if (want_stride > kAtbMaxFileSize / n_planes) fail("block too large");
    h.file_size = h.data_offset + (n_planes - 1) * h.plane_stride + h.plane_bytes;
    if (available != h.file_size)
        fail("size " + u64s(available) + " bytes does not match the header (" + u64s(h.file_size) + " bytes)");
    return h;
}

void check_atb_matches(const AtbHeader& h, const ModelSpec& expect) {
    std::vector<std::string> d = h.spec.diff(expect, false);
    if (h.freq_factors_crc != expect.freq_factors_crc()) d.push_back("freq_factors differ");
    if (d.empty()) return;
    std::string m = "the .atb block was compiled for another model/RoPE regime (block != runtime): ";
    for (std::size_t i = 0; i < d.size(); ++i) m += (i ? "; " : "") + d[i];
    throw AtbMismatchError(m);
}

// ---- block --------------------------------------------------------------------------------------

AtbBlock::AtbBlock(ModelSpec spec, uint32_t n_tokens, int32_t anchor, uint64_t token_hash, VLayout v_layout)
    : spec_(std::move(spec)), n_tokens_(n_tokens), anchor_(anchor), token_hash_(token_hash), v_layout_(v_layout) {
    spec_.validate();
    if (n_tokens < 1 || n_tokens > kAtbMaxTokens) throw std::invalid_argument("n_tokens must be in [1, 2^24]");
    if (anchor < 0 || (int64_t)anchor + n_tokens - 1 > INT32_MAX) throw std::invalid_argument("anchor out of range");
    if (v_layout != VLayout::Rows && v_layout != VLayout::Transposed) throw std::invalid_argument("bad V layout");
    mem_stride_ = round_up(plane_elems(), 32);  // 64 bytes
    data_ = AlignedBuf<uint16_t, 64>(mem_stride_ * 2 * spec_.n_layer);
}

void AtbBlock::reanchor(int32_t position, Isa isa, bool fused) {
    if (position < 0 || (int64_t)position + n_tokens_ - 1 > INT32_MAX) throw std::invalid_argument("position out of range");
    const int64_t delta = (int64_t)position - anchor_;
    if (delta != 0) {
        std::vector<float> cache(spec_.n_rot);
        rope_cache(spec_, delta, cache.data(), fused);
        const std::size_t heads = (std::size_t)n_tokens_ * spec_.n_head_kv;
        for (uint32_t l = 0; l < spec_.n_layer; ++l)
            rope_rotate_f16(k(l), k(l), heads, spec_.head_dim, spec_.n_rot, spec_.rope_type, cache.data(), isa, fused);
    }
    anchor_ = position;
}

uint32_t AtbBlock::payload_crc() const {
    uint32_t c = 0;
    for (uint32_t l = 0; l < spec_.n_layer; ++l) {
        c = crc32_update(c, k(l), plane_bytes());
        c = crc32_update(c, v(l), plane_bytes());
    }
    return c;
}

AtbHeader AtbBlock::header(uint32_t align_log2) const {
    if (align_log2 < kAtbMinAlignLog2 || align_log2 > kAtbMaxAlignLog2)
        throw std::invalid_argument("align_log2 must be in [6, 21]");
    AtbHeader h;
    h.spec = spec_;
    h.freq_factors_crc = spec_.freq_factors_crc();
    h.n_tokens = n_tokens_;
    h.anchor = anchor_;
    h.token_hash = token_hash_;
    h.v_layout = v_layout_;
    h.align_log2 = align_log2;
    const uint64_t align = 1ull << align_log2;
    h.plane_bytes = plane_bytes();
    h.data_offset = round_up(kAtbHeaderSize, align);
    h.plane_stride = round_up(h.plane_bytes, align);
    h.file_size = h.data_offset + (2ull * spec_.n_layer - 1) * h.plane_stride + h.plane_bytes;
    if (h.file_size > kAtbMaxFileSize) throw std::invalid_argument("block too large to encode");
    h.payload_crc = payload_crc();
    return h;
}

std::size_t AtbBlock::encoded_size(uint32_t align_log2) const {
    const uint64_t align = 1ull << align_log2;
    return round_up(kAtbHeaderSize, align) + (2ull * spec_.n_layer - 1) * round_up(plane_bytes(), align) + plane_bytes();
}

namespace {
void encode_header(const AtbHeader& h, uint8_t* p) {
    std::memset(p, 0, kAtbHeaderSize);
    std::memcpy(p, kAtbMagic, 8);
    wr<uint16_t>(p, 8, kAtbVersion);
    wr<uint16_t>(p, 10, (uint16_t)kAtbHeaderSize);
    wr<uint32_t>(p, 12, h.flags);
    std::memcpy(p + 16, h.spec.fingerprint.data(), 16);
    wr<uint32_t>(p, 32, h.n_tokens);
    wr<int32_t>(p, 36, h.anchor);
    wr<uint64_t>(p, 40, h.token_hash);
    wr<uint32_t>(p, 48, (uint32_t)h.spec.rope_type);
    wr<uint32_t>(p, 52, h.spec.n_rot);
    wr<float>(p, 56, h.spec.freq_base);
    wr<float>(p, 60, h.spec.freq_scale);
    wr<uint32_t>(p, 64, h.spec.n_ctx_orig);
    wr<float>(p, 68, h.spec.ext_factor);
    wr<float>(p, 72, h.spec.attn_factor);
    wr<float>(p, 76, h.spec.beta_fast);
    wr<float>(p, 80, h.spec.beta_slow);
    wr<uint32_t>(p, 84, h.freq_factors_crc);
    wr<uint32_t>(p, 88, h.spec.n_layer);
    wr<uint32_t>(p, 92, h.spec.n_head_kv);
    wr<uint32_t>(p, 96, h.spec.head_dim);
    p[100] = (uint8_t)h.k_type;
    p[101] = (uint8_t)h.v_type;
    p[102] = (uint8_t)h.v_layout;
    p[103] = (uint8_t)h.align_log2;
    wr<uint64_t>(p, 104, h.data_offset);
    wr<uint64_t>(p, 112, h.plane_stride);
    wr<uint32_t>(p, 120, h.payload_crc);
    wr<uint32_t>(p, 124, crc32(p, 124));
}
}  // namespace

void AtbBlock::encode(uint8_t* out, std::size_t out_size, uint32_t align_log2) const {
    const AtbHeader h = header(align_log2);
    if (out_size != h.file_size) throw std::invalid_argument("encode: output buffer has the wrong size");
    std::memset(out, 0, h.data_offset);
    encode_header(h, out);
    for (uint32_t l = 0; l < spec_.n_layer; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
            const std::size_t plane = 2 * l + kv;
            uint8_t* dst = out + h.plane_offset(plane);
            std::memcpy(dst, kv ? (const void*)v(l) : (const void*)k(l), h.plane_bytes);
            if (plane + 1 < 2ull * spec_.n_layer) std::memset(dst + h.plane_bytes, 0, h.plane_stride - h.plane_bytes);
        }
    }
}

namespace {
void pwrite_all(int fd, const void* buf, std::size_t n, uint64_t off, const std::string& path) {
    const uint8_t* p = static_cast<const uint8_t*>(buf);
    while (n) {
        const ssize_t w = ::pwrite(fd, p, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw std::runtime_error("write " + path + ": " + std::strerror(errno));
        }
        p += w, n -= (std::size_t)w, off += (uint64_t)w;
    }
}
bool pread_all(int fd, void* buf, std::size_t n, uint64_t off) {
    uint8_t* p = static_cast<uint8_t*>(buf);
    while (n) {
        const ssize_t r = ::pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r, n -= (std::size_t)r, off += (uint64_t)r;
    }
    return true;
}
struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};
}  // namespace

void AtbBlock::save(const std::string& path, uint32_t align_log2) const {
    const AtbHeader h = header(align_log2);
    uint8_t hdr[kAtbHeaderSize];
    encode_header(h, hdr);
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
        Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
        if (f.fd < 0) throw std::runtime_error("open " + tmp + ": " + std::strerror(errno));
        try {
            pwrite_all(f.fd, hdr, kAtbHeaderSize, 0, tmp);
            // only payload is written; the alignment padding between planes stays a hole
            for (uint32_t l = 0; l < spec_.n_layer; ++l) {
                pwrite_all(f.fd, k(l), h.plane_bytes, h.plane_offset(2 * l), tmp);
                pwrite_all(f.fd, v(l), h.plane_bytes, h.plane_offset(2 * l + 1), tmp);
            }
            if (::ftruncate(f.fd, (off_t)h.file_size) != 0) throw std::runtime_error("truncate " + tmp + ": " + std::strerror(errno));
        } catch (...) {
            ::unlink(tmp.c_str());
            throw;
        }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int e = errno;
        ::unlink(tmp.c_str());
        throw std::runtime_error("rename " + tmp + " -> " + path + ": " + std::strerror(e));
    }
}

namespace {
AtbBlock block_for(const AtbHeader& h, const ModelSpec& expect) {
    // the header matched `expect` field for field, so the runtime spec (with its freq_factors) is the
    // block's spec
    return AtbBlock(expect, h.n_tokens, h.anchor, h.token_hash, h.v_layout);
}
}  // namespace

AtbBlock AtbBlock::decode(const uint8_t* p, std::size_t n, const ModelSpec& expect) {
    expect.validate();
    const AtbHeader h = AtbHeader::parse(p, n);
    check_atb_matches(h, expect);
    uint32_t c = 0;
    for (std::size_t plane = 0; plane < 2ull * h.spec.n_layer; ++plane) c = crc32_update(c, p + h.plane_offset(plane), h.plane_bytes);
    if (c != h.payload_crc) fail("payload checksum mismatch (corrupted K/V data)");
    AtbBlock b = block_for(h, expect);
    for (uint32_t l = 0; l < h.spec.n_layer; ++l) {
        std::memcpy(b.k(l), p + h.plane_offset(2 * l), h.plane_bytes);
        std::memcpy(b.v(l), p + h.plane_offset(2 * l + 1), h.plane_bytes);
    }
    return b;
}

AtbBlock AtbBlock::load(const std::string& path, const ModelSpec& expect) {
    expect.validate();
    Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
    if (f.fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) throw std::runtime_error("stat " + path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(path + " is not a regular file");
    uint8_t hdr[kAtbHeaderSize];
    const std::size_t size = (std::size_t)st.st_size;
    if (size < kAtbHeaderSize || !pread_all(f.fd, hdr, kAtbHeaderSize, 0)) fail("truncated header in " + path);
    const AtbHeader h = AtbHeader::parse(hdr, size);
    check_atb_matches(h, expect);
    AtbBlock b = block_for(h, expect);
    // read planes straight into the block (no mmap: a file truncated under us is an error, not SIGBUS)
    for (uint32_t l = 0; l < h.spec.n_layer; ++l) {
        if (!pread_all(f.fd, b.k(l), h.plane_bytes, h.plane_offset(2 * l)) ||
            !pread_all(f.fd, b.v(l), h.plane_bytes, h.plane_offset(2 * l + 1)))
            fail("short read in " + path);
    }
    if (b.payload_crc() != h.payload_crc) fail("payload checksum mismatch (corrupted K/V data) in " + path);
    return b;
}

}  // namespace nx
