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

import numpy as np

from services.common.errors import (
    ArtifactNotFound,
    DataCorruption,
    ResourceExhausted,
    ToolNotFound,
)
from services.common.models import file_fingerprint, resolve_gguf
from services.common.store import Store
from services.common.tools import Tool
from services.common.validation import bounded_count, check_request
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
    recompute_fraction: float | None = None


@dataclass(frozen=True)
class ToolArtifacts:
    tool: Tool
    signature: str
    grammar: str
    grammar_fallback: bool


class ClosingBias:
    """A logits processor that, once ``active``, strongly prefers tokens made only of JSON closers
    (``"``, ``]``, ``}``, spaces): the grammar keeps the output legal while it winds down."""

    def __init__(self, quote_ids: np.ndarray, bracket_ids: np.ndarray, bias: float = 50.0):
        self.quote_ids = quote_ids  # tokens that close a string (start with '"', then only closers)
        self.bracket_ids = bracket_ids  # tokens that close arrays/objects (']' / '}' and spaces only)
        self.bias = bias
        self.active = False
        self.in_string = False

    @classmethod
    def for_vocab(cls, pieces: list[str]) -> ClosingBias:
        closers = set('"]} ')
        quote = [i for i, p in enumerate(pieces) if p.startswith('"') and set(p) <= closers]
        bracket = [i for i, p in enumerate(pieces) if p.strip() and set(p) <= set("]} ")]
        return cls(np.asarray(quote, dtype=np.int64), np.asarray(bracket, dtype=np.int64))

    def __call__(self, input_ids, logits):
        if not self.active:
            return logits
        ids = self.quote_ids if self.in_string else self.bracket_ids
        logits = np.array(logits, copy=True)
        logits[ids[ids < logits.shape[0]]] += self.bias
        return logits


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

    def _closer(self) -> ClosingBias:
        if getattr(self, "_closing_bias", None) is None:
            self._closing_bias = ClosingBias.for_vocab(
                [self.llm.detokenize([t]).decode("utf-8", errors="ignore") for t in range(self.llm.n_vocab())])
        return self._closing_bias

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
        check_request(query, len(history), max_query_chars=self.config.max_query_chars,
                      max_history_turns=self.config.max_history_turns)
        return bounded_count("max_tokens", max_tokens, default=self.config.default_max_tokens,
                             limit=self.config.max_tokens_limit)

    def tokenize_messages(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.template.render(messages)
        add_bos = not (self.template.bos and text.startswith(self.template.bos))
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def window(self, history: Sequence[Turn]) -> list[Turn]:
        return prune_history(history, self.config.history_turns, self.config.history_turn_chars)

    def prompt_tokens(self, arts: ToolArtifacts, query: str, history: Sequence[Turn]) -> list[int]:
        """System (with the compact signature) + pruned conversation window + query."""
        return self.tokenize_messages(build_messages(arts.signature, query, self.window(history)))

    def generate(self, query: str, tool: str, history: Sequence[Turn] = (),
                 max_tokens: int | None = None, reuse_prefix: bool = True) -> Iterator[Token | Result]:
        """Yield ``Token`` pieces as they are sampled, then one ``Result``."""
        limit = self._check(query, history, max_tokens)
        t0 = time.perf_counter()
        arts = self.artifacts(tool)
        with self.lock:
            tokens = self.prompt_tokens(arts, query, history)
            yield from self.generate_tokens(tokens, arts, limit, reuse_prefix=reuse_prefix, t0=t0)

    def generate_tokens(self, tokens: list[int], arts: ToolArtifacts, limit: int, *, reuse_prefix: bool = True,
                        t0: float | None = None, path: str = PATH_TEXT,
                        path_reason: str = "text prefill of the compact signature") -> Iterator[Token | Result]:
        """Prefill ``tokens`` (reusing the longest cached prefix when ``reuse_prefix``) and sample the
        arguments under the tool's grammar. Callers build the prompt; the evaluation's arms use this with
        other prompts (full schema, all schemas at the head)."""
        import llama_cpp
        from llama_cpp import LlamaGrammar

        t0 = time.perf_counter() if t0 is None else t0
        with self.lock:
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
            closer = self._closer()
            closer.active = False
            # Past the budget the closer biases toward tokens that close strings/arrays/objects; the grammar
            # still decides what is legal, so the output stays valid JSON for the schema and ends soon.
            hard_stop = limit + 64 + 8 * len(arts.tool.input_schema.get("required", []) or [])
            for tok in self.llm.generate(tokens, temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                         repeat_penalty=1.0, grammar=grammar, reset=True,
                                         logits_processor=[closer]):
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
                if tracker.done or n_out >= hard_stop:
                    break
                closer.in_string = tracker.in_string
                if n_out >= limit:
                    closer.active = True
            total_ms = (time.perf_counter() - t0) * 1e3
        text = "".join(pieces).strip()
        valid = _validate(text, arts.tool)
        if not first_arg_ms:
            first_arg_ms = total_ms  # no argument at all ({}): the whole call is the wait
        self.stats["generations"] += 1
        self.stats["path_" + path] += 1
        self.stats["grammar_fallbacks"] += int(arts.grammar_fallback)
        yield Result(
            tool=arts.tool.name, arguments_json=text, first_token_ms=first_token_ms, first_arg_token_ms=first_arg_ms,
            total_ms=total_ms, prefill_ms=prefill_ms, prompt_tokens=len(tokens), completion_tokens=n_out,
            path=path, path_reason=path_reason, schema_valid=valid,
        )


def _validate(text: str, tool: Tool) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), tool.input_schema)
        return True
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
