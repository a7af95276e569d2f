#include "rope.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NX_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace nx {

// ---- ModelSpec ----------------------------------------------------------------------------------

uint32_t ModelSpec::freq_factors_crc() const {
    if (freq_factors.empty()) return 0;
    return crc32(freq_factors.data(), freq_factors.size() * sizeof(float));
}

void ModelSpec::validate() const {
    auto bad = [](const std::string& m) { throw std::invalid_argument("ModelSpec: " + m); };
    if (n_layer < 1 || n_layer > 4096) bad("n_layer must be in [1, 4096]");
    if (n_head_kv < 1 || n_head_kv > 4096) bad("n_head_kv must be in [1, 4096]");
    if (head_dim < 2 || head_dim > 8192 || head_dim % 2) bad("head_dim must be even and in [2, 8192]");
    if (n_rot < 2 || n_rot > head_dim || n_rot % 2) bad("n_rot must be even and in [2, head_dim]");
    if (rope_type != RopeType::Norm && rope_type != RopeType::Neox) bad("rope_type must be NORM (0) or NEOX (2)");
    if (!std::isfinite(freq_base) || freq_base <= 0) bad("freq_base must be finite and > 0");
    if (!std::isfinite(freq_scale) || freq_scale <= 0) bad("freq_scale must be finite and > 0");
    if (!std::isfinite(ext_factor) || !std::isfinite(attn_factor) || !std::isfinite(beta_fast) ||
        !std::isfinite(beta_slow))
        bad("YaRN parameters must be finite");
    if (!freq_factors.empty()) {
        if (freq_factors.size() != n_rot / 2) bad("freq_factors must have n_rot / 2 entries");
        for (float f : freq_factors)
            if (!std::isfinite(f) || f <= 0) bad("freq_factors must be finite and > 0");
    }
}

std::vector<std::string> ModelSpec::diff(const ModelSpec& o, bool compare_freq_factors) const {
    std::vector<std::string> d;
    auto hex = [](const std::array<uint8_t, 16>& f) {
        static const char* k = "0123456789abcdef";
        std::string s;
        for (uint8_t b : f) s += k[b >> 4], s += k[b & 15];
        return s;
    };
    auto fl = [](float x) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%.9g", (double)x);
        return std::string(buf);
    };
    auto feq = [](float a, float b) { return f32_to_bits(a) == f32_to_bits(b); };
    if (fingerprint != o.fingerprint) d.push_back("fingerprint " + hex(fingerprint) + " != " + hex(o.fingerprint));
    if (n_layer != o.n_layer) d.push_back("n_layer " + std::to_string(n_layer) + " != " + std::to_string(o.n_layer));
    if (n_head_kv != o.n_head_kv) d.push_back("n_head_kv " + std::to_string(n_head_kv) + " != " + std::to_string(o.n_head_kv));
    if (head_dim != o.head_dim) d.push_back("head_dim " + std::to_string(head_dim) + " != " + std::to_string(o.head_dim));
    if (n_rot != o.n_rot) d.push_back("n_rot " + std::to_string(n_rot) + " != " + std::to_string(o.n_rot));
    if (rope_type != o.rope_type)
        d.push_back("rope_type " + std::to_string((uint32_t)rope_type) + " != " + std::to_string((uint32_t)o.rope_type));
    if (!feq(freq_base, o.freq_base)) d.push_back("freq_base " + fl(freq_base) + " != " + fl(o.freq_base));
    if (!feq(freq_scale, o.freq_scale)) d.push_back("freq_scale " + fl(freq_scale) + " != " + fl(o.freq_scale));
    if (n_ctx_orig != o.n_ctx_orig) d.push_back("n_ctx_orig " + std::to_string(n_ctx_orig) + " != " + std::to_string(o.n_ctx_orig));
    if (!feq(ext_factor, o.ext_factor)) d.push_back("ext_factor " + fl(ext_factor) + " != " + fl(o.ext_factor));
    if (!feq(attn_factor, o.attn_factor)) d.push_back("attn_factor " + fl(attn_factor) + " != " + fl(o.attn_factor));
    if (!feq(beta_fast, o.beta_fast)) d.push_back("beta_fast " + fl(beta_fast) + " != " + fl(o.beta_fast));
    if (!feq(beta_slow, o.beta_slow)) d.push_back("beta_slow " + fl(beta_slow) + " != " + fl(o.beta_slow));
    if (compare_freq_factors && freq_factors_crc() != o.freq_factors_crc()) d.push_back("freq_factors differ");
    return d;
}

