#include "radix.hpp"

#include <algorithm>
#include <string>

namespace nx {

namespace {
inline std::size_t lcp(const int32_t* a, const int32_t* b, std::size_t n) {
    std::size_t i = 0;
    while (i + 8 <= n && std::memcmp(a + i, b + i, 32) == 0) i += 8;
    while (i < n && a[i] == b[i]) ++i;
    return i;
}
}  // namespace

RadixArena::RadixArena(std::size_t max_tokens) : max_tokens_(max_tokens) {
    if (max_tokens < 1 || max_tokens > (1u << 24)) throw std::invalid_argument("max_tokens must be in [1, 2^24]");
    store_ = AlignedBuf<int32_t, 64>((std::size_t)kSlots * max_tokens);
    clear();
}

void RadixArena::clear() {
    for (auto& n : nodes_) n = Node{};
    nodes_[0].used = true;  // root: depth 0, no label
    n_nodes_ = 1;
    for (int s = 0; s < kSlots; ++s) used_[s] = false, node_of_[s] = -1, len_[s] = 0, value_[s] = 0, stamp_[s] = 0;
    n_used_ = 0;
}

int RadixArena::new_node() {
    for (int i = 1; i < kNodes; ++i)
        if (!nodes_[i].used) {
            nodes_[i] = Node{};
            nodes_[i].used = true;
            ++n_nodes_;
            return i;
        }
    throw std::logic_error("radix arena node pool exhausted (invariant broken)");
}

void RadixArena::free_node(int n) {
    nodes_[n] = Node{};
    --n_nodes_;
}

int RadixArena::find_child(int node, int32_t tok) const {
    for (int c = nodes_[node].first_child; c >= 0; c = nodes_[c].next_sibling)
        if (nodes_[c].first == tok) return c;
    return -1;
}

void RadixArena::add_child(int parent, int child) {
    nodes_[child].parent = (int16_t)parent;
    nodes_[child].next_sibling = nodes_[parent].first_child;
    nodes_[parent].first_child = (int16_t)child;
}

void RadixArena::replace_child(int parent, int old_child, int new_child) {
    int16_t* link = &nodes_[parent].first_child;
    while (*link != old_child) link = &nodes_[*link].next_sibling;
    *link = (int16_t)new_child;
    nodes_[new_child].next_sibling = nodes_[old_child].next_sibling;
    nodes_[new_child].parent = (int16_t)parent;
    nodes_[old_child].next_sibling = -1;
}

void RadixArena::remove_child(int parent, int child) {
    int16_t* link = &nodes_[parent].first_child;
    while (*link != child) link = &nodes_[*link].next_sibling;
    *link = nodes_[child].next_sibling;
    nodes_[child].next_sibling = -1;
}

int RadixArena::child_count(int node) const {
    int k = 0;
    for (int c = nodes_[node].first_child; c >= 0; c = nodes_[c].next_sibling) ++k;
    return k;
}

int RadixArena::mru_in_subtree(int node) const {
    int16_t stack[kNodes];
    int sp = 0, best = -1;
    stack[sp++] = (int16_t)node;
    while (sp) {
        const int n = stack[--sp];
        const int t = nodes_[n].terminal;
        if (t >= 0 && (best < 0 || stamp_[t] > stamp_[best])) best = t;
        for (int c = nodes_[n].first_child; c >= 0; c = nodes_[c].next_sibling) stack[sp++] = (int16_t)c;
    }
    return best;
}

int RadixArena::any_slot_in_subtree(int node) const {
    while (nodes_[node].terminal < 0) node = nodes_[node].first_child;  // leaves always hold a terminal
    return nodes_[node].terminal;
}

void RadixArena::check_slot(int slot) const {
    if (slot < 0 || slot >= kSlots) throw std::out_of_range("slot must be in [0, 32)");
    if (!used_[slot]) throw std::invalid_argument("slot " + std::to_string(slot) + " is empty");
}

RadixArena::Match RadixArena::lookup(const int32_t* t, std::size_t n, bool touch_it) {
    int node = 0, best = 0;
    std::size_t i = 0;
    while (i < n) {
        const int c = find_child(node, t[i]);
        if (c < 0) break;
        const std::size_t L = nodes_[c].depth - nodes_[node].depth;
        const std::size_t l = lcp(slot_tokens(nodes_[c].label_slot) + nodes_[node].depth, t + i, std::min(L, n - i));
        i += l;
        best = c;
        if (l < L) break;
        node = c;
    }
    if (i == 0) return {-1, 0};
    const int slot = mru_in_subtree(best);
    if (touch_it) stamp_[slot] = ++clock_;
    return {slot, (uint32_t)i};
}

int RadixArena::find_exact(const int32_t* t, std::size_t n) const {
    int node = 0;
    std::size_t i = 0;
    while (i < n) {
        const int c = find_child(node, t[i]);
        if (c < 0) return -1;
        const std::size_t L = nodes_[c].depth - nodes_[node].depth;
        if (L > n - i) return -1;
        if (lcp(slot_tokens(nodes_[c].label_slot) + nodes_[node].depth, t + i, L) != L) return -1;
        i += L;
        node = c;
    }
    return nodes_[node].terminal;
}

RadixArena::Inserted RadixArena::insert(const int32_t* t, std::size_t n, int64_t value) {
    if (n == 0) throw std::invalid_argument("cannot cache an empty token sequence");
    if (n > max_tokens_) throw std::invalid_argument("sequence of " + std::to_string(n) + " tokens exceeds max_tokens " + std::to_string(max_tokens_));
    // already cached exactly?
    {
        const int e = find_exact(t, n);
        if (e >= 0) {
            value_[e] = value;
            stamp_[e] = ++clock_;
            return {e, -1, true};
        }
    }
    int slot = -1, evicted = -1;
    for (int s = 0; s < kSlots; ++s)
        if (!used_[s]) {
            slot = s;
            break;
        }
    if (slot < 0) {
        for (int s = 0; s < kSlots; ++s)
            if (slot < 0 || stamp_[s] < stamp_[slot]) slot = s;
        remove(slot);
        evicted = slot;
    }
    std::memcpy(store_.data() + (std::size_t)slot * max_tokens_, t, n * sizeof(int32_t));
    const int32_t* st = slot_tokens(slot);

    int node = 0;
    std::size_t i = 0;
    for (;;) {
        if (i == n) {
            nodes_[node].terminal = (int16_t)slot;
            node_of_[slot] = (int16_t)node;
            break;
        }
        const int c = find_child(node, st[i]);
        if (c < 0) {
            const int leaf = new_node();
            nodes_[leaf].label_slot = (int16_t)slot;
            nodes_[leaf].depth = (uint32_t)n;
            nodes_[leaf].first = st[i];
            nodes_[leaf].terminal = (int16_t)slot;
            add_child(node, leaf);
            node_of_[slot] = (int16_t)leaf;
            break;
        }
        const uint32_t d0 = nodes_[node].depth;
        const std::size_t L = nodes_[c].depth - d0;
        const int32_t* lab = slot_tokens(nodes_[c].label_slot) + d0;
        const std::size_t l = lcp(lab, st + i, std::min(L, n - i));
        if (l == L) {
            node = c;
            i += l;
            continue;
        }
        // split c's edge after l tokens (l >= 1: the first token matched)
        const int m = new_node();
        nodes_[m].label_slot = nodes_[c].label_slot;
        nodes_[m].depth = d0 + (uint32_t)l;
        nodes_[m].first = nodes_[c].first;
        replace_child(node, c, m);
        nodes_[c].first = lab[l];
        add_child(m, c);
        node = m;
        i += l;
    }
    used_[slot] = true;
    len_[slot] = (uint32_t)n;
    value_[slot] = value;
    stamp_[slot] = ++clock_;
    ++n_used_;
    return {slot, evicted, false};
}

void RadixArena::remove(int slot) {
    check_slot(slot);
    int node = node_of_[slot];
    nodes_[node].terminal = -1;
    used_[slot] = false;
    node_of_[slot] = -1;
    --n_used_;
    if (node != 0 && nodes_[node].first_child < 0) {
        const int p = nodes_[node].parent;
        remove_child(p, node);
        free_node(node);
        node = p;
    }
    if (node != 0 && nodes_[node].terminal < 0 && child_count(node) == 1) {
        // merge a pass-through node into its only child
        const int ch = nodes_[node].first_child;
        const int p = nodes_[node].parent;
        nodes_[ch].first = nodes_[node].first;
        replace_child(p, node, ch);
        free_node(node);
    }
    // edge labels that pointed into the removed slot's tokens now borrow another slot on the same path
    for (int i = 1; i < kNodes; ++i)
        if (nodes_[i].used && nodes_[i].label_slot == slot) nodes_[i].label_slot = (int16_t)any_slot_in_subtree(i);
}

void RadixArena::touch(int slot) {
    check_slot(slot);
    stamp_[slot] = ++clock_;
}

bool RadixArena::occupied(int slot) const {
    if (slot < 0 || slot >= kSlots) throw std::out_of_range("slot must be in [0, 32)");
    return used_[slot];
}

const int32_t* RadixArena::tokens(int slot, std::size_t* n) const {
    check_slot(slot);
    *n = len_[slot];
    return slot_tokens(slot);
}

int64_t RadixArena::value(int slot) const {
    check_slot(slot);
    return value_[slot];
}

void RadixArena::set_value(int slot, int64_t v) {
    check_slot(slot);
    value_[slot] = v;
}

std::vector<int> RadixArena::lru_order() const {
    std::vector<int> s;
    for (int i = 0; i < kSlots; ++i)
        if (used_[i]) s.push_back(i);
    std::sort(s.begin(), s.end(), [&](int a, int b) { return stamp_[a] < stamp_[b]; });
    return s;
}

std::string RadixArena::check() const {
    int count = 0;
    for (int i = 0; i < kNodes; ++i) {
        if (!nodes_[i].used) continue;
        ++count;
        const Node& nd = nodes_[i];
        int kids = 0;
        for (int c = nd.first_child; c >= 0; c = nodes_[c].next_sibling) {
            ++kids;
            if (nodes_[c].parent != i) return "child/parent link broken at node " + std::to_string(c);
            if (nodes_[c].depth <= nd.depth) return "child depth not below parent at node " + std::to_string(c);
            for (int d = nodes_[c].next_sibling; d >= 0; d = nodes_[d].next_sibling)
                if (nodes_[d].first == nodes_[c].first) return "two children share a first token under node " + std::to_string(i);
        }
        if (i == 0) continue;
        if (nd.terminal < 0 && kids < 2) return "non-terminal node " + std::to_string(i) + " with < 2 children";
        const int ls = nd.label_slot;
        if (ls < 0 || !used_[ls]) return "node " + std::to_string(i) + " labels from an empty slot";
        if (len_[ls] < nd.depth) return "label slot too short at node " + std::to_string(i);
        if (slot_tokens(ls)[nodes_[nd.parent].depth] != nd.first) return "cached first token wrong at node " + std::to_string(i);
    }
    if (count != n_nodes_) return "node count mismatch";
    for (int s = 0; s < kSlots; ++s) {
        if (!used_[s]) continue;
        const int n = node_of_[s];
        if (n < 0 || nodes_[n].terminal != s || nodes_[n].depth != len_[s]) return "slot " + std::to_string(s) + " terminal wrong";
        // the path from the root spells the slot's tokens
        for (int x = n; x != 0; x = nodes_[x].parent) {
            const uint32_t d0 = nodes_[nodes_[x].parent].depth;
            if (std::memcmp(slot_tokens(nodes_[x].label_slot) + d0, slot_tokens(s) + d0, (nodes_[x].depth - d0) * 4) != 0)
                return "path of slot " + std::to_string(s) + " does not spell its tokens";
        }
    }
    return "";
}

}  // namespace nx
