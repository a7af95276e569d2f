// INT8 semantic lookaside buffer (SLB): symmetric per-vector INT8 quantisation and a branchless
// dot-product scan with run-time dispatch AVX-512-VNNI -> AVX2 -> scalar (NEON on arm64).
#pragma once

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "util.hpp"

namespace nx {

// Quantise one vector: q[i] = clamp(rint(x[i] * (127 / max|x|)), -127, 127); returns the scale
// max|x| / 127 (0 for an all-zero vector). Throws std::invalid_argument on a non-finite element.
// Every ISA's kernel gives the same bits.
float quantize_int8(const float* x, std::size_t dim, int8_t* q, Isa isa = best_isa());

// Rows are `stride` = round_up(dim, 64) bytes apart, 64-byte aligned, zero padded, so every kernel
// runs whole 64-byte chunks with no tail and no branch in the inner loop.
class Int8Index {
   public:
    static constexpr std::size_t kAlign = 64;

    Int8Index(std::size_t dim, std::size_t capacity, Isa isa);

    std::size_t dim() const noexcept { return dim_; }
    std::size_t stride() const noexcept { return stride_; }
    std::size_t size() const noexcept { return n_; }
    std::size_t capacity() const noexcept { return cap_; }
    Isa isa() const noexcept { return isa_; }
    void set_isa(Isa isa);  // throws std::invalid_argument if the CPU lacks it

    // Append n rows with the given ids (ids must be new and unique). Validates before mutating.
    void add(const float* x, std::size_t n, const int64_t* ids);
    void replace(int64_t id, const float* x);
    void remove(int64_t id);  // O(1): the last row moves into the hole
    bool contains(int64_t id) const;
    void clear();
    int64_t next_id() const noexcept { return next_id_; }

    // Top-k by score = float(int_dot) * row_scale * query_scale, descending; ties: smaller id first.
    // Writes min(k, size) results, returns that count.
    std::size_t search(const float* query, std::size_t k, int64_t* out_ids, float* out_scores) const;
    // Score of every row, in row order.
    void scores(const float* query, float* out) const;

    // Raw access (row order) for the Python views.
    const int8_t* rows() const noexcept { return rows_.data(); }
    const float* scales() const noexcept { return scales_.data(); }
    const int64_t* ids() const noexcept { return ids_.data(); }

    // Serialise access: searches share, mutations are exclusive (Python may release the GIL).
    std::shared_mutex& mutex() const noexcept { return mu_; }

   private:
    void reserve(std::size_t cap);
    void quantize_query(const float* q, int8_t* out, float* scale) const;
    void dots(const int8_t* q, int32_t* out) const;

    std::size_t dim_, stride_;
    std::size_t n_ = 0, cap_ = 0;
    Isa isa_;
    AlignedBuf<int8_t, kAlign> rows_;
    std::vector<float> scales_;
    std::vector<int32_t> rowsum_;  // sum of a row's int8 values (the VNNI path's u8-bias correction)
    std::vector<int64_t> ids_;
    std::unordered_map<int64_t, std::size_t> pos_;
    int64_t next_id_ = 0;
    mutable std::shared_mutex mu_;
};

}  // namespace nx