// ---- cos/sin cache (ggml-cpu ops.cpp: rope_yarn_ramp, rope_yarn, ggml_rope_cache_init) -----------

namespace {
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
    return n_dims * logf(n_ctx_orig / (n_rot * 2 * (float)M_PI)) / (2 * logf(base));
}

float yarn_ramp(float low, float high, int i0) {
    const float y = (i0 / 2 - low) / std::max(0.001f, high - low);
    return 1 - std::min(1.0f, std::max(0.0f, y));
}
}  // namespace

void rope_cache(const ModelSpec& s, int64_t delta, float* cache, bool fused) {
    const int n_dims = (int)s.n_rot;
    const float theta_scale = powf(s.freq_base, -2.0f / n_dims);
    float corr[2];
    {
        const float start = floorf(yarn_corr_dim(n_dims, (int)s.n_ctx_orig, s.beta_fast, s.freq_base));
        const float end = ceilf(yarn_corr_dim(n_dims, (int)s.n_ctx_orig, s.beta_slow, s.freq_base));
        corr[0] = std::max(0.0f, start);
        corr[1] = std::min((float)(n_dims - 1), end);
    }
    float theta = (float)delta;
    const float* ff = s.freq_factors.empty() ? nullptr : s.freq_factors.data();
    for (int i0 = 0; i0 < n_dims; i0 += 2) {
        const float theta_extrap = theta / (ff ? ff[i0 / 2] : 1.0f);
        const float theta_interp = s.freq_scale * theta_extrap;
        float th = theta_interp;
        float mscale = s.attn_factor;
        if (s.ext_factor != 0.0f) {
            const float ramp_mix = yarn_ramp(corr[0], corr[1], i0) * s.ext_factor;
            // contracted the way an FMA build of ggml contracts rope_yarn (see the rotation note below)
            th = fused ? __builtin_fmaf(theta_interp, 1 - ramp_mix, theta_extrap * ramp_mix)
                       : theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= fused ? __builtin_fmaf(0.1f, logf(1.0f / s.freq_scale), 1.0f) : 1.0f + 0.1f * logf(1.0f / s.freq_scale);
        }
        cache[i0 + 0] = cosf(th) * mscale;
        cache[i0 + 1] = sinf(th) * mscale;
        theta *= theta_scale;
    }
}

// ---- rotation kernels ---------------------------------------------------------------------------
//
// Per pair (x0, x1) with (c, s):  y0 = x0*c - x1*s,  y1 = x0*s + x1*c  (ggml's rotate_pairs).
// `fused` reproduces what GCC/clang emit for that source when FMA is available (llama.cpp's default
// native builds): the first product is fused, the second rounded,
//     y0 = fma(x0, c, -(x1*s)),  y1 = fma(x0, s, x1*c).
// Unfused is plain IEEE: every product and the sum rounded separately.
// Vector form (NORM, interleaved lanes): with L = [x0 x0 x2 x2 ...], H = [x1 x1 x3 x3 ...],
// CS = [c0 s0 c1 s1 ...] (the cache) and NC = [-s0 c0 -s1 c1 ...]:  y = L*CS + H*NC.

