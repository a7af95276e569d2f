"""Nexus native core (pybind11 extension ``nexus_native._core``).

Kernels
    * ``Int8Index`` - INT8 semantic lookaside buffer, SIMD scan (AVX-512-VNNI / AVX2 / NEON / scalar).
    * ``AtbBlock`` - the .atb (Aeon Tool Block) codec, llama.cpp sequence-state conversion
      (``from_state`` / ``to_state``) and RoPE reanchoring (``reanchor``, ``rope_reanchor``).
    * ``BuddyAllocator`` - power-of-two block allocator for the in-memory block cache.
    * ``RadixArena`` - L0 exact-token longest-prefix arena, 32 slots, LRU.

Errors (all ``ValueError`` subclasses, so a bad input never passes silently)::

    ValueError
    ├── AtbError            malformed / unsupported .atb data
    │   └── AtbMismatchError  well-formed block compiled for another model or RoPE regime
    └── StateBlobError      malformed / unsupported llama.cpp state blob

Every kernel has a numpy reference in ``nexus_native.reference``; llama.cpp glue (model spec, model
fingerprint, token hash) lives in ``nexus_native.llama`` and imports llama_cpp only when called.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from ._core import (
    ATB_COMPACT_ALIGN_LOG2,
    ATB_HEADER_SIZE,
    ATB_PAGE_ALIGN_LOG2,
    ATB_VERSION,
    AtbBlock,
    AtbError,
    AtbMismatchError,
    BuddyAllocator,
    Int8Index,
    ModelSpec,
    RadixArena,
    RopeType,
    StateBlobError,
    VLayout,
    __version__,
    available_isas,
    crc32,
    isa,
    memory_read_sum,
    quantize_int8,
    read_atb_header,
    rope_cache,
    rope_reanchor,
    state_info,
)


def token_hash(tokens: Iterable[int] | np.ndarray) -> int:
    """64-bit hash of a token sequence (BLAKE2b-64 over int32 little-endian ids), as stored in .atb headers."""
    arr = np.ascontiguousarray(
        np.asarray(list(tokens) if not isinstance(tokens, np.ndarray) else tokens), "<i4"
    )
    return int.from_bytes(hashlib.blake2b(arr.tobytes(), digest_size=8).digest(), "little")


__all__ = [
    "ATB_COMPACT_ALIGN_LOG2",
    "ATB_HEADER_SIZE",
    "ATB_PAGE_ALIGN_LOG2",
    "ATB_VERSION",
    "AtbBlock",
    "AtbError",
    "AtbMismatchError",
    "BuddyAllocator",
    "Int8Index",
    "ModelSpec",
    "RadixArena",
    "RopeType",
    "StateBlobError",
    "VLayout",
    "__version__",
    "available_isas",
    "crc32",
    "isa",
    "memory_read_sum",
    "quantize_int8",
    "read_atb_header",
    "rope_cache",
    "rope_reanchor",
    "state_info",
    "token_hash",
]
