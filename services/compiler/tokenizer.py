"""Tokenizer of the engine model, loaded vocabulary-only (no weights) to count signature tokens."""

from __future__ import annotations

from collections.abc import Callable

from services.common.models import resolve_gguf


def load_tokenizer(model_path: str = "") -> Callable[[str], list[int]]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(resolve_gguf(model_path)), vocab_only=True, verbose=False)

    def tokenize(text: str) -> list[int]:
        return llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    tokenize.llm = llm  # keep the vocab alive as long as the function
    return tokenize
