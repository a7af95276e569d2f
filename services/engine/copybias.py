"""Copy bias: a pointer-style nudge toward copying the user's own words into string argument values.

Small models paraphrase or invent values ("brazen-search-2019" for the quoted phrase 'EU AI Act enforcement
timeline'). Values the user stated must be copied character for character, so while the model writes a JSON
string *value* we add a bias to the tokens that continue a span of the request:

* at the start of a value: tokens that begin a word of the request (small bias: the model may still map
  "Tokyo" to "Asia/Tokyo");
* inside a value whose text so far occurs in the request: the closing quote where the occurrence ends at a quote
  mark or the end of the request.

Grounded values (engine defaults; 99.3 % of the stated non-enum strings in the team's data are verbatim spans):

* span penalty: inside a value that is a span of the request, tokens that neither continue it nor end it at a
  word boundary lose ``span_penalty`` (finite: where the grammar allows none of them, it still decides);
* reuse penalty: a value starting where an earlier value of the call started loses ``reuse_penalty``;
* word penalty: continuing onto the next word of *unquoted* text costs ``word_penalty``;
* slot hints: for a top-level parameter the slot reader (services/engine/slots.py) says a span states, the
  tokens that follow that span, and the closing quote at its end, gain ``hint_bias`` while its value is written;
  once the value has started on the span, tokens that leave it lose ``hint_penalty``;
* key steering: while a top-level key is written, the tokens that spell a hinted parameter not yet written gain
  ``key_bias``, and those that spell only *silent* ones (parameters the reader read and found unstated) lose it
  (the 135M model otherwise writes the run id under ``job_id`` or drops ``commit_title`` for ``commit_message``).

* pending keys: while a hinted parameter is not written yet, tokens that close the top-level object lose
  ``pending_bias`` (the model otherwise stops before stated values), and so do tokens that spell a key the
  grammar's order puts after it (writing one would put the pending parameter out of reach).

* choices: for a top-level enum or boolean parameter whose value the request names in its words
  (services/engine/choices.py: ``get_diff`` for "the diff", ``false`` for "not recursive"), the tokens that spell
  that value gain ``hint_bias`` while it is written (in place of the reader's span and of copying: the value is
  mapped, not copied), and it is pending like a hinted parameter.

Measured per rule on held-out lines (``nexus eval rules``, reports/rules_smollm2-135m.json): a continue bias, a
salient-span bias, a path penalty and an array-closing bias were here and were deleted: off together, SmolLM2's
arguments on 120 held-out lines were the same (0 gained, 0 lost of 237).

The grammar still decides what is legal (enums, formats), so the bias can only choose among valid tokens.
Character-level matching: the request and the value tokenize differently (" EU" vs "EU" after a quote)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

import numpy as np

QUOTES = "'\"`“”‘’"
NUMBER = re.compile(r"-?\d+(\.\d+)?")  # a JSON number as a request states it


def _quoted_positions(source: str) -> np.ndarray:
    """For each character position (and the end): whether it lies inside quoted text. A quote mark toggles
    only at a word edge, so the apostrophe of "O'Hare" or "don't" does not."""
    out = np.zeros(len(source) + 1, dtype=bool)
    inside = False
    for i, ch in enumerate(source):
        if ch in QUOTES:
            before = source[i - 1] if i else " "
            after = source[i + 1] if i + 1 < len(source) else " "
            if not (before.isalnum() and after.isalnum()):
                inside = not inside
        out[i + 1] = inside
    return out


def _identifier_like(word: str) -> bool:
    return any(c in word for c in "/:._-@#=") or any(c.isdigit() for c in word)


CLOSERS = {"(": ")", "[": "]", "{": "}"}


def open_marks(text: str) -> list[str]:
    """The closers ``text`` still owes, innermost last: brackets it opened, and a straight quote or backtick it
    opened (a quote mark at a word edge; the apostrophe of "O'Hare" does not count)."""
    need: list[str] = []
    for i, ch in enumerate(text):
        if ch in CLOSERS:
            need.append(CLOSERS[ch])
        elif need and ch == need[-1] and ch not in "'\"`":
            need.pop()
        elif ch in "'\"`":
            before = text[i - 1] if i else " "
            after = text[i + 1] if i + 1 < len(text) else " "
            if before.isalnum() and after.isalnum():
                continue
            if need and need[-1] == ch:
                need.pop()
            else:
                need.append(ch)
    return need


def _sentence_end(rest: str, value: str = "") -> bool:
    """``rest`` starts with punctuation that ends the sentence (and so the value): a full stop, a closing
    parenthesis, ... followed by whitespace — unless the value so far opened that parenthesis (``count(*) FROM``),
    or it is a semicolon that ends the text (prose ends with a full stop; ``... FROM invoices;`` is a statement)."""
    if not rest or rest[0] not in ".;:!?)" or (len(rest) > 1 and not rest[1].isspace()):
        return False
    if rest[0] == ";" and not rest[1:].strip():
        return False
    return not (rest[0] == ")" and value.count("(") > value.count(")"))


def _json_fragment(piece: str) -> str | None:
    """The text a token writes inside a JSON string (``\\"`` writes ``"``), or None when it cannot sit whole
    inside one (a bare quote, a dangling backslash)."""
    import json

    try:
        return json.loads('"' + piece + '"')
    except ValueError:
        return None


class JsonValueScanner:
    """Follows generated JSON text: whether a string value (not a key) is open, and its text so far."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.in_string = False
        self.escape = False
        self.is_key = False
        self.expect_key = False
        self.partial: list[str] = []
        self.values: list[str] = []  # string values completed so far
        self.key = ""  # the last key completed
        self.key_depth = 0  # nesting depth ("{" / "[" count) at which it was written
        self.bare: list[str] | None = None  # text of a top-level number/literal value being written
        self.top_keys: list[str] = []  # top-level keys written so far

    @property
    def member(self) -> str:
        """The top-level member whose (string) value is open, or "" (nested values have none)."""
        return self.key if self.in_value and self.key_depth == 1 and len(self.stack) == 1 else ""

    @property
    def bare_member(self) -> str:
        """The top-level member whose value is due or being written as a bare literal (a number), or ""."""
        return self.key if self.bare is not None and self.key_depth == 1 and len(self.stack) == 1 else ""

    @property
    def in_value(self) -> bool:
        return self.in_string and not self.is_key

    @property
    def top_key(self) -> str | None:
        """The text so far of a top-level key being written ("" when one is due but not opened), else None."""
        if len(self.stack) != 1:
            return None
        if self.in_string:
            return "".join(self.partial) if self.is_key else None
        return "" if self.expect_key and self.bare is None else None

    def feed(self, text: str) -> None:
        for ch in text:
            if self.in_string:
                if self.escape:
                    self.escape = False
                    self.partial.append({"n": "\n", "t": "\t", "r": "\r"}.get(ch, ch))
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                    if self.is_key:
                        self.expect_key = False
                        self.key, self.key_depth = "".join(self.partial), len(self.stack)
                        if self.key_depth == 1:
                            self.top_keys.append(self.key)
                    else:
                        self.values.append("".join(self.partial))
                else:
                    self.partial.append(ch)
                continue
            if self.bare is not None and not ch.isspace() and ch not in ",}]\"{[":
                self.bare.append(ch)
                continue
            self.bare = None if not ch.isspace() else self.bare
            if ch == ":" and len(self.stack) == 1 and self.key_depth == 1:
                self.bare = []
            elif ch == '"':
                self.in_string, self.partial = True, []
                self.is_key = bool(self.stack) and self.stack[-1] == "{" and self.expect_key
            elif ch in "{[":
                self.stack.append(ch)
                self.expect_key = ch == "{"
            elif ch in "}]":
                if self.stack:
                    self.stack.pop()
                self.expect_key = False
            elif ch == ",":
                self.expect_key = bool(self.stack) and self.stack[-1] == "{"


