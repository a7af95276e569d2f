// The runtime model's KV geometry and RoPE regime: what an .atb block is validated against, and what
// the reanchor kernel rotates with. Field meanings follow llama.cpp's cparams / hparams.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace nx {

// Values are llama.cpp's LLAMA_ROPE_TYPE_* so they can be passed through unchanged.
enum class RopeType : uint32_t { Norm = 0, Neox = 2 };
// Layout of a V plane: token-major rows (flash attention on) or element-major (llama.cpp's
// transposed V cache, flash attention off).
enum class VLayout : uint32_t { Rows = 0, Transposed = 1 };

struct ModelSpec {
    std::array<uint8_t, 16> fingerprint{};  // opaque model identity, e.g. sha256(gguf)[:16]
    uint32_t n_layer = 0;
    uint32_t n_head_kv = 0;
    uint32_t head_dim = 0;  // K and V head size
    uint32_t n_rot = 0;     // rotated dims per head (<= head_dim, even)
    RopeType rope_type = RopeType::Norm;
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    uint32_t n_ctx_orig = 0;  // YaRN original context (cparams.n_ctx_orig_yarn)
    float ext_factor = 0.0f;  // YaRN extrapolation mix; 0 = plain (linear-scaled) RoPE
    float attn_factor = 1.0f;
    float beta_fast = 32.0f;
    float beta_slow = 1.0f;
    std::vector<float> freq_factors;  // optional per-pair divisors (rope_freqs tensor), n_rot / 2

    uint32_t n_embd() const { return n_head_kv * head_dim; }
    uint32_t freq_factors_crc() const;  // CRC-32 of the float32 LE bytes, 0 when there are none
    void validate() const;              // throws std::invalid_argument
    // Human-readable list of the fields in which `other` differs (empty when they match). The
    // comparison is exact (floats bitwise) because a block is only exact under the same regime.
    std::vector<std::string> diff(const ModelSpec& other, bool compare_freq_factors) const;
};

}  // namespace nx
