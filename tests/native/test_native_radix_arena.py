"""L0 radix arena: longest-common-prefix lookup, LRU eviction and slot reuse in parity with a
linear-scan reference, with the tree's structural invariants checked after every operation."""

from __future__ import annotations

import nexus_native as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nexus_native import reference as ref


def test_exact_and_partial_prefix_lookup():
    r = nn.RadixArena(64)
    assert r.n_slots == 32 and len(r) == 0
    assert r.lookup([1, 2, 3]) == (-1, 0)
    s1, ev, existed = r.insert([1, 2, 3, 4, 5], value=11)
    assert (s1, ev, existed) == (0, -1, False)
    s2, _, _ = r.insert([1, 2, 9], value=22)
    s3, _, _ = r.insert([1, 2], value=33)  # a prefix of both
    assert r.lookup([1, 2, 3, 4, 5, 6]) == (s1, 5)
    assert r.lookup([1, 2, 9, 9]) == (s2, 3)
    assert r.lookup([1, 2, 3, 7]) == (s1, 3)
    assert r.lookup([7]) == (-1, 0)
    assert r.lookup([1, 2]) in {(s1, 2), (s2, 2), (s3, 2)}
    assert r.value(s3) == 33 and r.tokens(s1).tolist() == [1, 2, 3, 4, 5]
    assert r.check() == ""
    # exact duplicate reuses its slot and updates the value
    assert r.insert([1, 2, 9], value=99) == (s2, -1, True)
    assert r.value(s2) == 99 and len(r) == 3


def test_ties_go_to_the_most_recently_used_slot():
    r = nn.RadixArena(16)
    a, _, _ = r.insert([5, 6, 7])
    b, _, _ = r.insert([5, 6, 8])
    assert r.lookup([5, 6], touch=False) == (b, 2)
    r.touch(a)
    assert r.lookup([5, 6]) == (a, 2)


def test_lru_eviction_after_32_slots():
    r = nn.RadixArena(8)
    for i in range(32):
        assert r.insert([i, i + 1])[0] == i
    r.lookup([0, 1])  # slot 0 becomes most recent; slot 1 is now the least recent
    slot, evicted, existed = r.insert([100])
    assert (slot, evicted, existed) == (1, 1, False)
    assert r.lookup([1, 2]) == (-1, 0)
    assert r.lru_order()[0] == 2 and r.lru_order()[-1] == 1
    assert len(r) == 32 and r.check() == ""


def test_remove_merges_nodes_and_keeps_other_paths():
    r = nn.RadixArena(32)
    a, _, _ = r.insert([1, 2, 3, 4])
    b, _, _ = r.insert([1, 2, 3, 5])
    c, _, _ = r.insert([1, 2])
    nodes = r.node_count
    r.remove(a)  # b's edge label may have pointed into a's tokens
    assert r.check() == "" and r.node_count < nodes
    assert r.lookup([1, 2, 3, 5]) == (b, 4)
    r.remove(c)
    r.remove(b)
    assert r.node_count == 1 and len(r) == 0 and r.check() == ""
    with pytest.raises(ValueError, match="empty"):
        r.remove(b)


def test_argument_errors():
    r = nn.RadixArena(4)
    with pytest.raises(ValueError, match="empty token"):
        r.insert([])
    with pytest.raises(ValueError, match="max_tokens"):
        r.insert([1, 2, 3, 4, 5])
    with pytest.raises(IndexError):
        r.touch(32)
    with pytest.raises(ValueError):
        r.value(0)
    with pytest.raises(ValueError):
        nn.RadixArena(0)
    with pytest.raises(ValueError, match="1-D"):
        r.lookup(np.zeros((2, 2), np.int32))
    assert r.lookup(np.array([], np.int32)) == (-1, 0)


token_seq = st.lists(st.integers(0, 3), min_size=1, max_size=12)  # tiny alphabet: lots of shared prefixes


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("insert"), token_seq, st.integers(0, 1000)),
            st.tuples(st.just("lookup"), st.lists(st.integers(0, 3), max_size=14), st.booleans()),
            st.tuples(st.just("remove"), st.integers(0, 31), st.none()),
            st.tuples(st.just("touch"), st.integers(0, 31), st.none()),
        ),
        max_size=120,
    )
)
def test_random_operations_match_the_reference(ops):
    nat, rf = nn.RadixArena(16), ref.RadixRef(max_tokens=16)
    for op, arg, extra in ops:
        if op == "insert":
            assert nat.insert(arg, extra) == rf.insert(arg, extra)
        elif op == "lookup":
            assert nat.lookup(arg, extra) == rf.lookup(arg, extra)
        elif rf.tokens[arg] is None:
            with pytest.raises(ValueError):
                getattr(nat, op)(arg)
        else:
            getattr(nat, op)(arg)
            getattr(rf, op)(arg)
        assert nat.check() == ""
        assert nat.lru_order() == rf.lru_order()
    for s in range(32):
        assert nat.occupied(s) == (rf.tokens[s] is not None)
        if rf.tokens[s] is not None:
            assert nat.tokens(s).tolist() == rf.tokens[s] and nat.value(s) == rf.values[s]


def test_many_evictions_under_a_realistic_workload(rng):
    # warm prefixes: a shared system prompt plus per-conversation suffixes, far more than 32 of them
    nat, rf = nn.RadixArena(512), ref.RadixRef(max_tokens=512)
    system = rng.integers(0, 50000, 200).tolist()
    for i in range(300):
        conv = system + rng.integers(0, 50000, int(rng.integers(1, 200))).tolist()
        q = conv[: int(rng.integers(1, len(conv) + 1))]
        assert nat.lookup(q) == rf.lookup(q)
        assert nat.insert(conv, i) == rf.insert(conv, i)
    assert nat.check() == "" and len(nat) == 32
