// RoPE reanchor: re-rotate cached (already RoPE'd) F16 K rows by `delta` positions, exactly as
// llama.cpp's K-shift does (ggml_rope_ext with the shift as position), but only over the block.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spec.hpp"
#include "util.hpp"

namespace nx {

// cos/sin table for a rotation by `delta` positions, ggml's float math reproduced step by step:
// cache[2j] = cos(theta_j) * mscale, cache[2j + 1] = sin(theta_j) * mscale, j < n_rot / 2.
// `fused`: reproduce an FMA-contracted ggml build (llama-cpp-python's default native build); only
// the YaRN terms differ.
void rope_cache(const ModelSpec& spec, int64_t delta, float* cache, bool fused = true);

// Rotate `n_heads` head vectors of `head_dim` halves each (contiguous) from `src` into `dst` (the same
// pointer rotates in place; distinct buffers must not overlap), first n_rot dims, with a precomputed
// cache; the other dims are copied. NORM pairs (2j, 2j+1); NEOX pairs (j, j + n_rot/2). `fused`: round
// the way an FMA build of ggml does (y0 = fma(x0, c, -(x1*s)), y1 = fma(x0, s, x1*c)); else plain IEEE.
void rope_rotate_f16(const uint16_t* src, uint16_t* dst, std::size_t n_heads, std::size_t head_dim,
                     std::size_t n_rot, RopeType type, const float* cache, Isa isa, bool fused = true);

// rope_cache + rope_rotate_f16 for `n_heads` heads with the spec's geometry.
void rope_reanchor_f16(uint16_t* data, std::size_t n_heads, const ModelSpec& spec, int64_t delta, Isa isa,
                       bool fused = true);

// The rotation kernels exist for every ISA except VNNI-specific ones; this maps the SLB ISA names
// onto what the RoPE kernel uses (avx512vnni -> AVX-512F + F16C).
bool rope_isa_supported(Isa isa) noexcept;

}  // namespace nx
