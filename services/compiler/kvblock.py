"""Compiled KV blocks (``.atb``): a tool's signature decoded by the engine model right after the engine's
constant prompt head, so the engine can splice it instead of prefilling it (issue 5, path A).

Both sides build the prompt with the same ``PromptLayout``: the compiler decodes ``head + view`` (head =
the engine's system prompt, worked example and the user turn up to "Function:"; view = the signature) and
keeps only the view's cells, anchored at m0 = len(head). The store key covers everything the K/V depend on:
the model file, the head's tokens and the IR version, so a changed prompt or model never reuses a stale block.

Since the key covers the model, an engine on another GGUF than the compiler's would only ever miss (text prefill for
every tool, silently). So the compiler announces its ``BlockModel`` in the store at start-up (``KV_MODEL_KEY``) and the
engine compares it with its own (``model_mismatch``) at start-up and on a block miss, and logs both fingerprints.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from services.common.errors import ArtifactNotFound, DataCorruption, ResourceExhausted
from services.common.store import Store, artifact_key
from services.common.tools import Tool
from services.compiler.signature import IR_VERSION
from services.runtime.prompt import ChatTemplate, Turn, split_prompt

KIND_KV_BLOCK = "atb"
PRELUDE_SEQ = 2  # the compile context keeps the prelude decoded here
# .atb planes are 2 MiB-aligned on disk (sparse files); objects in the store use this compact alignment.
STORE_ALIGN_LOG2 = 6
# The store object naming the model the compiler's blocks are for (its last start-up's; one compiler model per store)
KV_MODEL_KEY = "atb-model"


@dataclass(frozen=True)
class PromptSegments:
    head: list[int]
    view: list[int]
    tail: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.head + self.view + self.tail


class PromptLayout:
    """The engine's prompt, tokenized as head | view | tail with the model's own chat template."""

    def __init__(self, template: ChatTemplate, tokenize: Callable[[str, bool], list[int]]):
        """``tokenize(text, add_bos)`` must parse special tokens (chat markers)."""
        self.template = template
        self.tokenize = tokenize

    def segments(self, view: str, query: str, window: Sequence[Turn]) -> PromptSegments:
        pt = split_prompt(self.template, view, query, window)
        add_bos = not (self.template.bos and pt.head.startswith(self.template.bos))
        return PromptSegments(self.tokenize(pt.head, add_bos), self.tokenize(pt.view, False),
                              self.tokenize(pt.tail, False))

    def prelude(self) -> list[int]:
        """The head of every prompt without conversation history: the block's compile context."""
        return self.segments("x", "", []).head


def kv_fingerprint(model_fingerprint: str, prelude: Sequence[int]) -> str:
    h = hashlib.sha256(f"{model_fingerprint}:{IR_VERSION}:".encode())
    h.update(",".join(map(str, prelude)).encode())
    return h.hexdigest()


def kv_block_key(tool: Tool, model_fingerprint: str, prelude: Sequence[int]) -> str:
    return artifact_key(KIND_KV_BLOCK, kv_fingerprint(model_fingerprint, prelude), tool.schema_hash)


@dataclass(frozen=True)
class BlockModel:
    """What a service's KV blocks are for: the compiler's are compiled for it, the engine's must match it."""

    model: str  # SHA-256 of the GGUF's bytes (services.common.models.file_fingerprint)
    kv: str  # kv_fingerprint: the model, the prompt head's tokens and the IR version (the blocks' store keys)
    path: str  # the GGUF on that service's host (for the message: the fingerprints say whether, the paths which)


def announce_model(store: Store, model: BlockModel) -> None:
    """Record in the store the model this compiler compiles KV blocks for (at its start-up)."""
    store.put(KV_MODEL_KEY, json.dumps(asdict(model)).encode(), {"model": model.model, "kv": model.kv})


