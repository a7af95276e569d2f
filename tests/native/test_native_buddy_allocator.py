"""Buddy allocator: layout hardening facts, alloc/free/coalesce parity with the reference, errors,
and multi-thread stress (C++ threads, and Python threads with the GIL released)."""

from __future__ import annotations

import threading

import nexus_native as nn
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nexus_native import reference as ref

MiB = 1 << 20


def test_cache_line_hardening_layout():
    lay = nn.BuddyAllocator.layout()
    # mirrored by static_asserts in buddy.cpp: a build that breaks them does not compile
    assert lay["cache_line"] == 128
    assert lay["alignof"] == 128 and lay["sizeof"] % 128 == 0
    assert lay["mutex_offset"] % 128 == 0 and lay["mutex_line_bytes"] == 128


def test_alloc_rounds_up_to_powers_of_two_and_coalesces_back():
    a = nn.BuddyAllocator(1 * MiB, 4096)
    assert a.free_bytes == MiB and a.largest_free == MiB and a.free_blocks_per_order()[-1] == 1
    x = a.alloc(1)
    y = a.alloc(4097)
    z = a.alloc(100_000)
    assert (a.block_size(x), a.block_size(y), a.block_size(z)) == (4096, 8192, 131072)
    assert x % 4096 == 0 and y % 8192 == 0 and z % 131072 == 0
    assert a.allocations == 3 and a.used_bytes == 4096 + 8192 + 131072
    for off in (y, x, z):
        a.free(off)
    assert a.free_bytes == MiB and a.largest_free == MiB and a.allocations == 0
    assert a.free_blocks_per_order() == [0] * 8 + [1]


def test_exhaustion_returns_none_and_recovers():
    a = nn.BuddyAllocator(64 * 1024, 4096)
    offs = [a.alloc(4096) for _ in range(16)]
    assert sorted(offs) == list(range(0, 65536, 4096))
    assert a.alloc(1) is None and a.free_bytes == 0
    a.free(offs[3])
    assert a.alloc(8192) is None  # only a single 4 KiB hole
    assert a.alloc(4096) == offs[3]
    for o in offs:
        a.free(o)
    assert a.alloc(65536) == 0


def test_invalid_frees_and_sizes_are_value_errors_and_change_nothing():
    a = nn.BuddyAllocator(MiB, 4096)
    x = a.alloc(8192)
    before = a.free_blocks_per_order()
    for bad in (-4096, 123, MiB, x + 4096, 2 * MiB):
        with pytest.raises(ValueError):
            a.free(bad)
    a.free(x)
    with pytest.raises(ValueError, match="double free"):
        a.free(x)
    assert a.free_bytes == MiB and before != a.free_blocks_per_order()
    with pytest.raises(ValueError):
        a.alloc(0)
    with pytest.raises(ValueError, match="exceeds"):
        a.alloc(MiB + 1)
    for args in ((1000, 64), (MiB, 48), (MiB, 32), (4096, 8192)):
        with pytest.raises(ValueError):
            nn.BuddyAllocator(*args)


def test_views_write_into_the_arena_and_are_bounded():
    a = nn.BuddyAllocator(MiB, 4096)
    x, y = a.alloc(5000), a.alloc(100)
    vx, vy = a.view(x), a.view(y, 100)
    assert vx.shape == (8192,) and vy.shape == (100,) and vx.flags.writeable
    vx[:] = 7
    vy[:] = 9
    assert int(a.view(x).sum()) == 7 * 8192 and int(a.view(y).sum()) == 9 * 100
    with pytest.raises(ValueError, match="exceeds"):
        a.view(y, 5000)
    a.free(y)
    with pytest.raises(ValueError):
        a.view(y)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 300_000), st.integers(0, 10**6)), max_size=120))
def test_random_sequences_match_the_reference(ops):
    a, r = nn.BuddyAllocator(MiB, 4096), ref.BuddyRef(MiB, 4096)
    live: list[int] = []
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            got, want = a.alloc(size), r.alloc(size)
            assert got == want
            if got is not None:
                live.append(got)
        else:
            off = live.pop(pick % len(live))
            a.free(off)
            r.free(off)
        assert a.free_blocks_per_order() == r.free_blocks_per_order()
        assert a.free_bytes == r.free_bytes
    for off in live:
        a.free(off)
    assert a.largest_free == MiB


def test_cpp_stress_threads_find_no_overlap_and_everything_coalesces():
    a = nn.BuddyAllocator(8 * MiB, 256)
    assert a.stress(threads=4, iterations=20000, max_size=64 * 1024, seed=1) == 0
    assert a.allocations == 0 and a.free_bytes == 8 * MiB and a.largest_free == 8 * MiB


def test_python_threads_contend_without_the_gil():
    a = nn.BuddyAllocator(4 * MiB, 256)
    errors: list[str] = []

    def worker(tag: int) -> None:
        rng = np.random.default_rng(tag)
        mine: list[tuple[int, int]] = []
        for _ in range(3000):
            if mine and rng.random() < 0.5:
                off, size = mine.pop(int(rng.integers(len(mine))))
                if not np.all(a.view(off, size) == tag):
                    errors.append(f"thread {tag}: block {off} overwritten")
                a.free(off)
            else:
                size = int(rng.integers(1, 16384))
                off = a.alloc(size)
                if off is not None:
                    a.view(off, size)[:] = tag
                    mine.append((off, size))
        for off, _ in mine:
            a.free(off)

    threads = [threading.Thread(target=worker, args=(t + 1,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert a.allocations == 0 and a.largest_free == 4 * MiB


def test_stress_argument_checks():
    a = nn.BuddyAllocator(MiB, 4096)
    with pytest.raises(ValueError):
        a.stress(threads=0)
    with pytest.raises(ValueError):
        a.stress(max_size=2 * MiB)
