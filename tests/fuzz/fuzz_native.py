"""Mutation fuzzer for the two parsers of untrusted bytes in nexus_native: the ``.atb`` reader
(``read_atb_header``, ``AtbBlock.from_bytes``) and the llama.cpp state-blob parser (``state_info``,
``AtbBlock.from_state``).

A parser may only accept an input or raise its own error (``AtbError`` / ``StateBlobError``); any other
exception is a bug, and a crash or a sanitizer report kills the process. An accepted input must survive
a round trip (encode -> decode). Mutations are structure-aware (header fields set to boundary values,
the header CRC re-signed so the deeper checks run, truncation, extension, splicing, crossover) and
guided by outcomes: an input that ends in a parser error message not seen before joins the corpus.
No native coverage feedback: atheris needs a clang ``-fsanitize=fuzzer-no-link`` build of the module,
and this machine has gcc only (see README "Reliability").

Used two ways: the bounded hypothesis tests in tests/fuzz import the corpus and the mutators, and
``make fuzz`` runs this file as a script against the ASan + UBSan build of the module::

    python tests/fuzz/fuzz_native.py --seconds 300 --seed 1 --json build/fuzz/fuzz.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import struct
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

INTERESTING_32 = [0, 1, 2, 3, 7, 8, 63, 64, 127, 128, 255, 256, 4095, 4096, 65535, 65536, 2**31 - 1, 2**31,
                  2**32 - 1, 2**32 - 2]
INTERESTING_64 = [*INTERESTING_32, 2**63 - 1, 2**63, 2**64 - 1, 2**64 - 64, 2**40]


def make_spec(nn, n_layer: int = 2):
    return nn.ModelSpec(fingerprint=bytes(range(16)), n_layer=n_layer, n_head_kv=2, head_dim=64,
                        rope_type=nn.RopeType.NORM, freq_base=100000.0, freq_scale=1.0, n_ctx_orig=8192)


def seeds(nn) -> tuple[object, list[bytes], list[bytes]]:
    """The spec and a small corpus of valid ``.atb`` files and state blobs (both V layouts, several sizes)."""
    from nexus_native import reference as ref

    rng = np.random.default_rng(7)
    spec = make_spec(nn)
    atb, state = [], []
    for n_tokens, transposed, align in ((1, False, 6), (3, True, 6), (5, False, 12)):
        e = spec.n_embd
        k = rng.standard_normal((spec.n_layer, n_tokens, e)).astype(np.float16)
        vshape = (spec.n_layer, e, n_tokens) if transposed else (spec.n_layer, n_tokens, e)
        v = rng.standard_normal(vshape).astype(np.float16)
        layout = nn.VLayout.TRANSPOSED if transposed else nn.VLayout.ROWS
        block = nn.AtbBlock(spec, k, v, 3, token_hash=0xABCDEF, v_layout=layout)
        atb.append(block.to_bytes(align))
        state.append(bytes(block.to_state(10, v_trans=transposed)))
        state.append(bytes(ref.state_from_atb(k, v, int(transposed), 0, v_trans=not transposed, n_stream=2)))
    return spec, atb, state


def resign_atb_header(b: bytearray) -> None:
    if len(b) >= 128:
        struct.pack_into("<I", b, 124, zlib.crc32(bytes(b[:124])))


def mutate(rnd: random.Random, data: bytes, corpus: list[bytes], kind: str) -> bytes:
    """One to four stacked mutations of ``data``."""
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(9)
        n = len(b)
        if op == 0 and n:  # bit flips
            for _ in range(rnd.randint(1, 8)):
                i = rnd.randrange(n)
                b[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and n:  # interesting bytes
            i = rnd.randrange(n)
            b[i] = rnd.choice((0, 1, 0x7F, 0x80, 0xFF))
        elif op == 2 and n >= 4:  # a 32-bit field, biased to the header
            i = rnd.randrange(0, min(n - 3, 160)) & ~3 if rnd.random() < 0.8 else rnd.randrange(n - 3)
            struct.pack_into("<I", b, i, rnd.choice(INTERESTING_32) & 0xFFFFFFFF)
        elif op == 3 and n >= 8:  # a 64-bit field
            i = rnd.randrange(0, min(n - 7, 160)) & ~7 if rnd.random() < 0.8 else rnd.randrange(n - 7)
            struct.pack_into("<Q", b, i, rnd.choice(INTERESTING_64) & 0xFFFFFFFFFFFFFFFF)
        elif op == 4:  # truncate
            del b[rnd.randint(0, n):]
        elif op == 5:  # extend
            b += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 64))) if rnd.random() < 0.5 \
                else bytes(rnd.randint(1, 4096))
        elif op == 6 and n:  # delete or duplicate a chunk
            i = rnd.randrange(n)
            j = min(n, i + rnd.randint(1, 256))
            if rnd.random() < 0.5:
                del b[i:j]
            else:
                b[i:i] = b[i:j]
        elif op == 7 and corpus:  # crossover
            other = rnd.choice(corpus)
            cut = rnd.randint(0, min(n, len(other)))
            b = b[:cut] + bytearray(other[cut:])
        elif op == 8 and n:  # random bytes over a span
            i = rnd.randrange(n)
            for k in range(i, min(n, i + rnd.randint(1, 16))):
                b[k] = rnd.randrange(256)
    if kind == "atb" and rnd.random() < 0.7:
        resign_atb_header(b)  # most mutants get a valid header CRC, so the field checks behind it run
    return bytes(b)


@dataclass
class Outcome:
    accepted: int = 0
    rejected: int = 0
    messages: set[str] = field(default_factory=set)


def _norm(msg: str) -> str:
    return re.sub(r"0x[0-9a-fA-F]+|\d+", "N", msg)[:120]


def target_atb(nn, spec) -> Callable[[bytes], str | None]:
    """Parse untrusted ``.atb`` bytes; returns the normalised rejection message, or None when accepted."""
    def run(buf: bytes) -> str | None:
        try:
            nn.read_atb_header(buf)
        except nn.AtbError as e:
            msg = "hdr:" + _norm(str(e))
        else:
            msg = None
        try:
            block = nn.AtbBlock.from_bytes(buf, spec)
        except nn.AtbError as e:
            return _norm(str(e)) if msg is None else msg + "|" + _norm(str(e))
        again = nn.AtbBlock.from_bytes(block.to_bytes(nn.ATB_COMPACT_ALIGN_LOG2), spec)  # round trip
        assert again.n_tokens == block.n_tokens and again.k.tobytes() == block.k.tobytes()
        return None
    return run


def target_state(nn, spec) -> Callable[[bytes], str | None]:
    """Parse an untrusted llama.cpp state blob; None when accepted."""
    def run(buf: bytes) -> str | None:
        try:
            nn.state_info(buf)
        except nn.StateBlobError as e:
            info_msg = "info:" + _norm(str(e))
        else:
            info_msg = None
        try:
            block = nn.AtbBlock.from_state(buf, spec)
        except nn.StateBlobError as e:
            return _norm(str(e)) if info_msg is None else info_msg + "|" + _norm(str(e))
        again = nn.AtbBlock.from_state(block.to_state(0, reanchor=False), spec)  # round trip, K bit for bit
        assert again.n_tokens == block.n_tokens and again.k.tobytes() == block.k.tobytes()
        return None
    return run


def fuzz(seconds: float, seed: int, *, max_execs: int | None = None, progress: Callable[[dict], None] | None = None,
         nn=None) -> dict:
    """Run both targets alternately for ``seconds`` (or ``max_execs``); returns the statistics.
    A Python exception other than the parser's own error propagates (it is a finding)."""
    if nn is None:
        import nexus_native as nn
    spec, atb_seeds, state_seeds = seeds(nn)
    rnd = random.Random(seed)
    targets = {"atb": (target_atb(nn, spec), list(atb_seeds)), "state": (target_state(nn, spec), list(state_seeds))}
    stats = {k: Outcome() for k in targets}
    execs, t0, last = 0, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < seconds and (max_execs is None or execs < max_execs):
        kind = "atb" if execs % 2 == 0 else "state"
        run, corpus = targets[kind]
        buf = mutate(rnd, rnd.choice(corpus), corpus, kind)
        msg = run(buf)
        execs += 1
        st = stats[kind]
        if msg is None:
            st.accepted += 1
        else:
            st.rejected += 1
            if msg not in st.messages and len(corpus) < 2000:
                st.messages.add(msg)
                corpus.append(buf)  # a new way to fail: keep it as a parent
        if progress is not None and time.monotonic() - last > 10:
            last = time.monotonic()
            progress({"execs": execs, "elapsed_s": round(last - t0, 1)})
    elapsed = time.monotonic() - t0
    return {
        "execs": execs, "elapsed_s": round(elapsed, 1), "execs_per_s": round(execs / max(elapsed, 1e-9), 1),
        "seed": seed, "crashes": 0, "unexpected_exceptions": 0,
        "targets": {k: {"accepted": s.accepted, "rejected": s.rejected, "distinct_errors": len(s.messages),
                        "corpus": len(targets[k][1])} for k, s in stats.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the statistics here")
    args = p.parse_args(argv)
    import nexus_native as nn

    print(f"fuzzing {nn.__file__} for {args.seconds:.0f} s (seed {args.seed})", file=sys.stderr, flush=True)
    res = fuzz(args.seconds, args.seed, progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True), nn=nn)
    res["module"] = nn.__file__
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
