#include "util.hpp"

#include <cstdlib>
#include <new>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NX_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace nx {

void* aligned_alloc_bytes(std::size_t bytes, std::size_t align) {
    void* p = nullptr;
    if (bytes == 0) bytes = align;
    if (posix_memalign(&p, align, round_up(bytes, align)) != 0 || !p) throw std::bad_alloc();
    std::memset(p, 0, round_up(bytes, align));
    return p;
}

void aligned_free_bytes(void* p) noexcept { std::free(p); }

// ---- CRC-32, slicing-by-8 -----------------------------------------------------------------------

namespace {
struct Crc32Tables {
    uint32_t t[8][256];
    Crc32Tables() {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : (c >> 1);
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
};
const Crc32Tables& crc_tables() {
    static const Crc32Tables tables;
    return tables;
}
}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t n) noexcept {
    const auto& T = crc_tables().t;
    const uint8_t* p = static_cast<const uint8_t*>(data);
    uint32_t c = ~crc;
    while (n >= 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + 4, 4);
        lo ^= c;  // little-endian hosts only (x86-64, arm64)
        c = T[7][lo & 0xFF] ^ T[6][(lo >> 8) & 0xFF] ^ T[5][(lo >> 16) & 0xFF] ^ T[4][lo >> 24] ^
            T[3][hi & 0xFF] ^ T[2][(hi >> 8) & 0xFF] ^ T[1][(hi >> 16) & 0xFF] ^ T[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = T[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

// ---- ISA detection ------------------------------------------------------------------------------

const char* isa_name(Isa isa) noexcept {
    switch (isa) {
        case Isa::Avx512Vnni: return "avx512vnni";
        case Isa::Avx2: return "avx2";
        case Isa::Neon: return "neon";
        case Isa::Scalar: break;
    }
    return "scalar";
}

Isa isa_from_name(const std::string& name) {
    if (name == "scalar") return Isa::Scalar;
    if (name == "avx2") return Isa::Avx2;
    if (name == "avx512vnni") return Isa::Avx512Vnni;
    if (name == "neon") return Isa::Neon;
    throw std::invalid_argument("unknown ISA '" + name + "' (expected scalar, avx2, avx512vnni or neon)");
}

bool isa_supported(Isa isa) noexcept {
    switch (isa) {
        case Isa::Scalar: return true;
#ifdef NX_X86
        case Isa::Avx2:
            __builtin_cpu_init();
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                   __builtin_cpu_supports("f16c");
        case Isa::Avx512Vnni:
            __builtin_cpu_init();
            return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                   __builtin_cpu_supports("f16c");
        case Isa::Neon: return false;
#elif defined(__aarch64__)
        case Isa::Neon: return true;
        default: return false;
#else
        default: return false;
#endif
    }
    return false;
}

Isa best_isa() noexcept {
    static const Isa best = [] {
        if (isa_supported(Isa::Avx512Vnni)) return Isa::Avx512Vnni;
        if (isa_supported(Isa::Avx2)) return Isa::Avx2;
        if (isa_supported(Isa::Neon)) return Isa::Neon;
        return Isa::Scalar;
    }();
    return best;
}

// ---- bandwidth floor ----------------------------------------------------------------------------

namespace {
uint64_t read_sum_scalar(const uint8_t* p, std::size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    std::size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        std::memcpy(w, p + i, 32);
        // byte sums of four words at once: fold pairs, no carries leave a lane
        for (int k = 0; k < 4; ++k) {
            uint64_t x = w[k];
            x = (x & 0x00FF00FF00FF00FFull) + ((x >> 8) & 0x00FF00FF00FF00FFull);
            x = (x & 0x0000FFFF0000FFFFull) + ((x >> 16) & 0x0000FFFF0000FFFFull);
            x = (x & 0x00000000FFFFFFFFull) + (x >> 32);
            (k == 0 ? s0 : k == 1 ? s1 : k == 2 ? s2 : s3) += x;
        }
    }
    for (; i < n; ++i) s0 += p[i];
    return s0 + s1 + s2 + s3;
}

#ifdef NX_X86
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint8_t* p, std::size_t n) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
    std::size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i*)(p + i)), zero));
        a1 = _mm256_add_epi64(a1, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i*)(p + i + 32)), zero));
        a2 = _mm256_add_epi64(a2, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i*)(p + i + 64)), zero));
        a3 = _mm256_add_epi64(a3, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i*)(p + i + 96)), zero));
    }
    __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    alignas(32) uint64_t l[4];
    _mm256_store_si256((__m256i*)l, a);
    return l[0] + l[1] + l[2] + l[3] + read_sum_scalar(p + i, n - i);
}

__attribute__((target("avx512f,avx512bw"))) uint64_t read_sum_avx512(const uint8_t* p, std::size_t n) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i a0 = zero, a1 = zero, a2 = zero, a3 = zero;
    std::size_t i = 0;
    for (; i + 256 <= n; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_sad_epu8(_mm512_loadu_si512((const void*)(p + i)), zero));
        a1 = _mm512_add_epi64(a1, _mm512_sad_epu8(_mm512_loadu_si512((const void*)(p + i + 64)), zero));
        a2 = _mm512_add_epi64(a2, _mm512_sad_epu8(_mm512_loadu_si512((const void*)(p + i + 128)), zero));
        a3 = _mm512_add_epi64(a3, _mm512_sad_epu8(_mm512_loadu_si512((const void*)(p + i + 192)), zero));
    }
    const __m512i a = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a) + read_sum_scalar(p + i, n - i);
}
#endif
}  // namespace

uint64_t memory_read_sum(const void* data, std::size_t n) noexcept {
    const uint8_t* p = static_cast<const uint8_t*>(data);
#ifdef NX_X86
    const Isa isa = best_isa();
    if (isa == Isa::Avx512Vnni) return read_sum_avx512(p, n);
    if (isa == Isa::Avx2) return read_sum_avx2(p, n);
#endif
    return read_sum_scalar(p, n);
}

}  // namespace nx