namespace {

inline float rot0(float x0, float x1, float c, float s, bool fused) {
    return fused ? __builtin_fmaf(x0, c, -(x1 * s)) : x0 * c - x1 * s;
}
inline float rot1(float x0, float x1, float c, float s, bool fused) {
    return fused ? __builtin_fmaf(x0, s, x1 * c) : x0 * s + x1 * c;
}

inline void rot_norm_scalar(const uint16_t* x, uint16_t* y, std::size_t j0, std::size_t n_rot, const float* cache,
                            bool fused) {
    for (std::size_t i0 = j0; i0 < n_rot; i0 += 2) {
        const float c = cache[i0], s = cache[i0 + 1];
        const float x0 = half_to_float(x[i0]), x1 = half_to_float(x[i0 + 1]);
        y[i0] = float_to_half(rot0(x0, x1, c, s, fused));
        y[i0 + 1] = float_to_half(rot1(x0, x1, c, s, fused));
    }
}

inline void rot_neox_scalar(const uint16_t* x, uint16_t* y, std::size_t j0, std::size_t n_rot, const float* cache,
                            bool fused) {
    const std::size_t h = n_rot / 2;
    for (std::size_t j = j0; j < h; ++j) {
        const float c = cache[2 * j], s = cache[2 * j + 1];
        const float x0 = half_to_float(x[j]), x1 = half_to_float(x[j + h]);
        y[j] = float_to_half(rot0(x0, x1, c, s, fused));
        y[j + h] = float_to_half(rot1(x0, x1, c, s, fused));
    }
}

// the unrotated tail of a head (n_rot < head_dim) when rotating out of place
inline void copy_tail(const uint16_t* x, uint16_t* y, std::size_t n_rot, std::size_t head_dim) {
    if (x != y && n_rot < head_dim) std::memcpy(y + n_rot, x + n_rot, (head_dim - n_rot) * 2);
}

void rotate_scalar(const uint16_t* src, uint16_t* dst, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot,
                   RopeType type, const float* cache, bool fused) {
    for (std::size_t r = 0; r < n_heads; ++r) {
        const uint16_t* x = src + r * head_dim;
        uint16_t* y = dst + r * head_dim;
        if (type == RopeType::Norm)
            rot_norm_scalar(x, y, 0, n_rot, cache, fused);
        else
            rot_neox_scalar(x, y, 0, n_rot, cache, fused);
        copy_tail(x, y, n_rot, head_dim);
    }
}

// Vector-friendly forms of the interleaved cache.
struct Tables {
    std::vector<float> nc;    // NORM: [-s0 c0 -s1 c1 ...]
    std::vector<float> c, s;  // NEOX: [c0 c1 ...], [s0 s1 ...]
    Tables(const float* cache, std::size_t n_rot) : nc(n_rot), c(n_rot / 2), s(n_rot / 2) {
        for (std::size_t j = 0; j < n_rot / 2; ++j) {
            c[j] = cache[2 * j];
            s[j] = cache[2 * j + 1];
            nc[2 * j] = -s[j];
            nc[2 * j + 1] = c[j];
        }
    }
};

#ifdef NX_X86
__attribute__((target("avx2,fma,f16c"))) void rotate_avx2(const uint16_t* src, uint16_t* dst, std::size_t n_heads,
                                                           std::size_t head_dim, std::size_t n_rot, RopeType type,
                                                           const float* cache, bool fused) {
    const Tables t(cache, n_rot);
    const std::size_t h = n_rot / 2;
    for (std::size_t r = 0; r < n_heads; ++r) {
        const uint16_t* x = src + r * head_dim;
        uint16_t* y = dst + r * head_dim;
        copy_tail(x, y, n_rot, head_dim);
        if (type == RopeType::Norm) {
            std::size_t i = 0;
            for (; i + 8 <= n_rot; i += 8) {
                const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + i)));
                const __m256 lo = _mm256_moveldup_ps(v), hi = _mm256_movehdup_ps(v);
                const __m256 cs = _mm256_loadu_ps(cache + i), nc = _mm256_loadu_ps(t.nc.data() + i);
                const __m256 b = _mm256_mul_ps(hi, nc);
                const __m256 out = fused ? _mm256_fmadd_ps(lo, cs, b) : _mm256_add_ps(_mm256_mul_ps(lo, cs), b);
                _mm_storeu_si128((__m128i*)(y + i), _mm256_cvtps_ph(out, _MM_FROUND_TO_NEAREST_INT));
            }
            rot_norm_scalar(x, y, i, n_rot, cache, fused);
        } else {
            std::size_t j = 0;
            for (; j + 8 <= h; j += 8) {
                const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + j)));
                const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(x + j + h)));
                const __m256 c = _mm256_loadu_ps(t.c.data() + j), s = _mm256_loadu_ps(t.s.data() + j);
                const __m256 hs = _mm256_mul_ps(hi, s), hc = _mm256_mul_ps(hi, c);
                const __m256 ylo = fused ? _mm256_fmsub_ps(lo, c, hs) : _mm256_sub_ps(_mm256_mul_ps(lo, c), hs);
                const __m256 yhi = fused ? _mm256_fmadd_ps(lo, s, hc) : _mm256_add_ps(_mm256_mul_ps(lo, s), hc);
                _mm_storeu_si128((__m128i*)(y + j), _mm256_cvtps_ph(ylo, _MM_FROUND_TO_NEAREST_INT));
                _mm_storeu_si128((__m128i*)(y + j + h), _mm256_cvtps_ph(yhi, _MM_FROUND_TO_NEAREST_INT));
            }
            rot_neox_scalar(x, y, j, n_rot, cache, fused);
        }
    }
}

