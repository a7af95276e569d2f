// Buddy allocator for the in-memory .atb block cache: power-of-two blocks inside one reserved arena.
//
// Cache-line hardening (paper §6.3): the allocator object is alignas(128) and its contended mutex
// sits alone on its own 128-byte line (two 64-byte lines: adjacent-line prefetch pairs them), so
// threads spinning on the lock do not false-share with the allocator's bookkeeping. Both facts are
// static_asserts in buddy.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "util.hpp"

namespace nx {

inline constexpr std::size_t kCacheLine = 128;

struct alignas(kCacheLine) PaddedMutex {
    std::mutex m;
};

class alignas(kCacheLine) BuddyAllocator {
   public:
    static constexpr int kMaxOrders = 48;
    static constexpr uint32_t kNone = 0xFFFFFFFFu;

    // arena_bytes and min_block must be powers of two, min_block >= 64, arena_bytes >= min_block,
    // arena_bytes / min_block <= 2^26. All bookkeeping is reserved here; alloc/free never allocate.
    BuddyAllocator(std::size_t arena_bytes, std::size_t min_block);
    ~BuddyAllocator();
    BuddyAllocator(const BuddyAllocator&) = delete;
    BuddyAllocator& operator=(const BuddyAllocator&) = delete;

    // Offset of a block of at least `size` bytes (rounded up to a power of two >= min_block), or -1
    // when nothing fits (the caller evicts and retries). size 0 or > arena -> std::invalid_argument.
    int64_t alloc(std::size_t size);
    // Free a block returned by alloc; coalesces with free buddies. Unknown offset / double free ->
    // std::invalid_argument (the arena is left unchanged).
    void free(int64_t offset);
    std::size_t block_size(int64_t offset);  // size of the allocated block at offset (throws if none)

    std::size_t arena_bytes() const noexcept { return arena_bytes_; }
    std::size_t min_block() const noexcept { return min_block_; }
    uint8_t* base() noexcept { return base_; }
    std::size_t free_bytes();
    std::size_t used_bytes() { return arena_bytes_ - free_bytes(); }
    std::size_t largest_free();
    std::vector<std::size_t> free_blocks_per_order();  // index = order (block = min_block << order)
    std::size_t allocations();

    // Multi-threaded stress run on this allocator (GIL must be released by the caller): each thread
    // does `iters` random alloc/free steps, fills what it owns with its own byte pattern and checks
    // it before freeing (detects overlapping blocks). Returns the number of corrupted blocks found.
    uint64_t stress(int threads, int iters, std::size_t max_size, uint64_t seed);

    static std::size_t mutex_offset() noexcept;  // offsetof(BuddyAllocator, lock_) for the tests

   private:
    int order_for(std::size_t size) const;
    void push(int order, uint32_t idx);
    void unlink(int order, uint32_t idx);

    PaddedMutex lock_;  // first member: offset 0, alone on its cache line (see static_asserts)

    uint8_t* base_ = nullptr;
    std::size_t arena_bytes_ = 0, min_block_ = 0;
    int min_shift_ = 0, n_orders_ = 0;  // orders 0 .. n_orders_ - 1
    uint32_t n_units_ = 0;              // arena_bytes / min_block
    std::size_t n_alloc_ = 0;
    uint32_t head_[kMaxOrders];
    std::size_t free_count_[kMaxOrders];
    // per min-block unit: state of the block starting there
    std::vector<uint8_t> order_;  // order of the block starting at this unit (valid at block starts)
    std::vector<uint8_t> state_;  // 0 = not a block start, 1 = free block start, 2 = allocated block start
    std::vector<uint32_t> next_, prev_;  // intrusive free lists, kept outside the arena memory
};

}  // namespace nx
