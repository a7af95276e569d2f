// .atb (Aeon Tool Block) codec: a 128-byte little-endian header followed by per-layer F16 K and V
// planes, each plane starting on a (by default 2 MiB) aligned file offset. See native/ATB_FORMAT.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "spec.hpp"
#include "util.hpp"

namespace nx {

inline constexpr uint8_t kAtbMagic[8] = {0x89, 'A', 'T', 'B', '\r', '\n', 0x1A, '\n'};
inline constexpr uint16_t kAtbVersion = 1;
inline constexpr uint32_t kAtbHeaderSize = 128;
inline constexpr uint32_t kAtbDefaultAlignLog2 = 21;  // 2 MiB, the paper's page alignment
inline constexpr uint32_t kAtbMinAlignLog2 = 6;       // 64 B, the compact form
inline constexpr uint32_t kAtbMaxAlignLog2 = 21;
inline constexpr uint32_t kGgmlTypeF16 = 1;
inline constexpr uint32_t kAtbMaxTokens = 1u << 24;
inline constexpr uint64_t kAtbMaxFileSize = 1ull << 40;

// Every header field, as parsed (structurally validated) from the first 128 bytes.
struct AtbHeader {
    uint16_t version = kAtbVersion;
    uint32_t flags = 0;
    ModelSpec spec;  // geometry + RoPE regime; freq_factors stay empty, their CRC is below
    uint32_t freq_factors_crc = 0;
    uint32_t n_tokens = 0;
    int32_t anchor = 0;
    uint64_t token_hash = 0;
    uint32_t k_type = kGgmlTypeF16, v_type = kGgmlTypeF16;
    VLayout v_layout = VLayout::Rows;
    uint32_t align_log2 = kAtbDefaultAlignLog2;
    uint64_t data_offset = 0, plane_stride = 0, plane_bytes = 0, file_size = 0;
    uint32_t payload_crc = 0, header_crc = 0;

    // Structural validation of a header (no payload access). `available` is the byte length of the
    // whole encoded block as known to the caller. Throws AtbError.
    static AtbHeader parse(const uint8_t* p, std::size_t available);
    uint64_t plane_offset(std::size_t plane) const { return data_offset + plane * plane_stride; }
};

class AtbBlock {
   public:
    // Zero-filled planes; spec must validate, n_tokens in [1, 2^24], anchor >= 0.
    AtbBlock(ModelSpec spec, uint32_t n_tokens, int32_t anchor, uint64_t token_hash, VLayout v_layout);

    const ModelSpec& spec() const { return spec_; }
    uint32_t n_tokens() const { return n_tokens_; }
    int32_t anchor() const { return anchor_; }
    uint64_t token_hash() const { return token_hash_; }
    VLayout v_layout() const { return v_layout_; }
    std::size_t plane_elems() const { return (std::size_t)n_tokens_ * spec_.n_embd(); }
    std::size_t plane_bytes() const { return plane_elems() * 2; }
    uint16_t* k(std::size_t layer) { return data_.data() + (2 * layer) * mem_stride_; }
    uint16_t* v(std::size_t layer) { return data_.data() + (2 * layer + 1) * mem_stride_; }
    const uint16_t* k(std::size_t layer) const { return data_.data() + (2 * layer) * mem_stride_; }
    const uint16_t* v(std::size_t layer) const { return data_.data() + (2 * layer + 1) * mem_stride_; }
    std::size_t mem_stride_elems() const { return mem_stride_; }
    const uint16_t* raw() const { return data_.data(); }
    uint16_t* raw() { return data_.data(); }

    // Rotate every K row from the current anchor to `position` in place and move the anchor.
    void reanchor(int32_t position, Isa isa, bool fused = true);
    uint32_t payload_crc() const;

    std::size_t encoded_size(uint32_t align_log2) const;
    AtbHeader header(uint32_t align_log2) const;
    // Write the encoding into out[0 .. encoded_size) (padding is zeroed).
    void encode(uint8_t* out, std::size_t out_size, uint32_t align_log2) const;
    // Atomic (tmp + rename) sparse write: padding is left as file holes, so a 2 MiB-aligned file
    // occupies about its payload on disk. Throws std::runtime_error on I/O failure.
    void save(const std::string& path, uint32_t align_log2) const;

    // Full validation: header, sizes, offsets, then the block's RoPE regime / geometry / fingerprint
    // against `expect` (AtbMismatchError), then the payload CRC. Nothing is returned on failure.
    static AtbBlock decode(const uint8_t* p, std::size_t n, const ModelSpec& expect);
    static AtbBlock load(const std::string& path, const ModelSpec& expect);

   private:
    ModelSpec spec_;
    uint32_t n_tokens_;
    int32_t anchor_;
    uint64_t token_hash_;
    VLayout v_layout_;
    std::size_t mem_stride_;  // elements between planes in memory (64-byte aligned)
    AlignedBuf<uint16_t, 64> data_;
};

// Raise AtbMismatchError if a block's header does not describe the runtime model.
void check_atb_matches(const AtbHeader& h, const ModelSpec& expect);

}  // namespace nx
