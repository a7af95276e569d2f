"""Domain logic of the compiler: one tool in, its artifacts in the store out. No protobuf here."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field

import numpy as np

from services.common.errors import ResourceExhausted
from services.common.store import ObjectInfo, Store, artifact_key
from services.common.tools import Tool
from services.compiler.grammar import compile_grammar
from services.compiler.signature import IR_VERSION, signature

log = logging.getLogger("nexus.compiler")

# Artifact kinds (the first part of every artifact key).
KIND_SIGNATURE = "sig"
KIND_GRAMMAR = "gbnf"
KIND_EMBEDDING = "emb"
KIND_KV_BLOCK = "atb"  # made by services.compiler.kvblock.BlockCompiler

IR_FINGERPRINT = hashlib.sha256(IR_VERSION.encode()).hexdigest()


@dataclass(frozen=True)
class Artifact:
    kind: str
    info: ObjectInfo


@dataclass(frozen=True)
class CompileResult:
    tool: str
    schema_hash: str
    signature: str
    signature_tokens: int
    grammar_fallback: bool
    artifacts: list[Artifact] = field(default_factory=list)
    cached: bool = False


def signature_key(tool: Tool) -> str:
    return artifact_key(KIND_SIGNATURE, IR_FINGERPRINT, tool.schema_hash)


def grammar_key(tool: Tool) -> str:
    return artifact_key(KIND_GRAMMAR, IR_FINGERPRINT, tool.schema_hash)


def embedding_key(tool: Tool, embedder_fingerprint: str) -> str:
    return artifact_key(KIND_EMBEDDING, embedder_fingerprint, tool.schema_hash)


def encode_embedding(vec: np.ndarray) -> bytes:
    return np.asarray(vec, dtype="<f4").tobytes()


def decode_embedding(data: bytes, dim: int) -> np.ndarray:
    vec = np.frombuffer(data, dtype="<f4")
    if vec.shape != (dim,):
        raise ValueError(f"embedding has {vec.size} values, expected {dim}")
    return vec


class Compiler:
    """Compiles tools with a tokenizer (for the signature's token count) and an embedder."""

    def __init__(self, store: Store, embedder, tokenize, blocks=None):
        """``embedder``: ``services.common.embedder.Embedder``; ``tokenize``: ``str -> list[int]``;
        ``blocks``: a ``kvblock.BlockCompiler`` to also make the tool's KV block (None: no .atb)."""
        self.store = store
        self.embedder = embedder
        self.tokenize = tokenize
        self.blocks = blocks
        self._lock = threading.Lock()

    def _kv_block(self, tool: Tool, sig: str) -> Artifact | None:
        if self.blocks is None:
            return None
        key = self.blocks.key(tool)
        if self.store.exists(key):
            return Artifact(KIND_KV_BLOCK, self.store.get_with_info(key)[1])
        try:
            data, meta = self.blocks.compile(sig)
        except ResourceExhausted as e:
            # a signature no context can hold: the tool still compiles; the engine prefills it (path B)
            log.warning("no KV block", extra={"tool": tool.name, "reason": str(e)})
            return None
        return Artifact(KIND_KV_BLOCK, self.store.put(key, data, {"tool": tool.name, "schema_hash": tool.schema_hash,
                                                                 **meta}))

    def compile(self, tool: Tool) -> CompileResult:
        sig_key, gram_key = signature_key(tool), grammar_key(tool)
        emb_key = embedding_key(tool, self.embedder.fingerprint)
        keys = (sig_key, gram_key, emb_key)
        if all(self.store.exists(k) for k in keys) and (self.blocks is None or self.store.exists(self.blocks.key(tool))):
            # Content-addressed: present means already compiled from this exact schema.
            sig_data, sig_info = self.store.get_with_info(sig_key)
            _, gram_info = self.store.get_with_info(gram_key)
            _, emb_info = self.store.get_with_info(emb_key)
            sig = sig_data.decode("utf-8")
            kv = self._kv_block(tool, sig)
            return CompileResult(
                tool=tool.name,
                schema_hash=tool.schema_hash,
                signature=sig,
                signature_tokens=int(sig_info.meta.get("tokens", 0)),
                grammar_fallback=bool(gram_info.meta.get("fallback", False)),
                artifacts=[Artifact(KIND_SIGNATURE, sig_info), Artifact(KIND_GRAMMAR, gram_info),
                           Artifact(KIND_EMBEDDING, emb_info)] + ([kv] if kv else []),
                cached=True,
            )
        from services.common.embedder import tool_text

        sig = signature(tool)
        tokens = len(self.tokenize(sig))
        grammar = compile_grammar(tool)
        vec = self.embedder.embed_one(tool_text(tool))
        base = {"tool": tool.name, "schema_hash": tool.schema_hash}
        sig_info = self.store.put(sig_key, sig.encode("utf-8"), {**base, "tokens": tokens, "ir": IR_VERSION})
        gram_info = self.store.put(
            gram_key, grammar.text.encode("utf-8"), {**base, "fallback": grammar.fallback, "reason": grammar.reason}
        )
        emb_info = self.store.put(
            emb_key, encode_embedding(vec), {**base, "dim": int(vec.shape[0]), "embedder": self.embedder.fingerprint}
        )
        kv = self._kv_block(tool, sig)
        log.info("compiled", extra={"tool": tool.name, "signature_tokens": tokens, "fallback": grammar.fallback})
        return CompileResult(
            tool=tool.name,
            schema_hash=tool.schema_hash,
            signature=sig,
            signature_tokens=tokens,
            grammar_fallback=grammar.fallback,
            artifacts=[Artifact(KIND_SIGNATURE, sig_info), Artifact(KIND_GRAMMAR, gram_info),
                       Artifact(KIND_EMBEDDING, emb_info)] + ([kv] if kv else []),
        )

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        return self.store.get_with_info(key)


def kind_of_key(key: str) -> str:
    return key.split("-", 1)[0]


def dumps_meta(meta: dict) -> str:
    return json.dumps(meta, sort_keys=True)
