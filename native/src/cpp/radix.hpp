// L0 exact-token radix arena (paper §6.4): 32 fixed sequence slots whose token sequences are kept in
// a compressed radix tree for longest-common-prefix lookup of warm prefixes. Token storage and tree
// nodes are reserved up front: lookup / insert / remove never allocate. Eviction is LRU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util.hpp"

namespace nx {

class RadixArena {
   public:
    static constexpr int kSlots = 32;
    static constexpr int kNodes = 2 * kSlots + 2;  // root + at most one split and one leaf per slot

    struct Match {
        int slot;         // -1 when no slot shares even the first token
        uint32_t length;  // tokens shared with that slot
    };
    struct Inserted {
        int slot;
        int evicted;  // slot whose previous sequence was evicted to make room, else -1
        bool existed; // the exact sequence was already cached (its slot is returned and touched)
    };

    explicit RadixArena(std::size_t max_tokens);

    // Longest common prefix over all cached sequences; ties go to the most recently used slot.
    Match lookup(const int32_t* t, std::size_t n, bool touch);
    Inserted insert(const int32_t* t, std::size_t n, int64_t value);
    void remove(int slot);
    void touch(int slot);
    void clear();

    std::size_t max_tokens() const noexcept { return max_tokens_; }
    int size() const noexcept { return n_used_; }
    bool occupied(int slot) const;
    const int32_t* tokens(int slot, std::size_t* n) const;
    int64_t value(int slot) const;
    void set_value(int slot, int64_t v);
    std::vector<int> lru_order() const;  // occupied slots, least recently used first
    int node_count() const noexcept { return n_nodes_; }
    // Structural self-check for the tests; returns an empty string when consistent.
    std::string check() const;

   private:
    struct Node {
        int16_t parent = -1, first_child = -1, next_sibling = -1;
        int16_t label_slot = -1;  // a slot whose tokens run through this node (edge label source)
        int16_t terminal = -1;    // slot whose sequence ends exactly here
        bool used = false;
        int32_t first = 0;        // first token of the edge label (child dispatch)
        uint32_t depth = 0;       // tokens from the root to the end of this node's edge
    };

    int find_exact(const int32_t* t, std::size_t n) const;  // slot caching exactly t, else -1
    int new_node();
    void free_node(int n);
    int find_child(int node, int32_t tok) const;
    void add_child(int parent, int child);
    void replace_child(int parent, int old_child, int new_child);
    void remove_child(int parent, int child);
    int child_count(int node) const;
    int mru_in_subtree(int node) const;
    int any_slot_in_subtree(int node) const;
    const int32_t* slot_tokens(int slot) const { return store_.data() + (std::size_t)slot * max_tokens_; }
    void check_slot(int slot) const;

    std::size_t max_tokens_;
    AlignedBuf<int32_t, 64> store_;  // kSlots * max_tokens
    uint32_t len_[kSlots] = {};
    int64_t value_[kSlots] = {};
    uint64_t stamp_[kSlots] = {};
    int16_t node_of_[kSlots];
    bool used_[kSlots] = {};
    int n_used_ = 0;
    uint64_t clock_ = 0;
    Node nodes_[kNodes];
    int n_nodes_ = 0;
};

}  // namespace nx
