"""Greedy sampling under a tool's grammar: llama.cpp's GBNF sampler (``GrammarSampler``, the compiler's grammar) or
llguidance on the tool's JSON Schema (``LLGuidanceSampler``), behind one interface (``ConstrainedSampler``).

llama.cpp's grammar sampler checks every vocabulary entry against the grammar stacks (~49k for SmolLM2);
doing that for every generated token dominates a small model's decode. Like llama.cpp's own
``common_sampler``, we first take the unconstrained argmax and ask the grammar about that one token; only when
the grammar rejects it do we filter the whole vocabulary. The result is the same token a grammar-then-greedy
chain would pick (first maximum among the grammar-legal tokens). llguidance computes the whole mask in ~0.1 ms
(bench/grammar.py), its one-token check in a few µs: the same fast path serves both."""

from __future__ import annotations

import ctypes
import warnings
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument

# llama_token_data {int32 id; float logit; float p;}
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class GrammarError(InvalidArgument):
    """The grammar does not compile (llama.cpp returned no sampler, llguidance's matcher is in error)."""


class ConstrainedSampler(ABC):
    """Greedy choice restricted to what a grammar allows next. ``pick`` then ``accept`` per token, ``close`` at the
    end. ``pick`` returns -1 when nothing is allowed; an end-of-generation token only where the grammar is
    complete."""

    full_scans = 0  # how often the fast path missed (for profiling)

    @abstractmethod
    def allows(self, token: int, logit: float = 0.0) -> bool:
        """Whether the grammar allows ``token`` now (the fast path's one-token check)."""

    @abstractmethod
    def masked(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with -inf wherever the grammar forbids the token now: the whole-vocabulary scan (a buffer
        overwritten by the next call)."""

    @abstractmethod
    def accept(self, token: int) -> None:
        """Advance the grammar over ``token`` (one ``pick`` returned)."""

    @abstractmethod
    def close(self) -> None:
        """Free the native state (the turn is over)."""

    def pick(self, logits: np.ndarray) -> int:
        """The first maximum of ``logits`` among the tokens the grammar allows now; -1 if none is allowed."""
        cand = int(np.argmax(logits))
        if self.allows(cand, float(logits[cand])):
            return cand
        self.full_scans += 1
        masked = self.masked(logits)
        best = int(np.argmax(masked))
        return best if np.isfinite(masked[best]) else -1


class GrammarSampler(ConstrainedSampler):
    """llama.cpp's grammar sampler on a GBNF grammar (the compiler's, from the store)."""

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

    def masked(self, logits: np.ndarray) -> np.ndarray:
        self._all["logit"] = logits
        self._arr_all.size, self._arr_all.selected, self._arr_all.sorted = len(self._all), -1, False
        self._ll.llama_sampler_apply(self._smpl, ctypes.byref(self._arr_all))
        return self._all["logit"]

    def accept(self, token: int) -> None:
        self._ll.llama_sampler_accept(self._smpl, token)


class LLGuidance:
    """llguidance for one vocabulary: its tokenizer, built once from the llama.cpp vocab (~0.2 s for SmolLM2), with
    every end-of-generation token as its end of sequence (llama.cpp's grammar sampler allows any of them once the
    grammar is complete)."""

    def __init__(self, llama_cpp: Any, vocab: Any, n_vocab: int):
        from llguidance.llamacpp import lltokenizer_from_vocab

        self.n_vocab = n_vocab
        self.eog = frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        with warnings.catch_warnings():  # it reads each token's attributes by a name llama_cpp deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = lltokenizer_from_vocab(vocab, n_vocab=n_vocab, eos_token=sorted(self.eog))


def schema_grammar(schema: dict) -> str:
    """llguidance's grammar for a JSON Schema, written as the compiler's GBNF writes JSON: at most one space where
    JSON allows whitespace, none after the object. Not checked here: ``LLGuidanceSampler`` raises GrammarError."""
    from llguidance import LLMatcher

    return LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_pattern": " "})


class LLGuidanceSampler(ConstrainedSampler):
    """llguidance's matcher on a grammar (``schema_grammar``): one-token check ``validate_tokens`` (an
    end-of-generation token: whether the grammar is complete), whole mask as a bitmask."""

    def __init__(self, ll: LLGuidance, grammar: str):
        from llguidance import LLMatcher

        self._m = LLMatcher(ll.tokenizer, grammar, log_level=0)
        if self._m.is_error():
            raise GrammarError(f"llguidance cannot compile the grammar: {self._m.get_error()}")
        self._eog, self._n = ll.eog, ll.n_vocab
        self._bits = np.zeros((ll.n_vocab + 31) // 32, dtype=np.int32)
        self._out = np.empty(ll.n_vocab, dtype=np.float32)

    def allows(self, token: int, logit: float = 0.0) -> bool:
        if token in self._eog:
            return self._m.is_accepting()
        return self._m.validate_tokens([token]) == 1

    def masked(self, logits: np.ndarray) -> np.ndarray:
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self._n).astype(bool)
        np.copyto(self._out, logits)
        self._out[~allowed] = -np.inf
        return self._out

    def accept(self, token: int) -> None:
        self._m.consume_token(token)  # only tokens ``pick`` allowed: a refusal would leave nothing allowed next

    def close(self) -> None:
        """Nothing to free by hand: llguidance releases the matcher with its last reference."""