class CopyBias:
    """Logits processor (see module doc). ``begin(source)`` per request, ``feed(text)`` per sampled piece."""

    def __init__(self, pieces: list[str], *, start_bias: float = 2.0, close_bias: float = 3.0,
                 span_penalty: float = 0.0, reuse_penalty: float = 0.0, word_penalty: float = 0.0,
                 hint_bias: float = 0.0, key_bias: float = 0.0, pending_bias: float = 0.0,
                 hint_penalty: float = 0.0, max_piece_chars: int = 24):
        self.start_bias, self.close_bias = start_bias, close_bias
        self.hint_bias, self.key_bias = hint_bias, key_bias
        self.span_penalty, self.reuse_penalty, self.word_penalty = span_penalty, reuse_penalty, word_penalty
        self.pending_bias, self.hint_penalty = pending_bias, hint_penalty
        self.by_text: dict[str, list[int]] = {}
        self.open_text: dict[str, list[int]] = {}
        close, ends, quotes = [], [], []
        shut, shut_value = [], []  # tokens that close the object: after a value / ending a string value first
        for i, p in enumerate(pieces):
            if not p:
                continue
            bare = "".join(p.split())
            if bare.startswith("}") and set(bare) <= set("}],"):
                shut.append(i)
            if bare.startswith('"}') and set(bare[1:]) <= set("}],"):
                shut_value.append(i)
            if p.strip() == '"':
                quotes.append(i)  # opens a string and writes nothing yet
            if p.startswith('"') and set(p[1:]) <= set(",}] "):
                close.append(i)
            if p.lstrip()[:1] in (",", "}"):
                ends.append(i)  # ends a bare value (a number)
            opened = p[1:] if p.startswith('"') else p[2:] if p.startswith(' "') else ""
            if opened and not any(c in opened for c in '"\\') and all(ord(c) >= 32 for c in opened):
                self.open_text.setdefault(opened, []).append(i)  # opens a string and writes its first text
            if any(ord(c) < 32 for c in p):
                continue
            if '"' in p or "\\" in p:
                text = _json_fragment(p)  # an escape such as \" writes a quote inside the value
                if text is not None and "\\" in p:
                    self.by_text.setdefault(text, []).append(i)
                continue  # a bare quote never continues a value: it closes it
            self.by_text.setdefault(p, []).append(i)
        self.close_ids = np.asarray(close, dtype=np.int64)
        self.shut_ids = np.asarray(shut, dtype=np.int64)
        self.shut_value_ids = np.asarray(shut_value, dtype=np.int64)
        self.end_ids = np.asarray(ends, dtype=np.int64)
        self.quote_ids = np.asarray(quotes, dtype=np.int64)
        self.max_len = min(max_piece_chars, max((len(t) for t in self.by_text), default=1))
        self.source = ""
        self.start_ids = np.zeros(0, dtype=np.int64)
        self.starts_at: dict[int, set[int]] = {}
        self.quoted = np.zeros(0, dtype=bool)
        self.hints: dict[str, tuple[int, int]] = {}
        self.choices: dict[str, str] = {}
        self.choice_text: dict[str, str] = {}  # the string choices, decoded
        self.order: list[str] = []
        self.silent: frozenset[str] = frozenset()
        self.scanner = JsonValueScanner()

    def _prefix_ids(self, rest: str, out: set[int], value: str = "") -> None:
        if _sentence_end(rest, value):
            return  # "… in /srv/app." : the full stop ends the sentence, not the value
        for n in range(1, min(len(rest), self.max_len) + 1):
            ids = self.by_text.get(rest[:n])
            if ids:
                out.update(ids)

    def begin(self, source: str, hints: Mapping[str, tuple[int, int]] | None = None,
              silent: Iterable[str] = (), choices: Mapping[str, str] | None = None,
              order: Iterable[str] = ()) -> None:
        """A new request. ``hints``: top-level parameter -> the (start, end) span of ``source`` the slot reader
        says states it (services/engine/slots.py); while that parameter's value is written, the tokens that
        follow the span gain ``hint_bias`` and, at its end, so does the closing quote. ``silent``: parameters
        the reader read and found unstated (their keys lose ``key_bias``; hinted keys gain it). ``choices``:
        top-level parameter -> the value the request names, as JSON text (an enum option ``"get_diff"``, a
        boolean ``true``; services/engine/choices.py); it replaces that parameter's span hint. ``order``: the
        top-level keys in the order the grammar allows them (``param_order``), for the pending guard."""
        self.source = source
        self.choices = {k: v for k, v in (choices or {}).items() if v}
        self.choice_text = {k: json.loads(v) for k, v in self.choices.items() if v.startswith('"')}
        self.order = list(order)
        self.hints = {k: (int(a), int(b)) for k, (a, b) in (hints or {}).items()
                      if 0 <= a < b <= len(source) and k not in self.choices}
        self.silent = frozenset(silent) - set(self.hints) - set(self.choices)
        self.scanner = JsonValueScanner()
        starts: set[int] = set()
        self.starts_at = {}
        for p, ch in enumerate(source):
            if not ch.isspace() and (p == 0 or not source[p - 1].isalnum()) and ch not in QUOTES:
                here: set[int] = set()
                self._prefix_ids(source[p:], here)
                self.starts_at[p] = here
                starts |= here
        self.start_ids = np.fromiter(sorted(starts), dtype=np.int64, count=len(starts))
        self.quoted = _quoted_positions(source)

    def feed(self, text: str) -> None:
        self.scanner.feed(text)

    def _penalise_reuse(self, out: np.ndarray) -> None:
        """A span the call already used as a value is rarely the next value too (the 135M model otherwise
        repeats one phrase into every slot): tokens that start only at such a span lose ``reuse_penalty``."""
        used: set[int] = set()
        for v in self.scanner.values:
            if not v:
                continue
            p = self.source.find(v)
            while p >= 0:
                used.add(p)
                p = self.source.find(v, p + 1)
        if not used:
            return
        fresh: set[int] = set()
        for p, ids in self.starts_at.items():
            if p not in used:
                fresh |= ids
        stale: set[int] = set()
        for p in used:
            stale |= self.starts_at.get(p, set())
        stale -= fresh
        if stale:
            ids = np.fromiter(stale, dtype=np.int64, count=len(stale))
            out[ids[ids < out.shape[0]]] -= self.reuse_penalty

    @staticmethod
    def _prefix_pieces(table: dict[str, list[int]], text: str, limit: int, lead: str = "") -> set[int]:
        """Tokens of ``table`` whose text is ``lead`` + a prefix of ``text`` (prefixes up to ``limit`` chars)."""
        out: set[int] = set()
        for k in range(1, min(len(text), limit) + 1):
            out.update(table.get(lead + text[:k], ()))
        return out

    @staticmethod
    def _add(out: np.ndarray, ids_set: set[int], amount: float) -> None:
        if ids_set:
            ids = np.fromiter(ids_set, dtype=np.int64, count=len(ids_set))
            out[ids[ids < out.shape[0]]] += amount

    def _follow_hint(self, out: np.ndarray, partial: str) -> None:
        """The slot reader's span for the member being written: its next tokens (or, once the value is the
        whole span, the closing quote) gain ``hint_bias``. A value that has left the span is left alone."""
        start, end = self.hints[self.scanner.member]
        if self.source[start:start + len(partial)] != partial:
            return
        n = out.shape[0]
        if start + len(partial) >= end:  # the span is written: closing gains, running on loses
            keep = np.zeros(n, dtype=bool)
            keep[self.close_ids[self.close_ids < n]] = True
            out[keep] += self.hint_bias
            out[~keep] -= self.hint_bias
            return
        ids = self._prefix_pieces(self.by_text, self.source[start + len(partial):end], self.max_len)
        self._add(out, ids, self.hint_bias)
        if self.hint_penalty and partial:
            keep = np.zeros(n, dtype=bool)
            keep[[i for i in ids if i < n]] = True
            out[~keep] -= self.hint_penalty

    def _follow_bare_hint(self, logits: np.ndarray) -> np.ndarray:
        """A hinted or chosen member whose value is due or being written outside a string: a number's digits or a
        chosen literal's letters (``true``; a leading space allowed before the first), then the end of the value;
        a string's opening tokens that carry the quote and the hint's first characters (``"oct``), and a bare
        opening quote, gain ``hint_bias`` (without the quote, ``"/`` outbid the plain ``"`` before ``src/main.py``
        and the value lost its first word)."""
        member = self.scanner.bare_member
        if member in self.choices:
            text = self.choice_text.get(member, self.choices[member])
            string = member in self.choice_text
        else:
            start, end = self.hints[member]
            text = self.source[start:end]
            string = not NUMBER.fullmatch(text)
        partial = "".join(self.scanner.bare or [])
        out = np.array(logits, copy=True)
        n = out.shape[0]
        if string:
            if partial:
                return logits
            ids_set = self._prefix_pieces(self.open_text, text, self.max_len)
            ids_set.update(int(i) for i in self.quote_ids if i < n)
        elif not text.startswith(partial):
            return logits
        elif len(partial) == len(text):
            out[self.end_ids[self.end_ids < n]] += self.hint_bias
            return out
        else:
            rest = text[len(partial):]
            ids_set = self._prefix_pieces(self.by_text, rest, len(rest))
            if not partial:
                ids_set |= self._prefix_pieces(self.by_text, rest, len(rest), lead=" ")
        self._add(out, ids_set, self.hint_bias)
        return out

    def _follow_choice(self, logits: np.ndarray, partial: str) -> np.ndarray:
        """The value of a parameter with an enum choice is being written: the tokens that spell on toward the
        chosen option (once it is whole, the closing quote) gain ``hint_bias`` and the others lose it (the grammar
        allows only options; +10 alone lost "blocking" to the model's "blocked_by", tune line t-0328). A value that
        has left the choice is left to the model."""
        text = self.choice_text[self.scanner.member]
        if not text.startswith(partial):
            return logits
        out = np.array(logits, copy=True)
        n = out.shape[0]
        keep = np.zeros(n, dtype=bool)
        if len(partial) == len(text):
            keep[self.close_ids[self.close_ids < n]] = True
        else:
            ids = self._prefix_pieces(self.by_text, text[len(partial):], self.max_len)
            keep[[i for i in ids if i < n]] = True
        out[keep] += self.hint_bias
        out[~keep] -= self.hint_bias
        return out

    def _spelling(self, keys: Iterable[str], partial: str) -> set[int]:
        """Tokens that spell on from ``partial`` (a top-level key being written, "" when one is due) toward one of
        ``keys`` not written yet."""
        done = set(self.scanner.top_keys)
        table = self.by_text if partial or self.scanner.in_string else self.open_text
        ids: set[int] = set()
        for k in keys:
            if k not in done and k.startswith(partial) and len(k) > len(partial):
                ids |= self._prefix_pieces(table, k[len(partial):], self.max_len)
        return ids

    def _guard_skip(self, logits: np.ndarray, partial: str) -> np.ndarray:
        """A top-level key is due or being written and the grammar fixes the key order (``order``): tokens that
        spell a key after the first pending parameter (hinted or chosen, not written yet) lose ``pending_bias``,
        since writing it would put the pending one out of reach (``{"name": "pods", ...}`` before
        ``all_namespaces``, tune line t-0616)."""
        pending = (set(self.hints) | set(self.choices)) - set(self.scanner.top_keys)
        first = next((i for i, k in enumerate(self.order) if k in pending), None)
        if first is None:
            return logits
        skip = self._spelling(self.order[first + 1:], partial) - self._spelling(pending, partial)
        if not skip:
            return logits
        out = np.array(logits, copy=True)
        self._add(out, skip, -self.pending_bias)
        return out

    def _steer_key(self, logits: np.ndarray, partial: str) -> np.ndarray:
        """A top-level key is due (``partial`` = "") or being written: tokens spelling on toward a hinted key
        not written yet gain ``key_bias``; tokens that lead only toward silent keys lose it."""
        want = self._spelling(self.hints, partial)
        avoid = self._spelling(self.silent, partial) - want
        if not want and not avoid:
            return logits
        out = np.array(logits, copy=True)
        self._add(out, want, self.key_bias)
        self._add(out, avoid, -self.key_bias)
        return out

    def _hold_open(self, logits: np.ndarray) -> np.ndarray:
        """The top-level object is open and a hinted parameter is not written yet: tokens that would close the
        object lose ``pending_bias`` (the 135M model closed before stated values: ``run_id``, ``commit_title``)."""
        sc = self.scanner
        if len(sc.stack) != 1 or (sc.in_string and not sc.in_value):
            return logits
        if not (set(self.hints) | set(self.choices)) - set(sc.top_keys):
            return logits
        ids = self.shut_value_ids if sc.in_value else self.shut_ids
        out = np.array(logits, copy=True)
        out[ids[ids < out.shape[0]]] -= self.pending_bias
        return out

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if self.pending_bias and (self.hints or self.choices):
            logits = self._hold_open(logits)
            if self.order and self.scanner.top_key is not None:
                logits = self._guard_skip(logits, self.scanner.top_key)
        if self.key_bias and self.source and (self.hints or self.silent):
            partial = self.scanner.top_key
            if partial is not None:
                return self._steer_key(logits, partial)
        if self.hint_bias and self.source and (self.scanner.bare_member in self.hints
                                               or self.scanner.bare_member in self.choices):
            return self._follow_bare_hint(logits)
        if not self.source or not self.scanner.in_value:
            return logits
        partial = "".join(self.scanner.partial)
        if self.hint_bias and self.scanner.member in self.choice_text:
            return self._follow_choice(logits, partial)
        out = np.array(logits, copy=True)
        n = out.shape[0]
        hinted = bool(self.hint_bias) and self.scanner.member in self.hints
        if not partial:
            out[self.start_ids[self.start_ids < n]] += self.start_bias
            if self.reuse_penalty and self.scanner.values:
                self._penalise_reuse(out)
            if hinted:
                self._follow_hint(out, partial)
            return out
        cont: set[int] = set()
        cross: set[int] = set()  # continuations onto the next word of unquoted text
        closes = at_boundary = grounded = False
        owed = open_marks(partial)  # a quote mark the value opened is its own, not the end of a quoted span
        p = self.source.find(partial)
        while p >= 0:
            end = p + len(partial)
            rest = self.source[end:]
            if self.word_penalty and rest[:1].isspace() and not self.quoted[end]:
                self._prefix_ids(rest, cross, partial)
            else:
                self._prefix_ids(rest, cont, partial)
            # the span ends where the request ends, at a quote mark, or at sentence punctuation
            if not rest or (rest[0] in QUOTES and rest[0] not in owed) or _sentence_end(rest, partial) \
                    or rest[0] == ",":
                closes = True
            # an identifier-like word (path, selector, owner/repo, key:name) ends at whitespace
            elif rest[0].isspace() and _identifier_like(partial.rsplit(None, 1)[-1] if partial.strip() else ""):
                closes = True
            # a value may end at any word boundary (owner "octo" of "octo/web"), the model chooses
            if not rest or (not rest[0].isalnum() and not partial[-1].isspace()):
                at_boundary = True
            grounded = True
            p = self.source.find(partial, p + 1)
        if not grounded:
            return out  # not a span of the request (a mapped value such as "Asia/Tokyo"): left alone
        if self.span_penalty:
            # grounded value: only its continuations, or its end at a word boundary, stay competitive; the
            # penalty is finite, so where the grammar allows none of them (enums, formats) it still decides
            keep = np.zeros(n, dtype=bool)
            both = cont | cross
            if both:
                ids = np.fromiter(both, dtype=np.int64, count=len(both))
                keep[ids[ids < n]] = True
            if closes or at_boundary:
                keep[self.close_ids[self.close_ids < n]] = True
            out[~keep] -= self.span_penalty
        # multi-word values are mostly quoted text: running on into the sentence costs a little
        self._add(out, cross - cont, -self.word_penalty)
        if closes:
            out[self.close_ids[self.close_ids < n]] += self.close_bias
        if hinted:
            self._follow_hint(out, partial)
        return out
