// llama.cpp sequence-state blobs (llama_state_seq_get_data / _set_data, llama.cpp as vendored by
// llama-cpp-python 0.3.36: src/llama-context.cpp state_seq_get_data, then src/llama-kv-cache.cpp
// state_write / state_write_meta / state_write_data):
//
//   u32 io_magic = 0xaf143cd8, i32 seq_id      (llama_context; the reader checks the magic, ignores seq_id)
//   u32 n_stream
//   per stream:  u32 cell_count; if cell_count > 0:
//       meta, per cell:  i32 pos, u32 n_seq_id, [cell ext, only for M-RoPE / PLE models], i32 seq_id * n_seq_id
//       data:            u32 v_trans, u32 n_layer,
//                        per layer K: i32 type, u64 row_size, cell_count * row_size bytes
//                        V (!v_trans): per layer i32 type, u64 row_size, cell_count * row_size bytes
//                        V (v_trans):  per layer i32 type, u32 el_size, u32 n_embd_v_gqa,
//                                      n_embd_v_gqa rows of cell_count * el_size bytes (element-major)
//
// Cell-ext blobs (M-RoPE / per-layer-embedding models) and quantised K/V caches are rejected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "atb.hpp"

namespace nx {

struct StatePlane {
    int32_t type = 0;
    uint64_t row_size = 0;      // K and row-major V: bytes per cell
    uint32_t el_size = 0;       // transposed V: bytes per element
    uint32_t n_embd_v = 0;      // transposed V: elements per cell
    std::size_t offset = 0;     // byte offset of the plane data in the blob
};

// Structure of a blob, validated for internal consistency (every size and offset in range, nothing
// left over) without any knowledge of the model.
inline constexpr uint32_t kStateIoMagic = 0xaf143cd8u;

struct StateLayout {
    int32_t seq_id = 0;         // the sequence the blob was taken from (informational)
    uint32_t n_stream = 0;
    uint32_t stream = 0;        // the stream holding the cells
    uint32_t cell_count = 0;    // 0: the sequence was empty
    std::vector<int32_t> pos;   // per cell, in blob order
    bool v_trans = false;
    uint32_t n_layer = 0;
    std::vector<StatePlane> k, v;
};

StateLayout parse_state(const uint8_t* p, std::size_t n);  // throws StateBlobError

// Blob -> block. Checks the blob against `spec` (layer count, F16 types, row sizes) and requires the
// cells to cover contiguous positions m0 .. m0 + n - 1 (any cell order); anchor = m0.
AtbBlock atb_from_state(const uint8_t* p, std::size_t n, const ModelSpec& spec, uint64_t token_hash);

// Block -> blob at cells position .. position + n - 1. With `reanchor`, K is re-rotated from the
// block's anchor to `position` in the output buffer (the block itself is not modified).
std::size_t state_blob_size(const AtbBlock& b, bool v_trans, uint32_t n_stream);
void write_state_blob(const AtbBlock& b, int32_t position, bool v_trans, uint32_t n_stream, int32_t seq_id,
                      bool reanchor, Isa isa, bool fused, uint8_t* out, std::size_t out_size);

}  // namespace nx
