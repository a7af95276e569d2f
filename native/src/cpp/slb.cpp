#include "slb.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NX_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace nx {

namespace {

// ---- quantisation -------------------------------------------------------------------------------
// One body, compiled twice (baseline and AVX2) so the compiler can vectorise the loops; both use
// only exact IEEE float ops, so they agree bit for bit with each other and with the numpy reference.

__attribute__((always_inline)) inline float quantize_body(const float* x, std::size_t dim, int8_t* q) {
    uint32_t bad = 0, maxbits = 0;
    for (std::size_t j = 0; j < dim; ++j) {
        uint32_t b;
        std::memcpy(&b, x + j, 4);
        bad |= (uint32_t)((b & 0x7F800000u) == 0x7F800000u);
        const uint32_t a = b & 0x7FFFFFFFu;  // |x| bits: integer order == float order for finite |x|
        maxbits = a > maxbits ? a : maxbits;
    }
    if (bad) throw std::invalid_argument("vector has a non-finite element (nan or inf)");
    const float maxabs = f32_from_bits(maxbits);
    if (maxabs == 0.0f) {
        std::memset(q, 0, dim);
        return 0.0f;
    }
    // tiny (subnormal-range) vectors: 127 / max|x| would overflow, so scale them up by an exact 2^64 first
    const float pre = maxabs < 1e-30f ? 18446744073709551616.0f : 1.0f;
    const float inv = 127.0f / (maxabs * pre);
    for (std::size_t j = 0; j < dim; ++j) {
        float r = std::nearbyint((x[j] * pre) * inv);  // round half to even, like np.rint
        r = r > 127.0f ? 127.0f : r;
        r = r < -127.0f ? -127.0f : r;
        q[j] = (int8_t)(int)r;
    }
    return maxabs / 127.0f;
}

float quantize_scalar(const float* x, std::size_t dim, int8_t* q) { return quantize_body(x, dim, q); }

#ifdef NX_X86
__attribute__((target("avx2"))) float quantize_avx2(const float* x, std::size_t dim, int8_t* q) {
    return quantize_body(x, dim, q);
}

// Same arithmetic, explicit AVX-512: |x| and the finiteness test on the bit patterns, x * inv in float32,
// VCVTPS2DQ under the default round-to-nearest-even mode (== nearbyint / np.rint), clamp, narrow.
__attribute__((target("avx512f,avx512bw,avx512vl"))) float quantize_avx512(const float* x, std::size_t dim,
                                                                         int8_t* q) {
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF), expmask = _mm512_set1_epi32(0x7F800000);
    __m512i vmax = _mm512_setzero_si512();
    __mmask16 bad = 0;
    for (std::size_t j = 0; j < dim; j += 16) {
        const __mmask16 m = dim - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dim - j)) - 1);
        const __m512i b = _mm512_maskz_loadu_epi32(m, x + j);
        bad |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(b, expmask), expmask);
        vmax = _mm512_max_epu32(vmax, _mm512_and_si512(b, absmask));
    }
    if (bad) throw std::invalid_argument("vector has a non-finite element (nan or inf)");
    const float maxabs = f32_from_bits(_mm512_reduce_max_epu32(vmax));
    if (maxabs == 0.0f) {
        std::memset(q, 0, dim);
        return 0.0f;
    }
    const float pre = maxabs < 1e-30f ? 18446744073709551616.0f : 1.0f;
    const __m512 vpre = _mm512_set1_ps(pre), vinv = _mm512_set1_ps(127.0f / (maxabs * pre));
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (std::size_t j = 0; j < dim; j += 16) {
        const __mmask16 m = dim - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (dim - j)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), vpre), vinv);
        const __m512i r = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), lo), hi);
        _mm_mask_storeu_epi8(q + j, m, _mm512_cvtepi32_epi8(r));
    }
    return maxabs / 127.0f;
}
#endif

// ---- dot kernels: out[i] = sum_j q[j] * row_i[j] over the padded stride --------------------------

