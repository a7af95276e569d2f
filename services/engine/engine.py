"""Domain logic of the engine: one llama.cpp context, grammar-constrained argument generation.

The context is owned by one ``Engine`` per host and guarded by one coarse re-entrant lock held for a
whole turn, so concurrent requests are serialised and outputs are deterministic (greedy decoding).

A turn's prompt is head | signature | request. Path A splices the tool's compiled KV block (``.atb``) after
the head (reanchored and repaired with R(n) when the head is longer than the compile prelude); path B
prefills the signature as text. Either way the longest exact prefix already in the live sequence is reused.
No protobuf here."""

from __future__ import annotations

import codecs
import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.common.errors import (
    ArtifactNotFound,
    DataCorruption,
    FailedPrecondition,
    InvalidArgument,
    ModelMismatch,
    NexusError,
    ResourceExhausted,
    ToolNotFound,
)
from services.common.models import file_fingerprint, resolve_gguf
from services.common.store import Store
from services.common.tools import Tool
from services.common.validation import bounded_count, check_request
from services.compiler.compiler import grammar_key, signature_key
from services.compiler.grammar import ANY_OBJECT, compile_grammar, grammar_text
from services.compiler.kvblock import PromptSegments
from services.compiler.signature import param_order, signature
from services.engine.choices import enum_choices
from services.engine.config import EngineConfig
from services.engine.copybias import CopyBias
from services.engine.profiles import profile_for, without
from services.engine.sampling import GrammarError, GrammarSampler, Vocabulary
from services.runtime.prompt import Turn, copy_source, prune_history
from services.runtime.splice import LIVE_SEQ, kl_divergence, recompute_fraction

log = logging.getLogger("nexus.engine")

PATH_TEXT = "text"
PATH_SPLICE = "splice"
PREFILL_AUTO, PREFILL_SPLICE, PREFILL_TEXT = "auto", "splice", "text"
FIDELITY_ADAPTIVE, FIDELITY_EXACT = "adaptive", "exact"
SIDECAR_SEQ = 2  # splice validation: the same prompt text-prefilled from position 0
WARM_SEQ = 3  # the prelude, decoded once: copied into the live sequence at the start of every turn
FIRST_HEAD_SEQ = 4  # then ``warm_heads`` sequences holding recent heads (prelude + conversation window)


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
    recompute_fraction: float | None = None  # R (percent) of a splice
    recomputed_tokens: int = 0  # block tokens re-decoded by the repair
    spliced_tokens: int = 0  # block tokens transplanted
    validation_kl: float | None = None  # sidecar check: KL(text prefill || splice) of the first token
    validation_top1: bool | None = None


@dataclass(frozen=True)
class ToolArtifacts:
    tool: Tool
    signature: str
    grammar: str
    grammar_fallback: bool

    @functools.cached_property
    def validator(self) -> Any:
        """The tool's JSON Schema validator, built once (the schema was checked at registration)."""
        import jsonschema

        schema = self.tool.input_schema
        return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)

    def valid(self, arguments_json: str) -> bool:
        """Whether ``arguments_json`` is JSON that validates against the tool's schema."""
        try:
            return bool(self.validator.is_valid(json.loads(arguments_json)))
        except ValueError:
            return False


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


@dataclass(frozen=True)
class _Plan:
    """How a turn's prompt gets into the live sequence."""

    path: str
    reason: str
    block: Any = None
    recompute_pct: float | None = None
    anchored: bool = False


