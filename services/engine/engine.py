"""Domain logic of the engine: one llama.cpp context, grammar-constrained argument generation.

The context is owned by one ``Engine`` per host and guarded by one coarse re-entrant lock held for a
whole turn, so concurrent requests are serialised and outputs are deterministic (greedy decoding).
No protobuf here."""

from __future__ import annotations

import codecs
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from services.common.errors import (
    ArtifactNotFound,
    DataCorruption,
    InvalidArgument,
    ResourceExhausted,
    ToolNotFound,
)
from services.common.models import file_fingerprint, resolve_gguf
from services.common.store import Store
from services.common.tools import Tool
from services.compiler.compiler import grammar_key, signature_key
from services.compiler.grammar import compile_grammar
from services.compiler.signature import signature
from services.engine.config import EngineConfig
from services.engine.prompt import ChatTemplate, Turn, build_messages, prune_history

log = logging.getLogger("nexus.engine")

PATH_TEXT = "text"
PATH_SPLICE = "splice"


@dataclass(frozen=True)
class Token:
    """A streamed piece of generated text."""

    text: str


@dataclass(frozen=True)
class Result:
    tool: str
    arguments_json: str
    first_token_ms: float
    first_arg_token_ms: float
    total_ms: float
    prefill_ms: float
    prompt_tokens: int
    completion_tokens: int
    path: str
    path_reason: str
    schema_valid: bool


@dataclass(frozen=True)
class ToolArtifacts:
    tool: Tool
    signature: str
    grammar: str
    grammar_fallback: bool


