"""Greedy sampling under a GBNF grammar on a low-level llama.cpp context.

llama.cpp's grammar sampler checks every vocabulary entry against the grammar stacks (~49k for SmolLM2);
doing that for every generated token dominates a small model's decode. Like llama.cpp's own
``common_sampler``, we first take the unconstrained argmax and ask the grammar about that one token; only when
the grammar rejects it do we filter the whole vocabulary. The result is the same token a grammar-then-greedy
chain would pick (first maximum among the grammar-legal tokens)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument

# llama_token_data {int32 id; float logit; float p;}
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class GrammarError(InvalidArgument):
    """The grammar text did not parse (llama.cpp returned no sampler)."""


class GrammarSampler:
    """Greedy choice restricted to what a GBNF grammar allows next. ``pick`` then ``accept`` per token."""

    def __init__(self, llama_cpp: Any, vocab: Any, grammar: str, n_vocab: int, root: str = "root"):
        self._ll = llama_cpp
        self._smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), root.encode("utf-8"))
        if not self._smpl:
            raise GrammarError("the tool's grammar does not parse")
        assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)
        self._all = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._all["id"] = np.arange(n_vocab, dtype=np.int32)
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        ptr = llama_cpp.llama_token_data_p
        self._arr_all = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._all.ctypes.data, ptr), size=n_vocab, selected=-1, sorted=False)
        self._arr_one = llama_cpp.llama_token_data_array(
            data=ctypes.cast(self._one.ctypes.data, ptr), size=1, selected=-1, sorted=False)
        self.full_scans = 0  # how often the fast path missed (for profiling)

    def close(self) -> None:
        if self._smpl:
            self._ll.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:  # pragma: no cover - safety net; callers close()
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def allows(self, token: int, logit: float = 0.0) -> bool:
        self._one["id"][0], self._one["logit"][0] = token, logit
        self._arr_one.size, self._arr_one.selected, self._arr_one.sorted = 1, -1, False
        self._ll.llama_sampler_apply(self._smpl, ctypes.byref(self._arr_one))
        return bool(np.isfinite(self._one["logit"][0]))

    def pick(self, logits: np.ndarray) -> int:
        """The first maximum of ``logits`` among the tokens the grammar allows now; -1 if none is allowed."""
        cand = int(np.argmax(logits))
        if self.allows(cand, float(logits[cand])):
            return cand
        self.full_scans += 1
        masked = self.masked(logits)
        best = int(np.argmax(masked))
        return best if np.isfinite(masked[best]) else -1

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with -inf wherever the grammar forbids the token now: the whole-vocabulary scan (a view,
        overwritten by the next call)."""
        self._all["logit"] = logits
        self._arr_all.size, self._arr_all.selected, self._arr_all.sorted = len(self._all), -1, False
        self._ll.llama_sampler_apply(self._smpl, ctypes.byref(self._arr_all))
        return self._all["logit"]

    def accept(self, token: int) -> None:
        self._ll.llama_sampler_accept(self._smpl, token)