class Engine:
    """One llama.cpp context per host (``SpliceContext``: live, scratch and sidecar sequences), the tool
    artifacts from the store, and the turn: prompt in (text prefill or KV splice), grammar-constrained greedy
    arguments out."""

    def __init__(self, config: EngineConfig, store: Store):
        import llama_cpp
        from llama_cpp import Llama

        from services.compiler.kvblock import BlockModel, kv_fingerprint, layout_for
        from services.runtime.splice import SpliceContext

        self.store = store
        self.model_path = resolve_gguf(config.model_path)
        self.model_fingerprint = file_fingerprint(self.model_path)
        # vocabulary only: tokenizer, chat template and metadata; the weights live in the splice context
        self.llm = Llama(model_path=str(self.model_path), vocab_only=True, verbose=False)
        # the model family's profile turns off the decoding rules that did not pay for it (profiles.py)
        self.profile = profile_for(self.llm.metadata or {}, config.profile)
        self.config = config = without(config, self.profile.off)
        log.info("model", extra={"path": str(self.model_path), "model": self.model_fingerprint,
                                 "family": self.profile.family, "rules_off": list(self.profile.off),
                                 "evidence": self.profile.evidence})
        self.layout = layout_for(self.llm)
        self.template = self.layout.template
        self.sc = SpliceContext(str(self.model_path), n_ctx=config.n_ctx, n_batch=config.n_batch,
                                n_threads=config.n_threads, n_seq_max=FIRST_HEAD_SEQ + max(0, config.warm_heads),
                                n_gpu_layers=config.n_gpu_layers,
                                fingerprint=bytes.fromhex(self.model_fingerprint)[:16])
        self.n_ctx = self.sc.n_ctx
        self.prelude = self.layout.prelude()
        # the part of every head, with or without history: system prompt, worked example, user-turn opening
        with_history = self.layout.segments("x", "", [Turn("user", "x")]).head
        n = 0
        while n < min(len(with_history), len(self.prelude)) and with_history[n] == self.prelude[n]:
            n += 1
        self.const_prefix = self.prelude[:n]
        self.kv_fingerprint = kv_fingerprint(self.model_fingerprint, self.prelude)
        self.block_model = BlockModel(self.model_fingerprint, self.kv_fingerprint, str(self.model_path))
        self.model_mismatch: str | None = None  # why the compiler's KV blocks cannot splice here (check_compiler_model)
        self._announced: BlockModel | None = None
        self.lock = threading.RLock()
        self._artifacts: OrderedDict[str, ToolArtifacts] = OrderedDict()
        self._blocks: OrderedDict[str, Any] = OrderedDict()
        self._live: list[int] = []  # the tokens whose K/V the live sequence holds, in order
        self._exact_upto = 0  # the live K/V equal a text prefill of _live[:_exact_upto] (safe to reuse)
        self._turns = 0
        # L0 radix arena over recent heads (exact tokens -> warm sequence): an agent interleaving several
        # conversations, or calling several tools in one turn, finds its head still decoded
        import nexus_native as nn

        self._heads = nn.RadixArena(max_tokens=self.n_ctx) if config.warm_heads > 0 else None
        self._free_head_seqs = list(range(FIRST_HEAD_SEQ, FIRST_HEAD_SEQ + max(0, config.warm_heads)))
        self.last_prompt_logits: np.ndarray | None = None  # next-token logits after the last prompt (tests)
        self.stats = {"generations": 0, "path_text": 0, "path_splice": 0, "grammar_fallbacks": 0,
                      "splice_declined": 0, "validations": 0, "validation_fallbacks": 0, "warm_head_hits": 0}
        self._vocabulary = Vocabulary(llama_cpp, self.sc.vocab, self.sc.n_vocab)  # the grammar's view of the vocab
        # the slot reader (services/engine/slots.py) loads here, not on the first turn (torch import ~2 s)
        self._slots = None
        if config.copy_bias and config.slot_hint_bias and config.slot_model:
            from services.engine.slots import load_slots

            self._slots = load_slots(config.slot_model, threads=config.slot_threads,
                                     candidates=config.slot_candidates)

    def close(self) -> None:
        with self.lock:
            self.sc.close()
            self.llm.close()

    def warmup(self) -> None:
        """Decode the constant prompt head (the prelude) once into the warm sequence; every turn copies it."""
        with self.lock:
            self._warm_ready = False
            self.sc.prefill(self.prelude, WARM_SEQ)
            self._warm_ready = True

    def _pieces(self) -> list[str]:
        if getattr(self, "_vocab_pieces", None) is None:
            self._vocab_pieces = [self.llm.detokenize([t]).decode("utf-8", errors="ignore")
                                  for t in range(self.llm.n_vocab())]
        return self._vocab_pieces

    def _closer(self) -> ClosingBias:
        if getattr(self, "_closing_bias", None) is None:
            self._closing_bias = ClosingBias.for_vocab(self._pieces())
        return self._closing_bias

    def set_decoding(self, config: EngineConfig) -> None:
        """Later turns decode with ``config``'s copy-bias, slot-hint and enum-choice values (an evaluation turns
        one rule off at a time on one loaded model). The rest of ``config`` must be the engine's own: the model,
        context and slot reader are loaded once, at start."""
        changed = {f for f in self.config.__dataclass_fields__ if getattr(config, f) != getattr(self.config, f)}
        if bad := sorted(f for f in changed if not f.startswith(("copy_", "slot_", "enum_"))
                         or f in ("slot_model", "slot_threads", "slot_candidates")):
            raise ValueError(f"set_decoding changes only decoding rules, not {bad}")
        with self.lock:
            self.config = config
            self._copy_bias = None

    def _copier(self) -> CopyBias | None:
        c = self.config
        if not c.copy_bias:
            return None
        if getattr(self, "_copy_bias", None) is None:
            self._copy_bias = CopyBias(self._pieces(), start_bias=c.copy_start_bias, close_bias=c.copy_close_bias,
                                       span_penalty=c.copy_span_penalty, reuse_penalty=c.copy_reuse_penalty,
                                       word_penalty=c.copy_word_penalty, hint_bias=c.slot_hint_bias,
                                       key_bias=c.slot_key_bias,
                                       pending_bias=c.slot_pending_bias if c.slot_hint_bias else 0.0,
                                       hint_penalty=c.slot_hint_penalty if c.slot_hint_bias else 0.0)
        return self._copy_bias

    def slot_hints(self, tool, source: str) -> dict[str, tuple[int, int]]:
        """The slot reader's spans of ``source`` for ``tool``'s parameters ({} without a reader)."""
        if self._slots is None:
            return {}
        return {k: (h.start, h.end) for k, h in self._slots.hints(tool, source).items()}

    def slot_silent(self, tool, hints) -> list[str]:
        """The parameters the slot reader read and found no span for, leaving out enums (their values are
        mapped from the wording, "newest first" -> DESC, which the reader answers "no span"); none without a
        reader."""
        if self._slots is None:
            return []
        from services.engine.slots import slot_params

        return [k for k, p in slot_params(tool) if k not in hints and not p.get("enum")]

    def enum_choices(self, tool, request: str) -> dict[str, str]:
        """Top-level enum or boolean parameter -> the value the request's words name, as JSON text
        (services/engine/choices.py); {} when ``enum_choices`` (or the slot hint bias) is off."""
        if not (self.config.enum_choices and self.config.slot_hint_bias):
            return {}
        return enum_choices(tool.input_schema, request)

    def _token_text(self, tok: int) -> str:
        if tok < 0:
            return ""
        return self.llm.detokenize([tok], special=True).decode("utf-8", errors="ignore")

    def check_compiler_model(self) -> str | None:
        """Compare this engine's model with the one the compiler announced in the store (at start-up and on a block
        miss): the reason none of the compiler's KV blocks can splice here, also kept in ``model_mismatch``; None
        when they can, or while no compiler has announced its model. A changed announcement is logged, a mismatch
        as an error naming both fingerprints and both GGUFs."""
        from services.compiler.kvblock import announced_model, model_mismatch

        with self.lock:
            try:
                theirs = announced_model(self.store)
            except NexusError as e:  # store down or record damaged: serving goes on, the next miss checks again
                log.warning("could not read the compiler's model from the store", extra={"error": str(e)})
                return self.model_mismatch
            if theirs is None or theirs == self._announced:
                return self.model_mismatch
            self._announced = theirs
            self.model_mismatch = model_mismatch(self.block_model, theirs)
            if self.model_mismatch:
                log.error("model mismatch: %s", self.model_mismatch,
                          extra={"engine_model": self.model_fingerprint, "engine_path": str(self.model_path),
                                 "compiler_model": theirs.model, "compiler_path": theirs.path})
            else:
                log.info("KV blocks: the compiler's model is the engine's", extra={"model": self.model_fingerprint})
            return self.model_mismatch

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

    def kv_block(self, tool: Tool, view: list[int]) -> Any:
        """The tool's compiled .atb block for this model and prompt head, decoded and checked.

        ArtifactNotFound when the compiler made none; ModelMismatch when it was compiled for another
        model or RoPE regime, or for other tokens; DataCorruption when it does not decode."""
        import nexus_native as nn

        from services.compiler.kvblock import kv_block_key

        key = kv_block_key(tool, self.model_fingerprint, self.prelude)
        block = self._blocks.get(key)
        if block is None:
            data = self.store.get(key)
            try:
                block = self.sc.load_block(data)  # ModelMismatch for a foreign block: never loaded
            except nn.AtbError as e:
                raise DataCorruption(f"KV block {key} does not decode: {e}") from e
            self._blocks[key] = block
            while len(self._blocks) > self.config.block_cache:
                self._blocks.popitem(last=False)
        self._blocks.move_to_end(key)
        if block.n_tokens != len(view) or block.token_hash != nn.token_hash(view) or block.anchor != len(self.prelude):
            raise ModelMismatch(f"KV block {key} was compiled from other tokens or another prompt head")
        return block

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

    def segments(self, arts: ToolArtifacts, query: str, history: Sequence[Turn]) -> PromptSegments:
        """System + worked example + pruned conversation window | signature | request, as token segments."""
        return self.layout.segments(arts.signature, query, self.window(history))

    def prompt_tokens(self, arts: ToolArtifacts, query: str, history: Sequence[Turn]) -> list[int]:
        return self.segments(arts, query, history).tokens

    def generate(self, query: str, tool: str, history: Sequence[Turn] = (), max_tokens: int | None = None,
                 *, fidelity: str = FIDELITY_ADAPTIVE, prefill: str = PREFILL_AUTO,
                 validate: bool | None = None) -> Iterator[Token | Result]:
        """Yield ``Token`` pieces as they are sampled, then one ``Result``.

        ``prefill``: "auto" (splice when possible, else text prefill with the reason), "splice" (splice or
        FAILED_PRECONDITION), "text". ``fidelity``: "adaptive" (R(n)) or "exact" (R = 100 % off anchor).
        ``validate``: run the sidecar check on a splice (None: the config's sampling rate)."""
        if fidelity not in (FIDELITY_ADAPTIVE, FIDELITY_EXACT):
            raise InvalidArgument(f"unknown fidelity {fidelity!r}")
        if prefill not in (PREFILL_AUTO, PREFILL_SPLICE, PREFILL_TEXT):
            raise InvalidArgument(f"unknown prefill path {prefill!r}")
        limit = self._check(query, history, max_tokens)
        t0 = time.perf_counter()
        arts = self.artifacts(tool)
        with self.lock:
            seg = self.segments(arts, query, history)
            plan = self._plan(arts, seg, fidelity, prefill)
            if validate is None:  # sampled: every (1/rate)-th turn
                rate = self.config.splice_validate_rate
                validate = rate > 0 and self._turns % max(1, round(1 / rate)) == 0
            self._turns += 1
            # the sidecar needs a second copy of the prompt's cells in the shared KV cache
            validate = validate and 2 * len(seg.tokens) + limit <= self.n_ctx
            source = copy_source(query, self.window(history))
            yield from self._turn(seg, arts, limit, t0, plan, validate=validate and plan.path == PATH_SPLICE,
                                  source=source, request=query)

    def _plan(self, arts: ToolArtifacts, seg: PromptSegments, fidelity: str, prefill: str) -> _Plan:
        if prefill == PREFILL_TEXT:
            return _Plan(PATH_TEXT, "text prefill requested")
        strict = prefill == PREFILL_SPLICE

        def decline(reason: str) -> _Plan:
            if strict:
                raise FailedPrecondition(f"splice requested but declined: {reason}")
            self.stats["splice_declined"] += 1
            return _Plan(PATH_TEXT, "path B: " + reason)

        if not self.config.splice:
            return decline("splicing is off in the engine config")
        if not self.sc.uma.unified:
            return decline(self.sc.uma.reason)
        n_past = len(seg.head)
        anchored = seg.head == self.prelude
        if anchored:
            pct = 0.0  # at its compile anchor after the same head, the block is the prefill's own K/V
        elif fidelity == FIDELITY_EXACT:
            pct = 100.0
        else:
            pct = recompute_fraction(n_past, self.config.splice_M, self.config.splice_R_base, self.config.splice_K)
        if pct >= 100.0 and not strict:
            return decline(f"n_past={n_past}: R = 100 %, a text prefill of the signature costs less than a "
                           "splice with a full repair")
        if n_past + len(seg.view) + len(seg.tail) + 1 > self.n_ctx:
            return decline("the prompt does not fit the context")
        try:
            block = self.kv_block(arts.tool, seg.view)
        except ArtifactNotFound:
            why = self.check_compiler_model()
            return decline("no compiled KV block for this model and prompt head in the store"
                           + (f" ({why})" if why else ""))
        except (ModelMismatch, DataCorruption) as e:
            log.warning("KV block refused", extra={"tool": arts.tool.name, "reason": str(e)})
            if strict:
                raise
            return decline(f"KV block refused: {e}")
        why = "anchored" if anchored else f"reanchored to n_past={n_past}, R = {pct:.1f} %"
        return _Plan(PATH_SPLICE, f"path A: KV block spliced ({why})", block, pct, anchored)

    def forget_live(self) -> None:
        """Empty the live sequence (for callers that decode into it directly; hold ``lock``)."""
        self.sc.reset(LIVE_SEQ)
        self._live, self._exact_upto = [], 0

    @property
    def n_ctx_train(self) -> int:
        return int(self.sc._ll.llama_model_n_ctx_train(self.sc.model))

    def _start(self, tokens: Sequence[int], head_len: int) -> int:
        """Start the live sequence for a prompt whose first ``head_len`` tokens are its head; returns how many
        positions are already in place.

        Reuse is by whole units only, so a turn computes its K/V the same way whatever ran before it: the whole
        head when the live sequence (or a warm head in the radix arena) holds exactly it as a text prefill (a
        retry, the next call of the same turn, an interleaved conversation), else the prelude or the constant
        prefix copied from the warm sequence (decoded once, in one batch, like the compiler's blocks), else
        nothing. Decoding the remainder of a prefix in small pieces would round differently than one batch.
        (The last bits can still move with the cache's occupancy: llama.cpp's attention spans every occupied
        cell of the shared cache. Greedy outputs under concurrency are tested to be identical.)"""
        head = list(tokens[:head_len])
        if self._exact_upto >= head_len and self._live[:head_len] == head:
            keep = head_len
            self.sc.seq_rm(LIVE_SEQ, keep, -1)
        else:
            self.sc.seq_rm(LIVE_SEQ)
            keep = self._warm_head(head)
            if not getattr(self, "_warm_ready", False):
                self.warmup()
            for unit in (self.prelude, self.const_prefix) if not keep else ():
                if head_len >= len(unit) and head[: len(unit)] == unit:
                    keep = len(unit)
                    self.sc.seq_cp(WARM_SEQ, LIVE_SEQ, 0, keep)
                    break
        self._live = head[:keep]
        self._exact_upto = keep
        return keep

    def _warm_head(self, head: list[int]) -> int:
        """Copy ``head`` from the arena's warm sequences into the (empty) live sequence when it holds exactly
        that head; returns its length, else 0."""
        if self._heads is None or not head:
            return 0
        slot, n = self._heads.lookup(np.asarray(head, dtype=np.int32), touch=False)
        if slot < 0 or n != len(head) or len(self._heads.tokens(slot)) != len(head):
            return 0
        self._heads.touch(slot)
        self.sc.seq_cp(self._heads.value(slot), LIVE_SEQ, 0, len(head))
        self.stats["warm_head_hits"] += 1
        return len(head)

    def _remember_head(self, head: list[int]) -> None:
        """Keep the live sequence's head (an exact text prefill) in a warm sequence, evicting the least
        recently used one. The prelude alone has its own warm sequence."""
        if self._heads is None or len(head) <= len(self.prelude):
            return
        arr = np.asarray(head, dtype=np.int32)
        slot, n = self._heads.lookup(arr, touch=False)
        if slot >= 0 and n == len(head) and len(self._heads.tokens(slot)) == len(head):
            self._heads.touch(slot)
            return
        if not self._free_head_seqs:
            lru = self._heads.lru_order()[0]
            seq = self._heads.value(lru)
            self._heads.remove(lru)
            self.sc.seq_rm(seq)
            self._free_head_seqs.append(seq)
        seq = self._free_head_seqs.pop()
        self.sc.seq_rm(seq)
        self.sc.seq_cp(LIVE_SEQ, seq, 0, len(head))
        self._heads.insert(arr, seq)

    def _make_room(self, need: int) -> None:
        """Warm heads hold KV cells of the shared cache: drop them (oldest first) until ``need`` cells of
        the live and sidecar sequences fit next to the prelude and what stays warm."""
        if self._heads is None:
            return
        held = [(s, self.sc.seq_len(s)) for s in range(FIRST_HEAD_SEQ, FIRST_HEAD_SEQ + self.config.warm_heads)]
        total = len(self.prelude) + sum(n for _, n in held)
        for slot in list(self._heads.lru_order()):
            if total + need <= self.n_ctx:
                break
            seq = self._heads.value(slot)
            total -= self.sc.seq_len(seq)
            self._heads.remove(slot)
            self.sc.seq_rm(seq)
            self._free_head_seqs.append(seq)

    def _reuse(self, tokens: Sequence[int]) -> int:
        """Keep the longest prefix of the live sequence that equals ``tokens`` and is an exact text prefill;
        drop the rest. Returns how many positions were kept. (Eval arms that measure a warm prefix cache;
        turns use ``_start``.)"""
        keep = 0
        for a, b in zip(self._live[: self._exact_upto], tokens, strict=False):
            if a != b:
                break
            keep += 1
        self.sc.seq_rm(LIVE_SEQ, keep, -1)
        del self._live[keep:]
        self._exact_upto = min(self._exact_upto, keep)
        return keep

    def _load_prompt(self, seg: PromptSegments, plan: _Plan, reuse_prefix: bool | str,
                     limit: int = 0) -> tuple[int, int]:
        """Put the prompt into the live sequence; returns (recomputed, spliced) token counts.
        ``reuse_prefix``: True (whole units, ``_start``), "lcp" (longest common prefix), False (nothing)."""
        tokens = seg.tokens
        head, view = seg.head, seg.view
        self._make_room(2 * len(tokens) + limit + 64)
        if not reuse_prefix:
            self.forget_live()
        if reuse_prefix == "lcp":
            keep = self._reuse(tokens[:-1])  # at least one token is decoded: its logits start sampling
        elif reuse_prefix:
            keep = self._start(tokens, min(len(head), len(tokens) - 1))
        else:
            keep = 0
        if plan.path == PATH_TEXT:
            self.sc.decode(tokens[keep:], keep)
            self._live, self._exact_upto = list(tokens), len(tokens)
            if reuse_prefix is True:
                self._remember_head(head)
            return 0, 0
        if keep < len(head):
            self.sc.decode(head[keep:], keep)
        self._live = list(head)
        if reuse_prefix is True:
            self._remember_head(head)
        recomputed = self.sc.splice(plan.block, len(head), plan.recompute_pct, schema_tokens=view)
        self.sc.decode(seg.tail, len(head) + len(view))
        self._live = list(tokens)
        exact = plan.anchored or plan.recompute_pct >= 100.0
        self._exact_upto = len(tokens) if exact else len(head)
        return recomputed, len(view)

    def _sidecar_check(self, tokens: list[int], live_logits: np.ndarray) -> tuple[float, bool, np.ndarray]:
        """Text-prefill the same prompt (the pruned window, from position 0) in the sidecar sequence and compare
        its next-token distribution with the spliced live sequence's. The sidecar is left in place."""
        self.sc.seq_rm(SIDECAR_SEQ)
        self.sc.decode(tokens, 0, SIDECAR_SEQ)
        ref = self.sc.logits()
        return kl_divergence(ref, live_logits), int(np.argmax(ref)) == int(np.argmax(live_logits)), ref

    def _turn(self, seg: PromptSegments, arts: ToolArtifacts, limit: int, t0: float, plan: _Plan, *,
              validate: bool = False, reuse_prefix: bool = True, source: str = "",
              request: str = "") -> Iterator[Token | Result]:
        import llama_cpp

        tokens = seg.tokens
        if len(tokens) + limit > self.n_ctx:
            raise ResourceExhausted(
                f"prompt of {len(tokens)} tokens + {limit} to generate exceeds the context of {self.n_ctx}")
        sampler = self._sampler(arts)
        path, reason = plan.path, plan.reason
        v_kl = v_top1 = None
        tp = time.perf_counter()
        recomputed, spliced = self._load_prompt(seg, plan, reuse_prefix, limit)
        prefill_ms = (time.perf_counter() - tp) * 1e3
        logits = self.last_prompt_logits = self.sc.logits()
        if validate:
            self.stats["validations"] += 1
            v_kl, v_top1, ref = self._sidecar_check(tokens, logits)
            if not v_top1:
                # never worse than a full prefill: the sidecar's text prefill becomes the live sequence
                self.stats["validation_fallbacks"] += 1
                self.sc.seq_rm(LIVE_SEQ)
                self.sc.seq_cp(SIDECAR_SEQ, LIVE_SEQ)
                # exact, but decoded in one batch from position 0 rather than as warm units + rest: not
                # reused by later turns, whose K/V must not depend on what ran before them
                self._exact_upto = 0
                logits, path = ref, PATH_TEXT
                reason = f"path B: sidecar validation disagreed with the splice (KL {v_kl:.3g}); text prefill"
            self.sc.seq_rm(SIDECAR_SEQ)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        tracker = JsonObjectTracker()
        pieces: list[str] = []
        first_token_ms = first_arg_ms = 0.0
        n_out = 0
        n_pos = len(tokens)
        closer = self._closer()
        closer.active = closer.in_string = False
        copier = self._copier()
        if copier is not None:
            hints = self.slot_hints(arts.tool, source)
            copier.begin(source, hints, self.slot_silent(arts.tool, hints),
                         choices=self.enum_choices(arts.tool, request or source),
                         order=param_order(arts.tool.input_schema))
        # Past the budget the closer biases toward tokens that close strings/arrays/objects; the grammar
        # still decides what is legal, so the output stays valid JSON for the schema and ends soon.
        hard_stop = limit + 64 + 8 * len(arts.tool.input_schema.get("required", []) or [])
        while True:
            if copier is not None:
                logits = copier(logits)
            tok = sampler.pick(closer(None, logits))
            now = (time.perf_counter() - t0) * 1e3
            if n_out == 0:
                first_token_ms = now
            if tok < 0 or llama_cpp.llama_vocab_is_eog(self.sc.vocab, tok):
                break
            sampler.accept(tok)
            n_out += 1
            piece = decoder.decode(self.llm.detokenize([tok]))
            if piece:
                pieces.append(piece)
                if copier is not None:
                    copier.feed(piece)
                if tracker.feed(piece):
                    first_arg_ms = now
                yield Token(piece)
            if tracker.done or n_out >= hard_stop or n_pos + 1 >= self.n_ctx:
                break
            closer.in_string = tracker.in_string
            if n_out >= limit:
                closer.active = True
            self.sc.decode([tok], n_pos)
            self._live.append(tok)
            n_pos += 1
            logits = self.sc.logits()
        total_ms = (time.perf_counter() - t0) * 1e3
        text = "".join(pieces).strip()
        valid = arts.valid(text)
        if not first_arg_ms:
            first_arg_ms = total_ms  # no argument at all ({}): the whole call is the wait
        self.stats["generations"] += 1
        self.stats["path_" + path] += 1
        self.stats["grammar_fallbacks"] += int(arts.grammar_fallback)
        yield Result(
            tool=arts.tool.name, arguments_json=text, first_token_ms=first_token_ms, first_arg_token_ms=first_arg_ms,
            total_ms=total_ms, prefill_ms=prefill_ms, prompt_tokens=len(tokens), completion_tokens=n_out,
            path=path, path_reason=reason, schema_valid=valid,
            recompute_fraction=plan.recompute_pct if path == PATH_SPLICE else None,
            recomputed_tokens=recomputed if path == PATH_SPLICE else 0,
            spliced_tokens=spliced if path == PATH_SPLICE else 0,
            validation_kl=v_kl, validation_top1=v_top1,
        )

    def _sampler(self, arts: ToolArtifacts) -> GrammarSampler:
        """The turn's grammar sampler; a grammar that does not compile for this vocabulary samples any JSON object
        (logged, counted: the call is still validated against the schema)."""
        try:
            return GrammarSampler(self._vocabulary, arts.grammar)
        except GrammarError as e:
            self.stats["grammar_fallbacks"] += 1
            log.warning("grammar fallback", extra={"tool": arts.tool.name, "error": str(e)[:300]})
            return GrammarSampler(self._vocabulary, grammar_text(ANY_OBJECT))

    def generate_tokens(self, tokens: list[int], arts: ToolArtifacts, limit: int, *, reuse_prefix: bool = True,
                        t0: float | None = None, path_reason: str = "text prefill",
                        source: str = "", request: str = "") -> Iterator[Token | Result]:
        """Text-prefill ``tokens`` (reusing the longest cached prefix when ``reuse_prefix``) and sample the
        arguments under the tool's grammar. The evaluation's arms use this with other prompts (full schema,
        all schemas at the head). ``source``: the text the copy bias copies from (window + request);
        ``request``: the request alone, whose words choose enum options (``source`` when empty)."""
        t0 = time.perf_counter() if t0 is None else t0
        with self.lock:
            seg = PromptSegments(list(tokens), [], [])
            yield from self._turn(seg, arts, limit, t0, _Plan(PATH_TEXT, path_reason),
                                  reuse_prefix="lcp" if reuse_prefix else False,
                                  source=source, request=request)

    def generate_text(self, query: str, history: Sequence[Turn] = (),
                      max_tokens: int | None = None) -> Iterator[Token | Any]:
        """A text answer, no tool: the conversation (``history``, then ``query`` as the last user turn when not
        blank) in the model's own chat template (services/engine/text.py), greedy, no grammar, until the model ends
        its turn or ``max_tokens``. Yields ``Token`` pieces, then one ``TextResult``. The oldest turns after the
        system prompt are left out until the prompt and ``max_tokens`` fit the context (ResourceExhausted when even
        the last turn does not). Prefilled from position 0 each time: the answer does not depend on what ran
        before it."""
        import llama_cpp

        from services.engine.text import TextResult, chat_messages, droppable

        if len(query) > self.config.max_query_chars:
            raise InvalidArgument(f"query is {len(query)} characters; the limit is {self.config.max_query_chars}")
        if len(history) > self.config.max_history_turns:
            raise InvalidArgument(f"history has {len(history)} turns; the limit is {self.config.max_history_turns}")
        limit = bounded_count("max_tokens", max_tokens, default=self.config.default_max_tokens,
                              limit=self.config.max_tokens_limit)
        messages = chat_messages(history, query)
        if not any(m["role"] != "system" for m in messages):
            raise InvalidArgument("nothing to answer: the query and the history hold no user, assistant or tool turn")
        t0 = time.perf_counter()
        with self.lock:
            # the live sequence shares the KV cache with the warm prelude: that much less room
            room = self.n_ctx - len(self.prelude) - 8
            tokens, dropped = self.tokenize_messages(messages), 0
            while len(tokens) + limit > room:
                i = droppable(messages)
                if i is None:
                    raise ResourceExhausted(f"prompt of {len(tokens)} tokens + {limit} to generate exceeds the "
                                            f"{room} positions the context has for a text answer")
                del messages[i]
                tokens, dropped = self.tokenize_messages(messages), dropped + 1
            self._make_room(len(tokens) + limit + 8)
            self.forget_live()
            tp = time.perf_counter()
            self.sc.decode(tokens, 0)
            prefill_ms = (time.perf_counter() - tp) * 1e3
            self._live, self._exact_upto = list(tokens), len(tokens)
            logits = self.sc.logits()
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            pieces: list[str] = []
            first_token_ms, n_out, n_pos, truncated = 0.0, 0, len(tokens), False
            while True:
                tok = int(np.argmax(logits))
                if n_out == 0:
                    first_token_ms = (time.perf_counter() - t0) * 1e3
                if llama_cpp.llama_vocab_is_eog(self.sc.vocab, tok):
                    break
                n_out += 1
                piece = decoder.decode(self.llm.detokenize([tok]))
                if piece:
                    pieces.append(piece)
                    yield Token(piece)
                if n_out >= limit or n_pos + 1 >= self.n_ctx:
                    truncated = True
                    break
                self.sc.decode([tok], n_pos)
                self._live.append(tok)
                n_pos += 1
                logits = self.sc.logits()
            if tail := decoder.decode(b"", final=True):
                pieces.append(tail)
                yield Token(tail)
            self.stats["text_answers"] = self.stats.get("text_answers", 0) + 1
        yield TextResult(text="".join(pieces).strip(), first_token_ms=first_token_ms,
                         total_ms=(time.perf_counter() - t0) * 1e3, prefill_ms=prefill_ms, prompt_tokens=len(tokens),
                         completion_tokens=n_out, truncated=truncated, dropped_turns=dropped)