__attribute__((target("avx512f,avx2,fma,f16c"))) void rotate_avx512(const uint16_t* src, uint16_t* dst,
                                                                      std::size_t n_heads, std::size_t head_dim,
                                                                      std::size_t n_rot, RopeType type,
                                                                      const float* cache, bool fused) {
    const Tables t(cache, n_rot);
    const std::size_t h = n_rot / 2;
    for (std::size_t r = 0; r < n_heads; ++r) {
        const uint16_t* x = src + r * head_dim;
        uint16_t* y = dst + r * head_dim;
        copy_tail(x, y, n_rot, head_dim);
        if (type == RopeType::Norm) {
            std::size_t i = 0;
            for (; i + 16 <= n_rot; i += 16) {
                const __m512 v = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(x + i)));
                const __m512 lo = _mm512_moveldup_ps(v), hi = _mm512_movehdup_ps(v);
                const __m512 cs = _mm512_loadu_ps(cache + i), nc = _mm512_loadu_ps(t.nc.data() + i);
                const __m512 b = _mm512_mul_ps(hi, nc);
                const __m512 out = fused ? _mm512_fmadd_ps(lo, cs, b) : _mm512_add_ps(_mm512_mul_ps(lo, cs), b);
                _mm256_storeu_si256((__m256i*)(y + i), _mm512_cvtps_ph(out, _MM_FROUND_TO_NEAREST_INT));
            }
            rot_norm_scalar(x, y, i, n_rot, cache, fused);
        } else {
            std::size_t j = 0;
            for (; j + 16 <= h; j += 16) {
                const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(x + j)));
                const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(x + j + h)));
                const __m512 c = _mm512_loadu_ps(t.c.data() + j), s = _mm512_loadu_ps(t.s.data() + j);
                const __m512 hs = _mm512_mul_ps(hi, s), hc = _mm512_mul_ps(hi, c);
                const __m512 ylo = fused ? _mm512_fmsub_ps(lo, c, hs) : _mm512_sub_ps(_mm512_mul_ps(lo, c), hs);
                const __m512 yhi = fused ? _mm512_fmadd_ps(lo, s, hc) : _mm512_add_ps(_mm512_mul_ps(lo, s), hc);
                _mm256_storeu_si256((__m256i*)(y + j), _mm512_cvtps_ph(ylo, _MM_FROUND_TO_NEAREST_INT));
                _mm256_storeu_si256((__m256i*)(y + j + h), _mm512_cvtps_ph(yhi, _MM_FROUND_TO_NEAREST_INT));
            }
            rot_neox_scalar(x, y, j, n_rot, cache, fused);
        }
    }
}
#endif