void dots_scalar(const int8_t* rows, std::size_t stride, std::size_t n, const int8_t* q, const int32_t*,
                 int32_t* out) {
    for (std::size_t i = 0; i < n; ++i) {
        const int8_t* r = rows + i * stride;
        int32_t acc = 0;
        for (std::size_t j = 0; j < stride; ++j) acc += (int32_t)q[j] * (int32_t)r[j];
        out[i] = acc;
    }
}

#ifdef NX_X86
__attribute__((target("avx2"))) inline __m256i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
    // -> 128-bit [sum a, sum b, sum c, sum d] in the low lane of the result
    const __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    const __m256i abcd = _mm256_hadd_epi32(ab, cd);
    return _mm256_castsi128_si256(
        _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1)));
}

__attribute__((target("avx2"))) inline int32_t hsum_epi32(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// u8 x s8 products via the sign trick: |q| * (row * sign(q)) == q * row; no i16 saturation since
// |q|, |row| <= 127 (2 * 127 * 127 < 32767).
__attribute__((target("avx2"))) void dots_avx2(const int8_t* rows, std::size_t stride, std::size_t n,
                                               const int8_t* q, const int32_t*, int32_t* out) {
    const __m256i ones = _mm256_set1_epi16(1);
    const std::size_t nc = stride / 32;
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const int8_t* r0 = rows + i * stride;
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        for (std::size_t c = 0; c < nc; ++c) {
            const __m256i qv = _mm256_load_si256((const __m256i*)(q + 32 * c));
            const __m256i qa = _mm256_sign_epi8(qv, qv);
            const __m256i x0 = _mm256_load_si256((const __m256i*)(r0 + 32 * c));
            const __m256i x1 = _mm256_load_si256((const __m256i*)(r0 + stride + 32 * c));
            const __m256i x2 = _mm256_load_si256((const __m256i*)(r0 + 2 * stride + 32 * c));
            const __m256i x3 = _mm256_load_si256((const __m256i*)(r0 + 3 * stride + 32 * c));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(x0, qv)), ones));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(x1, qv)), ones));
            a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(x2, qv)), ones));
            a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(x3, qv)), ones));
        }
        _mm_storeu_si128((__m128i*)(out + i), _mm256_castsi256_si128(hsum4_epi32(a0, a1, a2, a3)));
    }
    for (; i < n; ++i) {
        const int8_t* r = rows + i * stride;
        __m256i a = _mm256_setzero_si256();
        for (std::size_t c = 0; c < nc; ++c) {
            const __m256i qv = _mm256_load_si256((const __m256i*)(q + 32 * c));
            const __m256i x = _mm256_load_si256((const __m256i*)(r + 32 * c));
            a = _mm256_add_epi32(
                a, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qv, qv), _mm256_sign_epi8(x, qv)), ones));
        }
        out[i] = hsum_epi32(a);
    }
}