def announced_model(store: Store) -> BlockModel | None:
    """The model the compiler announced in ``store``; None while no compiler with KV blocks has started on it."""
    try:
        doc = json.loads(store.get(KV_MODEL_KEY))
    except ArtifactNotFound:
        return None
    except ValueError as e:
        raise DataCorruption(f"{KV_MODEL_KEY} in the store is not JSON: {e}") from e
    return BlockModel(str(doc.get("model", "")), str(doc.get("kv", "")), str(doc.get("path", "")))


def model_mismatch(engine: BlockModel, compiler: BlockModel) -> str | None:
    """Why none of the compiler's KV blocks can splice into this engine, naming both sides; None when they can."""
    if engine.model != compiler.model:
        return (f"the compiler compiles KV blocks for model {compiler.model} ({compiler.path}) but the engine runs "
                f"model {engine.model} ({engine.path}): none of its blocks can splice (tools take the text prefill); "
                "start both on the same GGUF (model_path)")
    if engine.kv != compiler.kv:
        return (f"the compiler and the engine run the same model {engine.model} ({engine.path}) with another "
                f"prompt head or IR version (KV fingerprints: compiler {compiler.kv}, engine {engine.kv}): no block "
                "will splice; run the same Nexus version on both")
    return None


class BlockCompiler:
    """Compiles signatures into .atb blocks on its own llama.cpp context (``SpliceContext``).

    The context holds nothing else while compiling, so a block is bit-identical to the K/V a text prefill of
    the same head + view computes on a fresh context (tested)."""

    def __init__(self, model_path: str = "", *, n_ctx: int = 2048, n_threads: int = 1):
        from llama_cpp import Llama

        from services.common.models import file_fingerprint, resolve_gguf
        from services.runtime.splice import SpliceContext

        self.model_path = str(resolve_gguf(model_path))
        self.model_fingerprint = file_fingerprint(self.model_path)
        self.sc = SpliceContext(self.model_path, n_ctx=n_ctx, n_threads=n_threads, n_seq_max=3)
        vocab = Llama(model_path=self.model_path, vocab_only=True, verbose=False)
        self._vocab = vocab
        self.layout = layout_for(vocab)
        self.prelude = self.layout.prelude()
        self.fingerprint = kv_fingerprint(self.model_fingerprint, self.prelude)
        self._lock = threading.Lock()

    def key(self, tool: Tool) -> str:
        return artifact_key(KIND_KV_BLOCK, self.fingerprint, tool.schema_hash)

    @property
    def model(self) -> BlockModel:
        return BlockModel(self.model_fingerprint, self.fingerprint, self.model_path)

    def compile(self, signature: str) -> tuple[bytes, dict[str, Any]]:
        view = self.layout.segments(signature, "", []).view
        if len(self.prelude) + len(view) > self.sc.n_ctx:
            raise ResourceExhausted(f"signature of {len(view)} tokens does not fit the compile context "
                                    f"({self.sc.n_ctx} positions)")
        with self._lock:
            block = self.sc.compile_block(self.prelude, view, prelude_seq=PRELUDE_SEQ)
        data = block.to_bytes(STORE_ALIGN_LOG2)
        meta = {"tokens": len(view), "anchor": len(self.prelude), "token_hash": int(block.token_hash),
                "model": self.model_fingerprint, "kv": self.fingerprint}
        return data, meta

    def close(self) -> None:
        self.sc.close()


def layout_for(llm: Any) -> PromptLayout:
    """The prompt layout of a llama-cpp-python ``Llama`` (vocab-only is enough)."""

    def piece(tok: int) -> str:
        return "" if tok < 0 else llm.detokenize([tok], special=True).decode("utf-8", errors="ignore")

    meta = llm.metadata or {}
    template = ChatTemplate(meta.get("tokenizer.chat_template"), bos=piece(llm.token_bos()),
                            eos=piece(llm.token_eos()))

    def tokenize(text: str, add_bos: bool) -> list[int]:
        return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    return PromptLayout(template, tokenize)
