// Shared helpers for the Nexus native core: error types, aligned buffers, IEEE half <-> float,
// CRC-32 and run-time ISA detection. Nothing here depends on Python.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace nx {

// ---- errors (translated to Python exceptions in bindings.cpp) -----------------------------------

// Malformed or unsupported .atb data (bad magic, version, sizes, offsets, checksum). -> nexus_native.AtbError
struct AtbError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A well-formed .atb compiled for another model / RoPE regime. -> nexus_native.AtbMismatchError
struct AtbMismatchError : AtbError {
    using AtbError::AtbError;
};
// Malformed or unsupported llama.cpp sequence-state blob. -> nexus_native.StateBlobError
struct StateBlobError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// ---- aligned memory -----------------------------------------------------------------------------

void* aligned_alloc_bytes(std::size_t bytes, std::size_t align);  // zero-filled; throws std::bad_alloc
void aligned_free_bytes(void* p) noexcept;

// Owning, move-only, zero-initialised buffer of `n` T's aligned to `Align` bytes.
template <typename T, std::size_t Align = 64>
class AlignedBuf {
   public:
    AlignedBuf() = default;
    explicit AlignedBuf(std::size_t n) : n_(n) {
        if (n) p_ = static_cast<T*>(aligned_alloc_bytes(n * sizeof(T), Align));
    }
    AlignedBuf(const AlignedBuf&) = delete;
    AlignedBuf& operator=(const AlignedBuf&) = delete;
    AlignedBuf(AlignedBuf&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
    AlignedBuf& operator=(AlignedBuf&& o) noexcept {
        if (this != &o) {
            aligned_free_bytes(p_);
            p_ = o.p_, n_ = o.n_;
            o.p_ = nullptr, o.n_ = 0;
        }
        return *this;
    }
    ~AlignedBuf() { aligned_free_bytes(p_); }
    T* data() noexcept { return p_; }
    const T* data() const noexcept { return p_; }
    std::size_t size() const noexcept { return n_; }
    T& operator[](std::size_t i) noexcept { return p_[i]; }
    const T& operator[](std::size_t i) const noexcept { return p_[i]; }

   private:
    T* p_ = nullptr;
    std::size_t n_ = 0;
};

inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

// ---- IEEE 754 binary16 (round-to-nearest-even), portable bit-exact versions ---------------------

inline float f32_from_bits(uint32_t w) {
    float f;
    std::memcpy(&f, &w, 4);
    return f;
}
inline uint32_t f32_to_bits(float f) {
    uint32_t w;
    std::memcpy(&w, &f, 4);
    return w;
}

// After Maratyszcza's FP16 library (MIT): exact for every input incl. subnormals, inf and NaN.
inline float half_to_float(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = f32_from_bits(0x7800000u);  // 2^-112
    const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denorm_cutoff = 1u << 27;
    const uint32_t result =
        sign | (two_w < denorm_cutoff ? f32_to_bits(denormalized) : f32_to_bits(normalized));
    return f32_from_bits(result);
}

inline uint16_t float_to_half(float f) {
    const float scale_to_inf = f32_from_bits(0x77800000u);   // 2^112
    const float scale_to_zero = f32_from_bits(0x08800000u);  // 2^-110
    const uint32_t w = f32_to_bits(f);
    float base = (f < 0 ? -f : f) * scale_to_inf;
    base *= scale_to_zero;
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = f32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// ---- CRC-32 (IEEE 802.3 / zlib polynomial, reflected; identical to Python's zlib.crc32) ---------

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) noexcept;
inline uint32_t crc32(const void* data, std::size_t n) noexcept { return crc32_update(0, data, n); }

// ---- run-time ISA detection ---------------------------------------------------------------------

enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512Vnni = 2, Neon = 3 };

const char* isa_name(Isa isa) noexcept;
Isa isa_from_name(const std::string& name);  // throws std::invalid_argument
bool isa_supported(Isa isa) noexcept;
Isa best_isa() noexcept;

// Sum of all bytes of a buffer, streamed with the widest available loads. Used as the
// memory-bandwidth floor for the scan benchmark (same bytes, the least possible work per byte).
uint64_t memory_read_sum(const void* data, std::size_t n) noexcept;

}  // namespace nx