#if defined(__aarch64__)
void rotate_neon(const uint16_t* src, uint16_t* dst, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot,
                 RopeType type, const float* cache, bool fused) {
    const Tables t(cache, n_rot);
    const std::size_t h = n_rot / 2;
    for (std::size_t r = 0; r < n_heads; ++r) {
        const uint16_t* x = src + r * head_dim;
        uint16_t* y = dst + r * head_dim;
        copy_tail(x, y, n_rot, head_dim);
        if (type == RopeType::Norm) {
            std::size_t i = 0;
            for (; i + 4 <= n_rot; i += 4) {
                const float32x4_t v = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i)));
                const float32x4_t lo = vtrn1q_f32(v, v), hi = vtrn2q_f32(v, v);
                const float32x4_t cs = vld1q_f32(cache + i), nc = vld1q_f32(t.nc.data() + i);
                const float32x4_t b = vmulq_f32(hi, nc);
                const float32x4_t out = fused ? vfmaq_f32(b, lo, cs) : vaddq_f32(vmulq_f32(lo, cs), b);
                vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(out)));
            }
            rot_norm_scalar(x, y, i, n_rot, cache, fused);
        } else {
            std::size_t j = 0;
            for (; j + 4 <= h; j += 4) {
                const float32x4_t lo = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + j)));
                const float32x4_t hi = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + j + h)));
                const float32x4_t c = vld1q_f32(t.c.data() + j), s = vld1q_f32(t.s.data() + j);
                const float32x4_t hs = vmulq_f32(hi, s), hc = vmulq_f32(hi, c);
                const float32x4_t ylo = fused ? vfmaq_f32(vnegq_f32(hs), lo, c) : vsubq_f32(vmulq_f32(lo, c), hs);
                const float32x4_t yhi = fused ? vfmaq_f32(hc, lo, s) : vaddq_f32(vmulq_f32(lo, s), hc);
                vst1_u16(y + j, vreinterpret_u16_f16(vcvt_f16_f32(ylo)));
                vst1_u16(y + j + h, vreinterpret_u16_f16(vcvt_f16_f32(yhi)));
            }
            rot_neox_scalar(x, y, j, n_rot, cache, fused);
        }
    }
}
#endif

}  // namespace

bool rope_isa_supported(Isa isa) noexcept { return isa_supported(isa); }

void rope_rotate_f16(const uint16_t* src, uint16_t* dst, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot,
                     RopeType type, const float* cache, Isa isa, bool fused) {
    if (n_rot > head_dim || n_rot % 2) throw std::invalid_argument("n_rot must be even and <= head_dim");
    switch (isa) {
#ifdef NX_X86
        case Isa::Avx512Vnni: return rotate_avx512(src, dst, n_heads, head_dim, n_rot, type, cache, fused);
        case Isa::Avx2: return rotate_avx2(src, dst, n_heads, head_dim, n_rot, type, cache, fused);
#endif
#if defined(__aarch64__)
        case Isa::Neon: return rotate_neon(src, dst, n_heads, head_dim, n_rot, type, cache, fused);
#endif
        default: return rotate_scalar(src, dst, n_heads, head_dim, n_rot, type, cache, fused);
    }
}

void rope_reanchor_f16(uint16_t* data, std::size_t n_heads, const ModelSpec& spec, int64_t delta, Isa isa, bool fused) {
    if (delta == 0) return;  // a block re-placed at its own anchor is bit-identical (anchored splice)
    std::vector<float> cache(spec.n_rot);
    rope_cache(spec, delta, cache.data(), fused);
    rope_rotate_f16(data, data, n_heads, spec.head_dim, spec.n_rot, spec.rope_type, cache.data(), isa, fused);
}

}  // namespace nx
