"""Copy bias: a pointer-style nudge toward copying the user's own words into string argument values.

Small models paraphrase or invent values ("brazen-search-2019" for the quoted phrase 'EU AI Act enforcement
timeline'). Values the user stated must be copied character for character, so while the model writes a JSON
string *value* we add a bias to the tokens that continue a span of the request:

* at the start of a value: tokens that begin a word of the request (small bias: the model may still map
  "Tokyo" to "Asia/Tokyo"), more for salient spans (quoted text, paths, URLs, identifiers, numbers);
* inside a value whose text so far occurs in the request: tokens that continue one of those occurrences
  (larger bias), and the closing quote where the occurrence ends at a quote mark or the end of the request.

The grammar still decides what is legal (enums, formats), so the bias can only choose among valid tokens.
Character-level matching: the request and the value tokenize differently (" EU" vs "EU" after a quote)."""

from __future__ import annotations

import numpy as np

_QUOTES = "'\"`“”‘’"


def _salient(source: str, p: int) -> bool:
    """Spans that are almost always values when a request contains them: quoted text, and tokens that look
    like identifiers (paths, URLs, owner/repo, key:name, dotted names, numbers)."""
    if p > 0 and source[p - 1] in _QUOTES:
        return True
    end = p
    while end < len(source) and not source[end].isspace():
        end += 1
    word = source[p:end].rstrip(".,;:!?)")
    return any(c in word for c in "/:._-@#=") or any(c.isdigit() for c in word)


class JsonValueScanner:
    """Follows generated JSON text: whether a string value (not a key) is open, and its text so far."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.in_string = False
        self.escape = False
        self.is_key = False
        self.expect_key = False
        self.partial: list[str] = []

    @property
    def in_value(self) -> bool:
        return self.in_string and not self.is_key

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
                else:
                    self.partial.append(ch)
                continue
            if ch == '"':
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

    def __init__(self, pieces: list[str], *, start_bias: float = 2.0, continue_bias: float = 5.0,
                 close_bias: float = 3.0, salient_bias: float = 2.0, max_piece_chars: int = 24):
        self.start_bias, self.continue_bias, self.close_bias = start_bias, continue_bias, close_bias
        self.salient_bias = salient_bias
        self.by_text: dict[str, list[int]] = {}
        close = []
        for i, p in enumerate(pieces):
            if not p:
                continue
            if p.startswith('"') and set(p[1:]) <= set(",}] "):
                close.append(i)
            if '"' in p or "\\" in p or any(ord(c) < 32 for c in p):
                continue  # never copied verbatim into a JSON string
            self.by_text.setdefault(p, []).append(i)
        self.close_ids = np.asarray(close, dtype=np.int64)
        self.max_len = min(max_piece_chars, max((len(t) for t in self.by_text), default=1))
        self.source = ""
        self.start_ids = np.zeros(0, dtype=np.int64)
        self.salient_ids = np.zeros(0, dtype=np.int64)
        self.scanner = JsonValueScanner()

    def _prefix_ids(self, rest: str, out: set[int]) -> None:
        for n in range(1, min(len(rest), self.max_len) + 1):
            ids = self.by_text.get(rest[:n])
            if ids:
                out.update(ids)

    def begin(self, source: str) -> None:
        self.source = source
        self.scanner = JsonValueScanner()
        starts: set[int] = set()
        salient: set[int] = set()
        for p, ch in enumerate(source):
            if not ch.isspace() and (p == 0 or not source[p - 1].isalnum()) and ch not in _QUOTES:
                self._prefix_ids(source[p:], starts)
                if _salient(source, p):
                    self._prefix_ids(source[p:], salient)
        self.start_ids = np.fromiter(sorted(starts), dtype=np.int64, count=len(starts))
        self.salient_ids = np.fromiter(sorted(salient), dtype=np.int64, count=len(salient))

    def feed(self, text: str) -> None:
        self.scanner.feed(text)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if not self.source or not self.scanner.in_value:
            return logits
        partial = "".join(self.scanner.partial)
        out = np.array(logits, copy=True)
        n = out.shape[0]
        if not partial:
            out[self.start_ids[self.start_ids < n]] += self.start_bias
            out[self.salient_ids[self.salient_ids < n]] += self.salient_bias
            return out
        cont: set[int] = set()
        closes = False
        p = self.source.find(partial)
        while p >= 0:
            end = p + len(partial)
            rest = self.source[end:]
            self._prefix_ids(rest, cont)
            # the span ends where the request ends, at a quote mark, or at sentence punctuation
            if not rest or rest[0] in _QUOTES or (rest[0] in ".,;:!?)" and (len(rest) == 1 or rest[1].isspace())):
                closes = True
            p = self.source.find(partial, p + 1)
        if cont:
            ids = np.fromiter(cont, dtype=np.int64, count=len(cont))
            out[ids[ids < n]] += self.continue_bias
        if closes:
            out[self.close_ids[self.close_ids < n]] += self.close_bias
        return out
