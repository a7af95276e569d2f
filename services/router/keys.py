"""Second tool key and lexical score of the SLB (docs/experiments/routing_experiments.md §5).

* Alternate key: ``name (words): first sentence. Parameters: p1, p2, …`` embedded with the base embedder;
  a tool scores the max of its two keys (the description key misses requests that name the tool's
  parameters, the parameter key misses paraphrases of a long description).
* Lexical score: BM25 of the request's query (not its history) over each tool's name (twice), parameter
  names and first description sentence, normalised by the best tool's score, so it lies in [0, 1]. Terse
  requests ("git log /srv/infra …", "dependabot #3 octo-org/web-app") share words with the name that an
  embedding of a short string weighs little.

The gate model's calibration (``training.gate.calibrate_slb``) picks whether to use either, and
the lexical weight, on its validation split.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from services.common.tools import Tool

ALT_KEY_VERSION = "name-sentence-params-v1"
_TOKEN = re.compile(r"[a-z0-9]+")


def first_sentence(desc: str, max_words: int = 24) -> str:
    d = re.sub(r"\s+", " ", desc or "").strip()
    return " ".join(re.split(r"(?<=[.!?])\s", d, maxsplit=1)[0].split(" ")[:max_words])


def alt_tool_text(tool: Tool) -> str:
    """The text of a tool's second SLB key: name as words, first description sentence, parameter names."""
    ns = tool.name.replace("_", " ").replace("-", " ")
    params = ", ".join((tool.input_schema.get("properties") or {}).keys())
    return f"{ns}: {first_sentence(tool.description)} Parameters: {params}"


def tokens(text: str) -> list[str]:
    """Lower-case word tokens; camelCase, snake_case and kebab-case are split."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return _TOKEN.findall(text.lower().replace("_", " "))


def lexical_doc(tool: Tool) -> list[str]:
    params = " ".join((tool.input_schema.get("properties") or {}).keys())
    return tokens(tool.name) * 2 + tokens(params) + tokens(first_sentence(tool.description, 40))


def query_part(routing_text: str) -> str:
    """The query of a routing text (``services.router.context.routing_text``), without the history window."""
    return routing_text.split("\n[context]", 1)[0]


class LexicalIndex:
    """BM25 (k1 1.2, b 0.75) over tools' lexical documents; ``scores`` is normalised to [0, 1] by its max."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75):
        n = len(docs)
        self.n = n
        lens = np.array([len(d) for d in docs], np.float32)
        avg = float(lens.mean()) if n else 1.0
        df = Counter(w for d in docs for w in set(d))
        self._idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
        norm = k1 * (1 - b + b * lens / max(avg, 1e-9))
        # per term: (doc rows, BM25 weight of the term in each of those docs)
        rows: dict[str, tuple[list[int], list[float]]] = {}
        for i, d in enumerate(docs):
            for w, tf in Counter(d).items():
                r = rows.setdefault(w, ([], []))
                r[0].append(i)
                r[1].append(self._idf[w] * tf * (k1 + 1) / (tf + norm[i]))
        self._post = {w: (np.asarray(r, np.int64), np.asarray(v, np.float32)) for w, (r, v) in rows.items()}

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(self.n, np.float32)
        for w in set(tokens(query)):
            post = self._post.get(w)
            if post is not None:
                out[post[0]] += post[1]
        m = float(out.max()) if self.n else 0.0
        return out / m if m > 0 else out

    @classmethod
    def of_tools(cls, tools: Sequence[Tool]) -> LexicalIndex:
        return cls([lexical_doc(t) for t in tools])