class JsonObjectTracker:
    """Follows generated text to know when the top-level JSON object closes and when the first
    argument value starts (for time-to-first-argument-token)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.started = False
        self.done = False
        self.after_colon = False
        self.first_value_seen = False

    def feed(self, text: str) -> bool:
        """Consume text; returns True if this text contained the first character of the first value."""
        hit = False
        for ch in text:
            if self.done:
                break
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                continue
            if self.after_colon and not ch.isspace() and not self.first_value_seen:
                self.first_value_seen = hit = True
            if ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
                self.started = True
            elif ch in "}]":
                self.depth -= 1
                if self.started and self.depth == 0:
                    self.done = True
            elif ch == ":" and self.depth == 1:
                self.after_colon = True
        return hit


class Engine:
    def __init__(self, config: EngineConfig, store: Store):
        from llama_cpp import Llama

        self.config = config
        self.store = store
        self.model_path = resolve_gguf(config.model_path)
        self.model_fingerprint = file_fingerprint(self.model_path)
        self.llm = Llama(
            model_path=str(self.model_path),
            n_ctx=config.n_ctx,
            n_threads=config.n_threads,
            n_threads_batch=config.n_threads,
            n_batch=config.n_batch,
            seed=config.seed,
            verbose=False,
        )
        meta = self.llm.metadata or {}
        self.template = ChatTemplate(
            meta.get("tokenizer.chat_template"),
            bos=self._token_text(self.llm.token_bos()),
            eos=self._token_text(self.llm.token_eos()),
        )
        self.lock = threading.RLock()
        self._artifacts: OrderedDict[str, ToolArtifacts] = OrderedDict()
        self.stats = {"generations": 0, "path_text": 0, "path_splice": 0, "grammar_fallbacks": 0}

    def _token_text(self, tok: int) -> str:
        if tok < 0:
            return ""
        return self.llm.detokenize([tok], special=True).decode("utf-8", errors="ignore")

    # -- artifacts --------------------------------------------------------------------------
    def artifacts(self, name: str) -> ToolArtifacts:
        tool = self.store.registry_get(name)
        if tool is None:
            raise ToolNotFound(f"tool {name!r} is not registered")
        cached = self._artifacts.get(tool.schema_hash)
        if cached is not None:
            self._artifacts.move_to_end(tool.schema_hash)
            return cached
        try:
            sig = self.store.get(signature_key(tool)).decode("utf-8")
            gdata, ginfo = self.store.get_with_info(grammar_key(tool))
            arts = ToolArtifacts(tool, sig, gdata.decode("utf-8"), bool(ginfo.meta.get("fallback", False)))
        except (ArtifactNotFound, DataCorruption) as e:
            # Not compiled yet (or damaged): both artifacts are cheap and deterministic to rebuild here.
            log.warning("compiling locally", extra={"tool": name, "reason": str(e)})
            g = compile_grammar(tool)
            arts = ToolArtifacts(tool, signature(tool), g.text, g.fallback)
        self._artifacts[tool.schema_hash] = arts
        while len(self._artifacts) > 512:
            self._artifacts.popitem(last=False)
        return arts

    # -- generation -------------------------------------------------------------------------
    def _check(self, query: str, history: Sequence[Turn], max_tokens: int | None) -> int:
        if not query or not query.strip():
            raise InvalidArgument("query is empty")
        if len(query) > self.config.max_query_chars:
            raise InvalidArgument(f"query is {len(query)} characters; the limit is {self.config.max_query_chars}")
        if len(history) > self.config.max_history_turns:
            raise InvalidArgument(f"history has {len(history)} turns; the limit is {self.config.max_history_turns}")
        if max_tokens is None or max_tokens == 0:
            return self.config.default_max_tokens
        if max_tokens < 0 or max_tokens > self.config.max_tokens_limit:
            raise InvalidArgument(f"max_tokens must be in 1..{self.config.max_tokens_limit}, got {max_tokens}")
        return max_tokens

    def prompt_tokens(self, arts: ToolArtifacts, query: str, history: Sequence[Turn]) -> list[int]:
        window = prune_history(history, self.config.history_turns, self.config.history_turn_chars)
        text = self.template.render(build_messages(arts.signature, query, window))
        add_bos = not (self.template.bos and text.startswith(self.template.bos))
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def generate(self, query: str, tool: str, history: Sequence[Turn] = (),
                 max_tokens: int | None = None, reuse_prefix: bool = True) -> Iterator[Token | Result]:
        """Yield ``Token`` pieces as they are sampled, then one ``Result``."""
        import llama_cpp
        from llama_cpp import LlamaGrammar

        limit = self._check(query, history, max_tokens)
        t0 = time.perf_counter()
        arts = self.artifacts(tool)
        with self.lock:
            tokens = self.prompt_tokens(arts, query, history)
            if len(tokens) + limit > self.llm.n_ctx():
                raise ResourceExhausted(
                    f"prompt of {len(tokens)} tokens + {limit} to generate exceeds the context of {self.llm.n_ctx()}"
                )
            grammar = LlamaGrammar.from_string(arts.grammar, verbose=False)
            # Reuse the longest common prefix already in the context (llama.cpp prefix cache), then
            # prefill the rest but the last token, which generate() evaluates to get logits.
            keep = 0
            if reuse_prefix and self.llm.n_tokens:
                cached = self.llm.input_ids[: self.llm.n_tokens]
                for a, b in zip(cached, tokens[:-1], strict=False):
                    if a != b:
                        break
                    keep += 1
            else:
                self.llm.reset()
            self.llm.n_tokens = keep
            tp = time.perf_counter()
            self.llm.eval(tokens[keep:-1])
            prefill_ms = (time.perf_counter() - tp) * 1e3
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            tracker = JsonObjectTracker()
            pieces: list[str] = []
            first_token_ms = first_arg_ms = 0.0
            n_out = 0
            eos = self.llm.token_eos()
            vocab = self.llm._model.vocab
            for tok in self.llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                         repeat_penalty=1.0, grammar=grammar, reset=True):
                now = (time.perf_counter() - t0) * 1e3
                if n_out == 0:
                    first_token_ms = now
                if tok == eos or llama_cpp.llama_vocab_is_eog(vocab, tok):
                    break
                n_out += 1
                piece = decoder.decode(self.llm.detokenize([tok]))
                if piece:
                    pieces.append(piece)
                    if tracker.feed(piece):
                        first_arg_ms = now
                    yield Token(piece)
                if tracker.done or n_out >= limit:
                    break
            total_ms = (time.perf_counter() - t0) * 1e3
        text = "".join(pieces).strip()
        valid = _validate(text, arts.tool)
        if not first_arg_ms:
            first_arg_ms = total_ms  # no argument at all ({}): the whole call is the wait
        self.stats["generations"] += 1
        self.stats["path_text"] += 1
        self.stats["grammar_fallbacks"] += int(arts.grammar_fallback)
        yield Result(
            tool=arts.tool.name, arguments_json=text, first_token_ms=first_token_ms, first_arg_token_ms=first_arg_ms,
            total_ms=total_ms, prefill_ms=prefill_ms, prompt_tokens=len(tokens), completion_tokens=n_out,
            path=PATH_TEXT, path_reason="text prefill of the compact signature", schema_valid=valid,
        )


def _validate(text: str, tool: Tool) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), tool.input_schema)
        return True
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