// VPDPBUSD multiplies u8 x s8: feed the query as u8 (q + 128) and subtract 128 * rowsum afterwards.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2"))) void dots_avx512vnni(
    const int8_t* rows, std::size_t stride, std::size_t n, const int8_t* q, const int32_t* rowsum,
    int32_t* out) {
    const std::size_t nc = stride / 64;
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const int8_t* r0 = rows + i * stride;
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        for (std::size_t c = 0; c < nc; ++c) {
            const __m512i qu = _mm512_xor_si512(_mm512_load_si512((const void*)(q + 64 * c)), bias);
            a0 = _mm512_dpbusd_epi32(a0, qu, _mm512_load_si512((const void*)(r0 + 64 * c)));
            a1 = _mm512_dpbusd_epi32(a1, qu, _mm512_load_si512((const void*)(r0 + stride + 64 * c)));
            a2 = _mm512_dpbusd_epi32(a2, qu, _mm512_load_si512((const void*)(r0 + 2 * stride + 64 * c)));
            a3 = _mm512_dpbusd_epi32(a3, qu, _mm512_load_si512((const void*)(r0 + 3 * stride + 64 * c)));
        }
        const __m256i h0 = _mm256_add_epi32(_mm512_castsi512_si256(a0), _mm512_extracti64x4_epi64(a0, 1));
        const __m256i h1 = _mm256_add_epi32(_mm512_castsi512_si256(a1), _mm512_extracti64x4_epi64(a1, 1));
        const __m256i h2 = _mm256_add_epi32(_mm512_castsi512_si256(a2), _mm512_extracti64x4_epi64(a2, 1));
        const __m256i h3 = _mm256_add_epi32(_mm512_castsi512_si256(a3), _mm512_extracti64x4_epi64(a3, 1));
        const __m128i s = _mm256_castsi256_si128(hsum4_epi32(h0, h1, h2, h3));
        const __m128i corr = _mm_slli_epi32(_mm_loadu_si128((const __m128i*)(rowsum + i)), 7);
        _mm_storeu_si128((__m128i*)(out + i), _mm_sub_epi32(s, corr));
    }
    for (; i < n; ++i) {
        const int8_t* r = rows + i * stride;
        __m512i a = _mm512_setzero_si512();
        for (std::size_t c = 0; c < nc; ++c) {
            const __m512i qu = _mm512_xor_si512(_mm512_load_si512((const void*)(q + 64 * c)), bias);
            a = _mm512_dpbusd_epi32(a, qu, _mm512_load_si512((const void*)(r + 64 * c)));
        }
        out[i] = _mm512_reduce_add_epi32(a) - 128 * rowsum[i];
    }
}
#endif

#if defined(__aarch64__)
void dots_neon(const int8_t* rows, std::size_t stride, std::size_t n, const int8_t* q, const int32_t*,
               int32_t* out) {
    const std::size_t nc = stride / 16;
    for (std::size_t i = 0; i < n; ++i) {
        const int8_t* r = rows + i * stride;
        int32x4_t acc = vdupq_n_s32(0);
        for (std::size_t c = 0; c < nc; ++c) {
            const int8x16_t qv = vld1q_s8(q + 16 * c), rv = vld1q_s8(r + 16 * c);
#if defined(__ARM_FEATURE_DOTPROD)
            acc = vdotq_s32(acc, qv, rv);
#else
            const int16x8_t lo = vmull_s8(vget_low_s8(qv), vget_low_s8(rv));
            const int16x8_t hi = vmull_high_s8(qv, rv);
            acc = vpadalq_s16(acc, lo);
            acc = vpadalq_s16(acc, hi);
#endif
        }
        out[i] = vaddvq_s32(acc);
    }
}
#endif

using DotsFn = void (*)(const int8_t*, std::size_t, std::size_t, const int8_t*, const int32_t*, int32_t*);

DotsFn dots_for(Isa isa) {
    switch (isa) {
#ifdef NX_X86
        case Isa::Avx512Vnni: return dots_avx512vnni;
        case Isa::Avx2: return dots_avx2;
#endif
#if defined(__aarch64__)
        case Isa::Neon: return dots_neon;
#endif
        default: return dots_scalar;
    }
}

// "a ranks before b": higher score first, then the smaller id.
inline bool better(float sa, int64_t ia, float sb, int64_t ib) { return sa > sb || (sa == sb && ia < ib); }

constexpr std::size_t kChunk = 256;  // rows scored per pass through the selection

}  // namespace

float quantize_int8(const float* x, std::size_t dim, int8_t* q, Isa isa) {
#ifdef NX_X86
    if (isa == Isa::Avx512Vnni) return quantize_avx512(x, dim, q);
    if (isa == Isa::Avx2) return quantize_avx2(x, dim, q);
#endif
    return quantize_scalar(x, dim, q);
}

// ---- Int8Index ----------------------------------------------------------------------------------

Int8Index::Int8Index(std::size_t dim, std::size_t capacity, Isa isa)
    : dim_(dim), stride_(round_up(dim, kAlign)), isa_(Isa::Scalar) {
    if (dim == 0 || dim > (1u << 16)) throw std::invalid_argument("dim must be in [1, 65536]");
    set_isa(isa);
    reserve(capacity ? capacity : 64);
}

