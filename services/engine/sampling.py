"""Greedy sampling under a tool's grammar: llguidance's matcher on the compiler's grammar (services/compiler/grammar.py,
compiled from the tool's JSON Schema).

Like llama.cpp's ``common_sampler``, we first take the unconstrained argmax and ask the grammar about that one
token (a few µs); only when the grammar rejects it do we compute the whole-vocabulary mask (~0.1 ms on Qwen2.5's
151,936 tokens, bench/grammar.py). The result is the token a mask-then-greedy chain would pick (first maximum
among the grammar-legal tokens)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from services.common.errors import InvalidArgument


class GrammarError(InvalidArgument):
    """The grammar does not compile for this vocabulary (llguidance's matcher is in error)."""


class Vocabulary:
    """llguidance's tokenizer for one llama.cpp vocabulary, built once (~0.2 s for SmolLM2), with every
    end-of-generation token as its end of sequence (any of them ends the arguments once the grammar is complete)."""

    def __init__(self, llama_cpp: Any, vocab: Any, n_vocab: int):
        from llguidance.llamacpp import lltokenizer_from_vocab

        self.n_vocab = n_vocab
        self.eog = frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t))
        with warnings.catch_warnings():  # it reads each token's attributes by a name llama_cpp deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = lltokenizer_from_vocab(vocab, n_vocab=n_vocab, eos_token=sorted(self.eog))


class GrammarSampler:
    """One turn's grammar state. ``pick`` then ``accept`` per token; ``pick`` returns -1 when nothing is allowed and
    an end-of-generation token only where the grammar is complete."""

    def __init__(self, vocabulary: Vocabulary, grammar: str):
        from llguidance import LLMatcher

        self._m = LLMatcher(vocabulary.tokenizer, grammar, log_level=0)
        if self._m.is_error():
            raise GrammarError(f"the grammar does not compile: {self._m.get_error()}")
        self._eog, self._n = vocabulary.eog, vocabulary.n_vocab
        self._bits = np.zeros((vocabulary.n_vocab + 31) // 32, dtype=np.int32)
        self._out = np.empty(vocabulary.n_vocab, dtype=np.float32)
        self.full_scans = 0  # how often the fast path missed (for profiling)

    def allows(self, token: int) -> bool:
        """Whether the grammar allows ``token`` now (an end-of-generation token: whether the grammar is complete)."""
        if token in self._eog:
            return self._m.is_accepting()
        return self._m.validate_tokens([token]) == 1

    def masked(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with -inf wherever the grammar forbids the token now (a buffer the next call overwrites)."""
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self._n).astype(bool)
        np.copyto(self._out, logits)
        self._out[~allowed] = -np.inf
        return self._out

    def pick(self, logits: np.ndarray) -> int:
        """The first maximum of ``logits`` among the tokens the grammar allows now; -1 if none is allowed."""
        cand = int(np.argmax(logits))
        if self.allows(cand):
            return cand
        self.full_scans += 1
        masked = self.masked(logits)
        best = int(np.argmax(masked))
        return best if np.isfinite(masked[best]) else -1

    def accept(self, token: int) -> None:
        """Advance the grammar over ``token`` (only tokens ``pick`` allowed: a refusal would leave nothing allowed)."""
        self._m.consume_token(token)
