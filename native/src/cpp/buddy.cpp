#include "buddy.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <random>
#include <string>
#include <thread>
#include <utility>

namespace nx {

// ---- the hardening, checked at compile time ----------------------------------------------------
static_assert(alignof(BuddyAllocator) == kCacheLine, "allocator must be cache-line (128 B) aligned");
static_assert(alignof(PaddedMutex) == kCacheLine && sizeof(PaddedMutex) == kCacheLine,
              "the mutex must occupy exactly one 128-byte line of its own");
static_assert(sizeof(std::mutex) <= kCacheLine, "mutex larger than its line");
static_assert(sizeof(BuddyAllocator) % kCacheLine == 0, "allocator size must be whole cache lines");

namespace {
inline bool is_pow2(std::size_t x) { return x && !(x & (x - 1)); }
inline int log2_exact(std::size_t x) { return 63 - __builtin_clzll((unsigned long long)x); }
}  // namespace

std::size_t BuddyAllocator::mutex_offset() noexcept {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
    // inside a member so the private member is reachable; evaluated at compile time all the same
    static_assert(offsetof(BuddyAllocator, lock_) % kCacheLine == 0, "the mutex must start its own cache line");
    return offsetof(BuddyAllocator, lock_);
#pragma GCC diagnostic pop
}

BuddyAllocator::BuddyAllocator(std::size_t arena_bytes, std::size_t min_block) {
    if (!is_pow2(arena_bytes) || !is_pow2(min_block)) throw std::invalid_argument("arena_bytes and min_block must be powers of two");
    if (min_block < 64) throw std::invalid_argument("min_block must be >= 64");
    if (arena_bytes < min_block) throw std::invalid_argument("arena_bytes must be >= min_block");
    if (arena_bytes / min_block > (1u << 26)) throw std::invalid_argument("too many min blocks (arena / min_block > 2^26)");
    arena_bytes_ = arena_bytes;
    min_block_ = min_block;
    min_shift_ = log2_exact(min_block);
    n_orders_ = log2_exact(arena_bytes) - min_shift_ + 1;
    n_units_ = (uint32_t)(arena_bytes / min_block);
    // reserve the arena once (lazily backed by the kernel), 2 MiB aligned when it is that large
    void* p = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<uint8_t*>(p);
    order_.assign(n_units_, 0);
    state_.assign(n_units_, 0);
    next_.assign(n_units_, kNone);
    prev_.assign(n_units_, kNone);
    for (int o = 0; o < kMaxOrders; ++o) head_[o] = kNone, free_count_[o] = 0;
    push(n_orders_ - 1, 0);
}

BuddyAllocator::~BuddyAllocator() {
    if (base_) ::munmap(base_, arena_bytes_);
}

int BuddyAllocator::order_for(std::size_t size) const {
    if (size <= min_block_) return 0;
    const int o = log2_exact(size - 1) + 1 - min_shift_;  // ceil(log2(size)) - min_shift
    return o;
}

void BuddyAllocator::push(int order, uint32_t idx) {
    order_[idx] = (uint8_t)order;
    state_[idx] = 1;
    prev_[idx] = kNone;
    next_[idx] = head_[order];
    if (head_[order] != kNone) prev_[head_[order]] = idx;
    head_[order] = idx;
    ++free_count_[order];
}

void BuddyAllocator::unlink(int order, uint32_t idx) {
    const uint32_t p = prev_[idx], n = next_[idx];
    if (p != kNone) next_[p] = n; else head_[order] = n;
    if (n != kNone) prev_[n] = p;
    prev_[idx] = next_[idx] = kNone;
    state_[idx] = 0;
    --free_count_[order];
}

int64_t BuddyAllocator::alloc(std::size_t size) {
    if (size == 0) throw std::invalid_argument("alloc size must be > 0");
    if (size > arena_bytes_) throw std::invalid_argument("alloc size " + std::to_string(size) + " exceeds the arena");
    const int want = order_for(size);
    std::lock_guard<std::mutex> g(lock_.m);
    int o = want;
    while (o < n_orders_ && head_[o] == kNone) ++o;
    if (o >= n_orders_) return -1;
    const uint32_t idx = head_[o];
    unlink(o, idx);
    while (o > want) {  // split, keeping the left half
        --o;
        push(o, idx + (1u << o));
    }
    order_[idx] = (uint8_t)want;
    state_[idx] = 2;
    ++n_alloc_;
    return (int64_t)idx << min_shift_;
}

void BuddyAllocator::free(int64_t offset) {
    if (offset < 0 || (uint64_t)offset >= arena_bytes_ || (offset & (int64_t)(min_block_ - 1)))
        throw std::invalid_argument("free: offset " + std::to_string(offset) + " is not a block of this arena");
    uint32_t idx = (uint32_t)(offset >> min_shift_);
    std::lock_guard<std::mutex> g(lock_.m);
    if (state_[idx] != 2)
        throw std::invalid_argument("free: offset " + std::to_string(offset) + " is not allocated (double free?)");
    int o = order_[idx];
    state_[idx] = 0;
    --n_alloc_;
    while (o + 1 < n_orders_) {
        const uint32_t buddy = idx ^ (1u << o);
        if (state_[buddy] != 1 || order_[buddy] != o) break;
        unlink(o, buddy);
        idx = idx < buddy ? idx : buddy;
        ++o;
    }
    push(o, idx);
}

std::size_t BuddyAllocator::block_size(int64_t offset) {
    if (offset < 0 || (uint64_t)offset >= arena_bytes_ || (offset & (int64_t)(min_block_ - 1)))
        throw std::invalid_argument("offset is not a block of this arena");
    std::lock_guard<std::mutex> g(lock_.m);
    const uint32_t idx = (uint32_t)(offset >> min_shift_);
    if (state_[idx] != 2) throw std::invalid_argument("offset is not allocated");
    return min_block_ << order_[idx];
}

std::size_t BuddyAllocator::free_bytes() {
    std::lock_guard<std::mutex> g(lock_.m);
    std::size_t s = 0;
    for (int o = 0; o < n_orders_; ++o) s += free_count_[o] * (min_block_ << o);
    return s;
}

std::size_t BuddyAllocator::largest_free() {
    std::lock_guard<std::mutex> g(lock_.m);
    for (int o = n_orders_ - 1; o >= 0; --o)
        if (head_[o] != kNone) return min_block_ << o;
    return 0;
}

std::vector<std::size_t> BuddyAllocator::free_blocks_per_order() {
    std::lock_guard<std::mutex> g(lock_.m);
    return std::vector<std::size_t>(free_count_, free_count_ + n_orders_);
}

std::size_t BuddyAllocator::allocations() {
    std::lock_guard<std::mutex> g(lock_.m);
    return n_alloc_;
}

uint64_t BuddyAllocator::stress(int threads, int iters, std::size_t max_size, uint64_t seed) {
    if (threads < 1 || threads > 64) throw std::invalid_argument("threads must be in [1, 64]");
    if (max_size < 1 || max_size > arena_bytes_) throw std::invalid_argument("max_size must be in [1, arena_bytes]");
    std::atomic<uint64_t> corrupt{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
            std::mt19937_64 rng(seed * 1315423911u + (uint64_t)t);
            std::vector<std::pair<int64_t, std::size_t>> mine;
            const uint8_t tag = (uint8_t)(t + 1);
            auto check_free = [&](std::size_t i) {
                auto [off, sz] = mine[i];
                const uint8_t* p = base_ + off;
                for (std::size_t j = 0; j < sz; ++j)
                    if (p[j] != tag) {
                        corrupt.fetch_add(1);
                        break;
                    }
                free(off);
                mine[i] = mine.back();
                mine.pop_back();
            };
            for (int it = 0; it < iters; ++it) {
                if (!mine.empty() && (rng() & 1)) {
                    check_free(rng() % mine.size());
                } else {
                    const std::size_t sz = 1 + rng() % max_size;
                    const int64_t off = alloc(sz);
                    if (off < 0) {
                        if (!mine.empty()) check_free(rng() % mine.size());
                        continue;
                    }
                    std::memset(base_ + off, tag, sz);
                    mine.emplace_back(off, sz);
                }
            }
            while (!mine.empty()) check_free(mine.size() - 1);
        });
    }
    for (auto& th : ts) th.join();
    return corrupt.load();
}

}  // namespace nx
