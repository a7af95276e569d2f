"""Choices: the value of an enum or boolean parameter that the request names in its own words.

The slot reader answers with spans of the request, but an enum's value is *mapped* from the wording
("Show me the diff" -> ``method: get_diff``, "cancel it" -> ``cancel_workflow_run``, "newest first" -> ``desc``),
and the 135M model often writes the first or the most frequent option instead (``get``, ``rerun_workflow_run``,
``asc``) or leaves the optional key out. A lexical match settles most of these:

* an option's words (``_``/``-``/camelCase split, lower-cased, light suffix stemming: ``filesystems`` ->
  ``filesystem``, ``creation`` / ``CREATED_AT`` -> ``creat``) are looked up among the request's words;
* the sort-order options ``asc`` / ``desc`` also match their usual wordings ("newest first", "ascending");
* words right after "not", "no", "without", "instead" are not asked for ("the full resource, not a link");
* an option is chosen when it matches at least one word and no other option matches as many words with as few
  unmatched ones (a tie chooses nothing: "request body" vs "response body" of "the response body" for a request).

Booleans (``flag``): a parameter whose every name word the request uses is ``true``, or ``false`` after a negation
("not recursive", "take it out of draft", "un-draft", "don't submit").

On the team's data (gold arguments, no model; ``bench/choice_rules.py``, retired: docs/experiments/README.md): on the tune split's 55 stated enum
arguments the rule chooses 46, 45 of them right; on the 4,056 hand-written augment lines it chooses 645 of 1,059,
620 right (96.1 %), and 103 of 291 stated booleans, 99 right. It fires on 4 of 39 (tune) and 36 of 585 (augment)
enum parameters the request does not state (``merge it`` -> ``merge_method: merge``). The copy bias
(services/engine/copybias.py) holds a chosen parameter pending until it is written and favours the chosen value's
tokens; the grammar still decides what is legal."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

_SUFFIXES = ("ings", "ing", "ions", "ion", "ies", "es", "ed", "s")
# the usual wordings of a sort order; matched as phrases of the request
ORDER_WORDS = {
    "desc": ("newest", "latest", "most recent", "descending", "highest first", "largest first", "biggest first"),
    "asc": ("oldest", "earliest", "ascending", "lowest first", "smallest first"),
}


def stem(word: str) -> str:
    w = word.lower()
    for s in _SUFFIXES:
        if w.endswith(s) and len(w) - len(s) >= 3:
            return w[:-len(s)]
    return w


def words(text: str) -> list[str]:
    """Stemmed lower-case words of ``text`` (identifiers split at ``_``, ``-``, ``.``, ``/`` and camelCase);
    single characters and bare numbers are left out (``-1`` must not match the ``1`` of ``v2.8.1``)."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    return [stem(w) for w in re.findall(r"[A-Za-z][A-Za-z0-9]*", text) if len(w) > 1]


# words that turn the flag a request names off when they come just before it ("not recursive", "don't submit",
# "take it out of draft", "un-draft", "leave out the static"), or "false" just after it
NEGATIONS = frozenset({"not", "no", "non", "without", "don't", "dont", "never", "skip", "exclude", "excluding",
                       "hide", "disable", "off", "un", "out", "leave", "nor", "isn't", "aren't"})
NEGATION_BEFORE = 3  # words
# words after which the next three words are not asked for ("the full resource inline, not a link": resource, not
# resourceLink; "instead of a link"); narrower than NEGATIONS ("roll out the deployment" names a deployment)
NOT_ASKED = frozenset({"not", "no", "without", "instead", "never", "don't", "dont", "except", "excluding"})
_QUOTED = re.compile(r"(?<![A-Za-z0-9])(['\"`“‘])(.+?)(['\"`”’])(?![A-Za-z0-9])")


def unquoted(text: str) -> str:
    """``text`` without its quoted spans: quoted text is a value ('public IP helper'), not an instruction."""
    return _QUOTED.sub(" ", text)


def _raw_words(text: str) -> list[str]:
    """Words of ``text`` as written (camelCase split, apostrophes kept: "don't")."""
    return re.findall(r"[A-Za-z][A-Za-z0-9']*", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text))


def asked_words(request: str) -> list[str]:
    """``words`` of the request, without the three words after a ``NOT_ASKED`` word ("instead of a link")."""
    out, skip = [], 0
    for w in _raw_words(request):
        if w.lower() in NOT_ASKED:
            skip = 3
            continue
        if skip:
            skip -= 1
            continue
        out += words(w)
    return out


def _score(option: str, request_words: set[str], request_lower: str) -> tuple[int, int]:
    ow = words(option)
    matched = sum(1 for w in ow if w in request_words)
    if any(re.search(r"\b" + re.escape(p) + r"\b", request_lower) for p in ORDER_WORDS.get(option.lower(), ())):
        matched += 1
    return matched, -(len(ow) - matched)


def choose(options: Iterable[Any], request: str) -> str | None:
    """The string option ``request`` names (see module doc), or None."""
    opts = [o for o in options if isinstance(o, str) and o]
    if len(opts) < 2 or not request.strip():
        return None
    request = unquoted(request)
    rw, low = set(asked_words(request)), request.lower()
    ranked = sorted(((_score(o, rw, low), o) for o in opts), key=lambda x: x[0], reverse=True)
    (best, option), second = ranked[0], ranked[1][0]
    if best[0] == 0 or best == second:
        return None
    return option


def flag(name: str, request: str) -> bool | None:
    """The value of a boolean parameter ``name`` when the request names it (every word of the name among the
    request's words, quoted text left out): False when a negation comes within ``NEGATION_BEFORE`` words before
    the name or "false" right after it, else True; None when the request does not name it."""
    nw = words(name)
    if not nw:
        return None
    raw = _raw_words(unquoted(request))
    rw = [stem(w) for w in raw]
    if not all(w in rw for w in nw):
        return None
    at = rw.index(nw[0])
    before = {w.lower() for w in raw[max(0, at - NEGATION_BEFORE):at]}
    after = [w.lower() for w in raw[at + len(nw):at + len(nw) + 3]]
    return not (before & NEGATIONS or "false" in after)


def enum_choices(schema: dict[str, Any] | None, request: str) -> dict[str, str]:
    """Top-level parameter -> the value ``request`` names in its words, as JSON text: an enum's option
    (``"get_diff"``) or a boolean's ``true`` / ``false``, for the parameters where one is named."""
    props = (schema or {}).get("properties") or {}
    out: dict[str, str] = {}
    for name, prop in props.items():
        if not isinstance(prop, dict):
            continue
        enum = prop.get("enum")
        if isinstance(enum, list):
            picked = choose(enum, request)
            if picked is not None:
                out[name] = json.dumps(picked)
        elif prop.get("type") == "boolean":
            value = flag(name, request)
            if value is not None:
                out[name] = "true" if value else "false"
    return out