void Int8Index::set_isa(Isa isa) {
    if (!isa_supported(isa))
        throw std::invalid_argument(std::string("ISA '") + isa_name(isa) + "' is not supported by this CPU/build");
    isa_ = isa;
}

void Int8Index::reserve(std::size_t cap) {
    if (cap <= cap_) return;
    AlignedBuf<int8_t, kAlign> nr(cap * stride_);
    if (n_) std::memcpy(nr.data(), rows_.data(), n_ * stride_);
    rows_ = std::move(nr);
    scales_.reserve(cap);
    rowsum_.reserve(cap);
    ids_.reserve(cap);
    cap_ = cap;
}

void Int8Index::add(const float* x, std::size_t n, const int64_t* ids) {
    if (n == 0) return;
    // validate everything first: a failed add leaves the index untouched
    {
        std::unordered_map<int64_t, char> seen;
        seen.reserve(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (pos_.count(ids[i])) throw std::invalid_argument("id " + std::to_string(ids[i]) + " is already in the index");
            if (!seen.emplace(ids[i], 0).second) throw std::invalid_argument("id " + std::to_string(ids[i]) + " repeated in this add");
        }
    }
    AlignedBuf<int8_t, kAlign> q(n * stride_);
    std::vector<float> sc(n);
    for (std::size_t i = 0; i < n; ++i) sc[i] = quantize_int8(x + i * dim_, dim_, q.data() + i * stride_, isa_);

    if (n_ + n > cap_) reserve(std::max(n_ + n, cap_ * 2));
    std::memcpy(rows_.data() + n_ * stride_, q.data(), n * stride_);
    for (std::size_t i = 0; i < n; ++i) {
        int32_t s = 0;
        for (std::size_t j = 0; j < dim_; ++j) s += q[i * stride_ + j];
        scales_.push_back(sc[i]);
        rowsum_.push_back(s);
        ids_.push_back(ids[i]);
        pos_[ids[i]] = n_ + i;
        next_id_ = std::max(next_id_, ids[i] + 1);
    }
    n_ += n;
}

void Int8Index::replace(int64_t id, const float* x) {
    auto it = pos_.find(id);
    if (it == pos_.end()) throw std::out_of_range("id " + std::to_string(id) + " is not in the index");
    AlignedBuf<int8_t, kAlign> q(stride_);
    const float sc = quantize_int8(x, dim_, q.data(), isa_);
    const std::size_t r = it->second;
    std::memcpy(rows_.data() + r * stride_, q.data(), stride_);
    int32_t s = 0;
    for (std::size_t j = 0; j < dim_; ++j) s += q[j];
    scales_[r] = sc;
    rowsum_[r] = s;
}

void Int8Index::remove(int64_t id) {
    auto it = pos_.find(id);
    if (it == pos_.end()) throw std::out_of_range("id " + std::to_string(id) + " is not in the index");
    const std::size_t r = it->second, last = n_ - 1;
    pos_.erase(it);
    if (r != last) {
        std::memcpy(rows_.data() + r * stride_, rows_.data() + last * stride_, stride_);
        scales_[r] = scales_[last];
        rowsum_[r] = rowsum_[last];
        ids_[r] = ids_[last];
        pos_[ids_[r]] = r;
    }
    std::memset(rows_.data() + last * stride_, 0, stride_);
    scales_.pop_back();
    rowsum_.pop_back();
    ids_.pop_back();
    --n_;
}

bool Int8Index::contains(int64_t id) const { return pos_.count(id) != 0; }

void Int8Index::clear() {
    std::memset(rows_.data(), 0, n_ * stride_);
    scales_.clear();
    rowsum_.clear();
    ids_.clear();
    pos_.clear();
    n_ = 0;
}

void Int8Index::quantize_query(const float* q, int8_t* out, float* scale) const {
    std::memset(out + dim_, 0, stride_ - dim_);
    *scale = quantize_int8(q, dim_, out, isa_);
}

