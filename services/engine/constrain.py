"""Tool-name selection constrained to the registry: a logit mask over a trie of tool-name tokens.

When the model itself must emit a tool name (the concatenate-all-schemas baseline, or a model-side
choice among the router's top-k), every step may only pick a token that continues some registered
name, so the output is always a real tool. Greedy over the masked logits; once the prefix is unique
the rest of the name is implied and no further decode is spent on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

_END = -1


class TokenTrie:
    """Trie over token sequences; ``_END`` marks where a complete name ends."""

    def __init__(self, names: Sequence[str], tokenize: Callable[[str], list[int]]):
        if not names:
            raise ValueError("no names to choose from")
        self.root: dict = {}
        for name in names:
            toks = tokenize(name)
            if not toks:
                raise ValueError(f"name {name!r} tokenizes to nothing")
            node = self.root
            for t in toks:
                node = node.setdefault(t, {})
            node[_END] = name

    @staticmethod
    def names_under(node: dict) -> list[str]:
        out, stack = [], [node]
        while stack:
            n = stack.pop()
            for k, v in n.items():
                if k == _END:
                    out.append(v)
                else:
                    stack.append(v)
        return out


def choose_constrained(trie: TokenTrie, next_logits: Callable[[list[int]], np.ndarray]) -> tuple[str, int]:
    """Greedy decode of one name from ``trie``. ``next_logits(chosen_so_far)`` returns the logits for
    the next token after the chosen tokens. Returns (name, number of decode steps spent)."""
    node, chosen, steps = trie.root, [], 0
    while True:
        under = TokenTrie.names_under(node)
        if len(under) == 1:
            return under[0], steps  # unique continuation: implied, no decode needed
        options = [k for k in node if k != _END]
        logits = next_logits(chosen)
        steps += 1
        best_tok = max(options, key=lambda t: float(logits[t])) if options else None
        # A complete name competes with its continuations: the end-of-name score is the best logit of a
        # token that cannot continue any name (the model "stopping" here).
        if _END in node:
            mask = np.ones(logits.shape[0], dtype=bool)
            mask[options] = False
            stop_score = float(logits[mask].max()) if mask.any() else -np.inf
            if best_tok is None or stop_score > float(logits[best_tok]):
                return node[_END], steps
        node = node[best_tok]
        chosen.append(best_tok)


class LlamaNameChooser:
    """``choose_constrained`` on the engine's live llama.cpp sequence: prefills the prompt, then decodes."""

    def __init__(self, engine):
        self.engine = engine

    def choose(self, prompt_tokens: list[int], names: Sequence[str]) -> tuple[str, int]:
        eng = self.engine
        llm = eng.llm
        trie = TokenTrie(names, lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False, special=False))
        with eng.lock:
            eng.forget_live()
            sc = eng.sc
            sc.decode(list(prompt_tokens), 0)
            pos = len(prompt_tokens)

            def next_logits(chosen: list[int]) -> np.ndarray:
                nonlocal pos
                if chosen:
                    sc.decode(chosen[-1:], pos)
                    pos += 1
                return sc.logits()

            try:
                return choose_constrained(trie, next_logits)
            finally:
                eng.forget_live()
