"""Bounded fuzzing of the native parsers of untrusted bytes (``.atb`` reader, llama.cpp state-blob parser)
on every ``make test``: hypothesis-driven structure-aware mutants (deterministic: ``derandomize``) and a
short outcome-guided mutation run. ``make fuzz`` runs the same fuzzer for minutes against an ASan + UBSan
build (tests/fuzz/fuzz_native.py, bench/reliability.py fuzz)."""

from __future__ import annotations

import random

import nexus_native as nn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.fuzz_native import fuzz, mutate, seeds, target_atb, target_state

SPEC, ATB, STATE = seeds(nn)
RUN_ATB, RUN_STATE = target_atb(nn, SPEC), target_state(nn, SPEC)


def test_seeds_are_accepted():
    # The corpus must parse, or the mutants below would only ever exercise the first check.
    assert all(RUN_ATB(b) is None for b in ATB)
    assert all(RUN_STATE(b) is None for b in STATE)


@settings(max_examples=1500, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, len(ATB) - 1))
def test_atb_reader_accepts_or_raises_atb_error(seed, which):
    RUN_ATB(mutate(random.Random(seed), ATB[which], ATB, "atb"))


@settings(max_examples=1500, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, len(STATE) - 1))
def test_state_blob_parser_accepts_or_raises_state_blob_error(seed, which):
    RUN_STATE(mutate(random.Random(seed), STATE[which], STATE, "state"))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes(buf):
    RUN_ATB(buf)
    RUN_STATE(buf)
    RUN_ATB(ATB[0][:128] + buf)  # a valid header followed by junk
    RUN_STATE(STATE[0][:16] + buf)


@pytest.mark.parametrize("seed", [0, 1])
def test_short_guided_run_reaches_both_outcomes(seed):
    res = fuzz(seconds=4, seed=seed, nn=nn)
    assert res["crashes"] == 0 and res["execs"] > 1000
    for name, t in res["targets"].items():
        # Mutants that still parse (accepted) and many distinct rejection reasons: the fuzzer gets past
        # the first checks instead of bouncing off the magic number.
        assert t["accepted"] > 0, name
        assert t["distinct_errors"] >= 10, name