void Int8Index::dots(const int8_t* q, int32_t* out) const { dots_for(isa_)(rows_.data(), stride_, n_, q, rowsum_.data(), out); }

namespace {
// Per-thread query scratch, grown once; avoids a heap allocation per search.
int8_t* query_scratch(std::size_t stride) {
    thread_local AlignedBuf<int8_t, 64> buf;
    if (buf.size() < stride) buf = AlignedBuf<int8_t, 64>(stride);
    return buf.data();
}
}  // namespace

void Int8Index::scores(const float* query, float* out) const {
    int8_t* q = query_scratch(stride_);
    float qs;
    quantize_query(query, q, &qs);
    const DotsFn fn = dots_for(isa_);
    int32_t d[kChunk];
    for (std::size_t b = 0; b < n_; b += kChunk) {
        const std::size_t m = std::min(kChunk, n_ - b);
        fn(rows_.data() + b * stride_, stride_, m, q, rowsum_.data() + b, d);
        for (std::size_t i = 0; i < m; ++i) out[b + i] = (float)d[i] * scales_[b + i] * qs;
    }
}

std::size_t Int8Index::search(const float* query, std::size_t k, int64_t* out_ids, float* out_scores) const {
    int8_t* q = query_scratch(stride_);
    float qs;
    quantize_query(query, q, &qs);  // validates the query even when the index is empty
    k = std::min(k, n_);
    if (k == 0) return 0;
    const DotsFn fn = dots_for(isa_);
    int32_t d[kChunk];

    if (k <= 64) {
        // Bounded insertion into a small sorted buffer on the stack. Rows below the current k-th
        // score are rejected by one compare; only the rare improvements insert. (Tried: screening 16
        // rows per movemask, and an unsorted buffer with a branch-free worst-entry scan: no faster.)
        float bs[64];
        int64_t bi[64];
        float sc[kChunk];
        std::size_t cnt = 0;
        float thr = -INFINITY;
        for (std::size_t b = 0; b < n_; b += kChunk) {
            const std::size_t m = std::min(kChunk, n_ - b);
            fn(rows_.data() + b * stride_, stride_, m, q, rowsum_.data() + b, d);
            const float* rs = scales_.data() + b;
            for (std::size_t i = 0; i < m; ++i) sc[i] = (float)d[i] * rs[i] * qs;  // vectorised
            const int64_t* id = ids_.data() + b;
            for (std::size_t i = 0; i < m; ++i) {
                const float s = sc[i];
                if (s < thr) continue;
                std::size_t p;
                if (cnt < k) {
                    p = cnt++;
                } else if (better(s, id[i], bs[k - 1], bi[k - 1])) {
                    p = k - 1;
                } else {
                    continue;
                }
                while (p > 0 && better(s, id[i], bs[p - 1], bi[p - 1])) {
                    bs[p] = bs[p - 1];
                    bi[p] = bi[p - 1];
                    --p;
                }
                bs[p] = s;
                bi[p] = id[i];
                if (cnt == k) thr = bs[k - 1];
            }
        }
        std::memcpy(out_scores, bs, k * sizeof(float));
        std::memcpy(out_ids, bi, k * sizeof(int64_t));
        return k;
    }

    std::vector<std::pair<float, int64_t>> all(n_);
    for (std::size_t b = 0; b < n_; b += kChunk) {
        const std::size_t m = std::min(kChunk, n_ - b);
        fn(rows_.data() + b * stride_, stride_, m, q, rowsum_.data() + b, d);
        for (std::size_t i = 0; i < m; ++i) all[b + i] = {(float)d[i] * scales_[b + i] * qs, ids_[b + i]};
    }
    auto cmp = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
        return better(a.first, a.second, b.first, b.second);
    };
    std::partial_sort(all.begin(), all.begin() + (std::ptrdiff_t)k, all.end(), cmp);
    for (std::size_t i = 0; i < k; ++i) out_scores[i] = all[i].first, out_ids[i] = all[i].second;
    return k;
}

}  // namespace nx
