"""Domain logic of the compiler: one tool in, its artifacts in the store out. No protobuf here."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from services.common.errors import ArtifactNotFound, DataCorruption, ResourceExhausted
from services.common.store import ObjectInfo, Store, artifact_key
from services.common.tools import Tool
from services.compiler.grammar import compile_grammar, grammar_fingerprint
from services.compiler.signature import IR_VERSION, signature

log = logging.getLogger("nexus.compiler")

# Artifact kinds (the first part of every artifact key).
KIND_SIGNATURE = "sig"
KIND_GRAMMAR = "grammar"
KIND_EMBEDDING = "emb"
KIND_KV_BLOCK = "atb"  # made by services.compiler.kvblock.BlockCompiler

IR_FINGERPRINT = hashlib.sha256(IR_VERSION.encode()).hexdigest()
GRAMMAR_FINGERPRINT = grammar_fingerprint()


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
    # schema keywords the grammar does not enforce: checked against the schema after sampling only
    unchecked_keywords: tuple[str, ...] = ()
    cached: bool = False
    # the KV block was queued for the background (``defer_kv``) and is not in the store yet
    kv_pending: bool = False


def signature_key(tool: Tool) -> str:
    return artifact_key(KIND_SIGNATURE, IR_FINGERPRINT, tool.schema_hash)


def grammar_key(tool: Tool) -> str:
    return artifact_key(KIND_GRAMMAR, GRAMMAR_FINGERPRINT, tool.schema_hash)


def embedding_key(tool: Tool, embedder_fingerprint: str) -> str:
    return artifact_key(KIND_EMBEDDING, embedder_fingerprint, tool.schema_hash)


def encode_embedding(vec: np.ndarray) -> bytes:
    return np.asarray(vec, dtype="<f4").tobytes()


def decode_embedding(data: bytes, dim: int) -> np.ndarray:
    vec = np.frombuffer(data, dtype="<f4")
    if vec.shape != (dim,):
        raise ValueError(f"embedding has {vec.size} values, expected {dim}")
    return vec


class BlockQueue:
    """KV blocks compiled off the request path: ``submit`` queues a tool (nothing to do when it is queued already)
    and returns at once; one thread compiles the queue in order, at a lower CPU priority than the thread that
    answers calls (best effort: Linux thread niceness). A block that fails is logged and skipped: the engine keeps
    prefilling that tool's signature as text (path B), as it does for every tool until its block is stored."""

    def __init__(self, make: Callable[[Tool, str], object], metrics=None, nice: int = 10):
        self._make = make
        self.metrics = metrics
        self.nice = nice
        self._q: queue.Queue[tuple[str, Tool, str] | None] = queue.Queue()
        self._queued: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._closed = False

    def pending(self) -> int:
        with self._lock:
            return len(self._queued)

    def submit(self, key: str, tool: Tool, sig: str) -> bool:
        """Queue the block ``key`` of ``tool`` (signature ``sig``); True when queued now."""
        with self._lock:
            if self._closed or key in self._queued:
                return False
            self._queued.add(key)
            self._idle.clear()
            self._gauge()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kv-blocks", daemon=True)
                self._thread.start()
        self._q.put((key, tool, sig))
        return True

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued block is compiled (tests, benchmarks); True when the queue is empty."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Drop what is still queued (those tools stay on path B until re-registered or backfilled at the next
        start) and let the block in progress finish."""
        with self._lock:
            self._closed = True
            thread = self._thread
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self._q.put(None)
        if thread is not None:
            thread.join(timeout=timeout)

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.kv_blocks_pending.set(len(self._queued))

    def _run(self) -> None:
        if self.nice:
            try:  # this thread only (and the llama.cpp threads it starts): calls keep the cores they need
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):
                pass
        while True:
            item = self._q.get()
            if item is None:
                return
            key, tool, sig = item
            try:
                self._make(tool, sig)
            except Exception:  # noqa: BLE001 - one bad block must not stop the others
                log.exception("background KV block failed", extra={"tool": tool.name})
            with self._lock:
                self._queued.discard(key)
                self._gauge()
                if not self._queued:
                    self._idle.set()


class Compiler:
    """Compiles tools with a tokenizer (for the signature's token count) and an embedder."""

    def __init__(self, store: Store, embedder, tokenize, blocks=None, metrics=None):
        """``embedder``: ``services.common.embedder.Embedder``; ``tokenize``: ``str -> list[int]``;
        ``blocks``: a ``kvblock.BlockCompiler`` to also make the tool's KV block (None: no .atb), now or in the
        background (``compile(defer_kv=True)``)."""
        self.store = store
        self.embedder = embedder
        self.tokenize = tokenize
        self.blocks = blocks
        self._lock = threading.Lock()
        self.later = BlockQueue(self._kv_block, metrics) if blocks is not None else None

    def close(self) -> None:
        if self.later is not None:
            self.later.close()

    def _block(self, tool: Tool, sig: str, defer: bool) -> tuple[Artifact | None, bool]:
        """The tool's KV block artifact (None: no block), and whether it was queued for the background instead."""
        if self.blocks is None:
            return None, False
        if not defer:
            return self._kv_block(tool, sig), False
        key = self.blocks.key(tool)
        if self.store.exists(key):
            return Artifact(KIND_KV_BLOCK, self.store.get_with_info(key)[1]), False
        self.later.submit(key, tool, sig)
        return None, True

    def backfill(self, tools) -> int:
        """Queue the blocks of ``tools`` that have none in the store (deferred blocks a restart dropped); the count."""
        if self.blocks is None:
            return 0
        n = 0
        for tool in tools:
            key = self.blocks.key(tool)
            if not self.store.exists(key):
                try:
                    sig = self.store.get(signature_key(tool)).decode("utf-8")
                except Exception:  # noqa: BLE001 - not compiled (or damaged): the signature is cheap to rebuild
                    sig = signature(tool)
                n += self.later.submit(key, tool, sig)
        return n

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

    def compile(self, tool: Tool, defer_kv: bool = False) -> CompileResult:
        """``defer_kv``: queue the KV block for the background (``BlockQueue``) rather than compile it now."""
        sig_key, gram_key = signature_key(tool), grammar_key(tool)
        emb_key = embedding_key(tool, self.embedder.fingerprint)
        keys = (sig_key, gram_key, emb_key)
        if all(self.store.exists(k) for k in keys):
            # Content-addressed: present means already compiled from this exact schema.
            had_block = self.blocks is None or self.store.exists(self.blocks.key(tool))
            sig_data, sig_info = self.store.get_with_info(sig_key)
            _, gram_info = self.store.get_with_info(gram_key)
            _, emb_info = self.store.get_with_info(emb_key)
            sig = sig_data.decode("utf-8")
            kv, pending = self._block(tool, sig, defer_kv)
            return CompileResult(
                tool=tool.name,
                schema_hash=tool.schema_hash,
                signature=sig,
                signature_tokens=int(sig_info.meta.get("tokens", 0)),
                grammar_fallback=bool(gram_info.meta.get("fallback", False)),
                unchecked_keywords=tuple(gram_info.meta.get("unchecked", ())),
                artifacts=[Artifact(KIND_SIGNATURE, sig_info), Artifact(KIND_GRAMMAR, gram_info),
                           Artifact(KIND_EMBEDDING, emb_info)] + ([kv] if kv else []),
                cached=had_block,
                kv_pending=pending,
            )
        from services.common.embedder import tool_text

        sig = signature(tool)
        tokens = len(self.tokenize(sig))
        grammar = compile_grammar(tool)
        base = {"tool": tool.name, "schema_hash": tool.schema_hash}
        sig_info = self.store.put(sig_key, sig.encode("utf-8"), {**base, "tokens": tokens, "ir": IR_VERSION})
        gram_info = self.store.put(
            gram_key, grammar.text.encode("utf-8"), {**base, "fallback": grammar.fallback, "reason": grammar.reason,
                                                       "unchecked": list(grammar.unchecked)}
        )
        emb_info = self._stored_embedding(emb_key)  # the router embeds a registration's tools in one batch first
        if emb_info is None:
            vec = self.embedder.embed_one(tool_text(tool))
            emb_info = self.store.put(emb_key, encode_embedding(vec), {**base, "dim": int(vec.shape[0]),
                                                                       "embedder": self.embedder.fingerprint})
        kv, pending = self._block(tool, sig, defer_kv)
        log.info("compiled", extra={"tool": tool.name, "signature_tokens": tokens, "fallback": grammar.fallback,
                                    "kv_block": "queued" if pending else "stored" if kv else "none"})
        return CompileResult(
            tool=tool.name,
            schema_hash=tool.schema_hash,
            signature=sig,
            signature_tokens=tokens,
            grammar_fallback=grammar.fallback,
            unchecked_keywords=grammar.unchecked,
            artifacts=[Artifact(KIND_SIGNATURE, sig_info), Artifact(KIND_GRAMMAR, gram_info),
                       Artifact(KIND_EMBEDDING, emb_info)] + ([kv] if kv else []),
            kv_pending=pending,
        )

    def _stored_embedding(self, key: str) -> ObjectInfo | None:
        """The embedding already in the store under ``key`` (content-addressed: same embedder, same tool), if it
        decodes."""
        try:
            data, info = self.store.get_with_info(key)
            decode_embedding(data, self.embedder.dim)
            return info
        except (ArtifactNotFound, DataCorruption, ValueError):
            return None

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        return self.store.get_with_info(key)


def kind_of_key(key: str) -> str:
    return key.split("-", 1)[0]


def dumps_meta(meta: dict) -> str:
    return json.dumps(meta, sort_keys=True)
