"""Grammar engines for tool arguments, side by side: today's path (the compiler's grammar, llguidance on the tool's
JSON Schema made ready by ``schema_for_matcher``: free strings and arrays bounded, objects closed) against llama.cpp's
grammar sampler on the GBNF that llama-cpp-python's ``json_schema_to_gbnf`` writes for that same schema (the engine's
path until llguidance replaced it, without the hand-written extensions it needed), llguidance on that GBNF, and
xgrammar on the GBNF and on the schema, on the vocabularies of SmolLM2-135M (the engine's default) and
Qwen2.5-Coder-0.5B, read from their GGUFs.

For every tool of the registry and every arm: the time from grammar text to a matcher ready to mask (built per turn,
as the engine builds its sampler), whether it compiles at all (and the schema keywords of those that do not), then a
walk over a valid argument JSON (the first line of the query file whose ``args`` the schema
accepts, else a minimal object made from the schema) in the engine model's own tokens: at each step the whole-
vocabulary mask is computed and timed, the gold token must be in it, and after the last token the end of
generation must be; each step's mask is also compared with today's (the same set, stricter, looser, or other). The
arms run interleaved step by step, one thread, so the machine's drift falls on all of them.

    .venv/bin/python bench/grammar.py --json reports/grammar.json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # one thread: before numpy / torch load
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCABS = ("smollm2-135m", "qwen2.5-coder-0.5b")
TODAY = "llguidance/schema"
ARMS = (TODAY, "llama.cpp/gbnf", "llguidance/gbnf", "xgrammar/gbnf", "xgrammar/schema")
# xgrammar on a GBNF spent up to 0.2 s (SmolLM2) and 0.5 s (Qwen) a token inside bounded strings (p99): on every
# schema it alone would take a quarter of an hour
WALK_EVERY = {"xgrammar/gbnf": 20}
# schema keywords that shape a value (what a failure is broken down by); names under properties are not keywords
KEYWORDS = ("type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required", "items",
            "additionalProperties", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "pattern",
            "format", "minLength", "maxLength", "minItems", "maxItems", "dependentRequired", "propertyNames",
            "prefixItems", "not")


class CompileFailed(Exception):
    """The arm has no matcher for this grammar (what it said is the message)."""


class Case(NamedTuple):
    """One tool as every arm sees it: the compiler's grammar (services/compiler/grammar.py; ``fallback``: why it is
    any JSON object), the JSON Schema it is compiled from (``schema_for_matcher``), llama.cpp's GBNF for that schema
    ("" when its converter raises: ``gbnf_error``), and the argument JSON walked (None: none valid)."""

    tool: str
    grammar: str
    fallback: str
    gbnf: str
    gbnf_error: str
    schema: dict
    text: str | None
    source: str
    keywords: list[str]


class Vocab:
    """A GGUF's vocabulary alone (llama.cpp, vocab_only: no weights), tokenizing as the engine does."""

    def __init__(self, name: str, path: Path):
        import llama_cpp

        self.name, self.path = name, path
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab
        self.n = self.llm.n_vocab()
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def pieces(self) -> list[bytes]:
        """Each token's bytes as it lands in the output (control tokens write none)."""
        import llama_cpp

        buf = ctypes.create_string_buffer(1024)
        out = []
        for t in range(self.n):
            k = llama_cpp.llama_token_to_piece(self.vocab, t, buf, len(buf), 0, False)
            out.append(buf.raw[:k])
        return out


def vocab_path(name: str) -> Path:
    from services.common.models import resolve_generator_gguf, small_gguf_path

    return small_gguf_path() if name == "smollm2-135m" else resolve_generator_gguf()


# -- the arms: build(case, warn) -> matcher (raising CompileFailed; warnings an API returns appended to ``warn``,
# what native code prints on stderr is caught by the caller); matcher.fill() computes the next mask (the timed part),
# .allowed() reads it as booleans over the vocabulary, .accept(token) advances. ------------------------------------


class LlamaCppArm:
    """llama.cpp's grammar sampler on the GBNF, built per turn; the mask is its whole-vocabulary scan (logits copied
    into a llama_token_data array, llama_sampler_apply over n_vocab)."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab

    def build(self, case: Case, warn: list[str]) -> Any:
        if case.gbnf_error:
            raise CompileFailed(case.gbnf_error)
        return _LlamaMatcher(self.vocab, case.gbnf)


# llama_token_data {int32 id; float logit; float p;}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


class _LlamaMatcher:
    def __init__(self, vocab: Vocab, gbnf: str):
        import llama_cpp

        self.ll = llama_cpp
        self.smpl = llama_cpp.llama_sampler_init_grammar(vocab.vocab, gbnf.encode("utf-8"), b"root")
        if not self.smpl:
            raise CompileFailed("llama.cpp does not parse the GBNF")
        self.all = np.zeros(vocab.n, dtype=_TOKEN_DATA)
        self.all["id"] = np.arange(vocab.n, dtype=np.int32)
        ptr = llama_cpp.llama_token_data_p
        self.arr = llama_cpp.llama_token_data_array(data=ctypes.cast(self.all.ctypes.data, ptr), size=vocab.n,
                                                    selected=-1, sorted=False)

    def fill(self) -> None:
        self.all["logit"] = 0.0
        self.arr.size, self.arr.selected, self.arr.sorted = len(self.all), -1, False
        self.ll.llama_sampler_apply(self.smpl, ctypes.byref(self.arr))

    def allowed(self) -> np.ndarray:
        return np.isfinite(self.all["logit"])

    def accept(self, token: int) -> bool:
        self.ll.llama_sampler_accept(self.smpl, token)  # only ever a token the mask allowed: llama.cpp aborts else
        return True

    def close(self) -> None:
        if self.smpl:
            self.ll.llama_sampler_free(self.smpl)
            self.smpl = None


class _BitmaskMatcher:
    """A matcher that fills a 32-bit-per-word token bitmask (llguidance's and xgrammar's layout)."""

    def __init__(self, n_vocab: int, fill, accept):
        self.n, self._fill, self._accept = n_vocab, fill, accept
        self.bits = np.full((1, (n_vocab + 31) // 32), -1, dtype=np.int32)

    def fill(self) -> None:
        self._fill(self.bits)

    def allowed(self) -> np.ndarray:
        return np.unpackbits(self.bits.view(np.uint8), bitorder="little")[:self.n].astype(bool)

    def accept(self, token: int) -> bool:
        return bool(self._accept(token))

    def close(self) -> None:
        """Nothing to free by hand: both libraries release a matcher with its last reference."""


class LLGuidanceArm:
    """llguidance: one LLTokenizer per vocabulary (from the llama.cpp vocab); a matcher per turn from the GBNF
    (its own GBNF-to-Lark) or the compiler's grammar (the engine's path). It never raises on a bad grammar: the
    matcher is then in error."""

    def __init__(self, vocab: Vocab, form: str):
        import llguidance
        from llguidance.llamacpp import lltokenizer_from_vocab

        self.ll, self.form, self.n, self.eos = llguidance, form, vocab.n, vocab.eos
        with warnings.catch_warnings():  # it reads each token's attributes by a name llama_cpp deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = lltokenizer_from_vocab(vocab.vocab, eos_token=vocab.eos)

    def build(self, case: Case, warn: list[str]) -> _BitmaskMatcher:
        from llguidance.numpy import fill_next_token_bitmask

        if self.form == "gbnf" and case.gbnf_error:
            raise CompileFailed(case.gbnf_error)
        try:
            grammar = self.ll.grammar_from("gbnf", case.gbnf) if self.form == "gbnf" else case.grammar
        except ValueError as e:
            raise CompileFailed(str(e)) from None
        m = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise CompileFailed(m.get_error())
        warn.extend(m.get_grammar_warnings())
        out = _BitmaskMatcher(self.n, lambda bits: fill_next_token_bitmask(m, bits), m.consume_token)
        eos = self.eos
        # the engine's fast path: the grammar asked about the argmax alone (services/engine/sampling.py)
        out.one_token = lambda t: m.is_accepting() if t == eos else m.validate_tokens([t]) == 1
        return out


class XGrammarArm:
    """xgrammar: one TokenizerInfo (the raw token bytes) and one compiler per vocabulary, its cache off so every
    schema is really compiled, one thread; a compiled grammar, then a matcher, from the GBNF (as its EBNF) or the
    JSON Schema (its defaults: any whitespace, strict mode). A grammar it cannot take raises."""

    def __init__(self, vocab: Vocab, form: str, pieces: list[bytes]):
        import xgrammar

        self.xg, self.form, self.n = xgrammar, form, vocab.n
        info = xgrammar.TokenizerInfo(pieces, xgrammar.VocabType.RAW, vocab_size=vocab.n, stop_token_ids=[vocab.eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def build(self, case: Case, warn: list[str]) -> _BitmaskMatcher:
        try:
            if self.form == "gbnf":
                compiled = self.compiler.compile_grammar(self.xg.Grammar.from_ebnf(case.gbnf))
            else:
                compiled = self.compiler.compile_json_schema(json.dumps(case.schema))
        except Exception as e:  # noqa: BLE001 - its parser and schema converter raise assorted errors
            raise CompileFailed(f"{type(e).__name__}: {e}"[:300]) from None
        m = self.xg.GrammarMatcher(compiled)
        return _BitmaskMatcher(self.n, m.fill_next_token_bitmask, m.accept_token)


def make_arms(vocab: Vocab, names: list[str]) -> dict[str, Any]:
    pieces = vocab.pieces() if any(n.startswith("xgrammar") for n in names) else []
    make = {"llama.cpp/gbnf": lambda: LlamaCppArm(vocab),
            "llguidance/gbnf": lambda: LLGuidanceArm(vocab, "gbnf"),
            "llguidance/schema": lambda: LLGuidanceArm(vocab, "schema"),
            "xgrammar/gbnf": lambda: XGrammarArm(vocab, "gbnf", pieces),
            "xgrammar/schema": lambda: XGrammarArm(vocab, "schema", pieces)}
    return {n: make[n]() for n in names}


# -- the cases ---------------------------------------------------------------------------------------------------


def ordered(value: Any, schema: Any) -> Any:
    """``value`` with each object's keys in the order its schema lists them (every arm's grammar fixes that order:
    the signature's, which schema_for_matcher writes into ``properties``)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is None:  # dependentRequired split into variants: the first that names the keys
            props = next((v["properties"] for v in schema.get("anyOf", [])
                          if isinstance(v, dict) and set(value) <= set(v.get("properties", {}))), {})
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: ordered(value[k], props.get(k)) for k in keys}
    if isinstance(value, list):
        return [ordered(v, schema.get("items")) for v in value]
    return value


def minimal(schema: Any, root: dict) -> Any:
    """A small value of ``schema``: required members only, the first option of every choice."""
    if not isinstance(schema, dict):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return minimal(node, root)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for k in ("anyOf", "oneOf", "allOf"):
        if schema.get(k):
            return minimal(schema[k][0], root)
    t = schema.get("type", "object" if "properties" in schema else "string")
    t = next((x for x in t if x != "null"), "null") if isinstance(t, list) else t
    if t == "object":
        props = schema.get("properties", {})
        return {k: minimal(props.get(k, {}), root) for k in schema.get("required", [])}
    if t == "array":
        return [minimal(schema.get("items", {}), root) for _ in range(schema.get("minItems", 0))]
    if t in ("integer", "number"):
        low = schema["minimum"] if "minimum" in schema else schema.get("exclusiveMinimum", 0) + 1
        return int(low) if t == "integer" else low
    return {"string": "x" * max(1, schema.get("minLength", 1)), "boolean": True}.get(t)


def keywords_of(schema: Any, out: set[str] | None = None) -> set[str]:
    """The KEYWORDS used anywhere in ``schema`` (property names skipped)."""
    out = set() if out is None else out
    if isinstance(schema, list):
        for v in schema:
            keywords_of(v, out)
    elif isinstance(schema, dict):
        for k, v in schema.items():
            if k in KEYWORDS:
                out.add(k)
            if k in ("properties", "$defs", "definitions", "patternProperties") and isinstance(v, dict):
                for sub in v.values():
                    keywords_of(sub, out)
            else:
                keywords_of(v, out)
    return out


def load_cases(tools_dir: str, queries: str, limit: int) -> list[Case]:
    import jsonschema
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from services.common.tools import load_registry_dir
    from services.compiler.grammar import compile_grammar, schema_for_matcher

    tools = load_registry_dir(tools_dir)
    tools = tools[:limit] if limit else tools
    gold: dict[str, list[dict]] = {}
    for line in Path(queries).read_text().splitlines():
        q = json.loads(line)
        if isinstance(q.get("args"), dict):
            gold.setdefault(q["tool"], []).append(q["args"])
    cases = []
    for tool in tools:
        valid = jsonschema.Draft202012Validator(tool.input_schema).is_valid
        value, source = next(((a, "gold") for a in gold.get(tool.name, []) if valid(a)), (None, "none"))
        if value is None and valid(made := minimal(tool.input_schema, tool.input_schema)):
            value, source = made, "generated"
        g = compile_grammar(tool)
        schema, _ = schema_for_matcher(tool)
        try:
            gbnf, gbnf_error = json_schema_to_gbnf(json.dumps(schema)), ""
        except Exception as e:  # noqa: BLE001 - the converter raises assorted errors on exotic schemas
            gbnf, gbnf_error = "", f"json_schema_to_gbnf: {type(e).__name__}: {e}"[:300]
        text = None if value is None else json.dumps(ordered(value, schema), ensure_ascii=False)
        cases.append(Case(tool.name, g.text, g.reason if g.fallback else "", gbnf, gbnf_error, schema, text, source,
                          sorted(keywords_of(tool.input_schema))))
    return cases


# -- the run -----------------------------------------------------------------------------------------------------


def new_record() -> dict[str, Any]:
    """One arm's raw measurements on one vocabulary (run_vocab's compiles, then walk's steps)."""
    return {"compile_ms": [], "mask_us": [], "accept_us": [], "one_token_us": [], "vs_today": [], "rejected": [],
            "failed": [], "warned": {}, "walked": 0}


def walk(case: Case, vocab: Vocab, matchers: dict[str, Any], rec: dict[str, dict]) -> None:
    """Every arm's masks along ``case.text``'s tokens and the end of generation, interleaved step by step."""
    tokens = vocab.tokenize(case.text) + [vocab.eos]
    live = dict(matchers)
    names = list(live)
    for step, tok in enumerate(tokens):
        masks = {}
        order = names[step % len(names):] + names[:step % len(names)]  # who goes first rotates
        for name in order:
            m = live.get(name)
            if m is None:
                continue
            if name == TODAY:
                t0 = time.perf_counter()
                m.one_token(tok)
                rec[name]["one_token_us"].append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            m.fill()
            rec[name]["mask_us"].append((time.perf_counter() - t0) * 1e6)
            masks[name] = m.allowed()
        ref = masks.get(TODAY)
        for name, ok in masks.items():
            r = rec[name]
            if ref is not None:
                r["vs_today"].append(relation(ok, ref))
            accepted = bool(ok[tok])
            if accepted and tok != vocab.eos:
                t0 = time.perf_counter()
                accepted = live[name].accept(tok)
                r["accept_us"].append((time.perf_counter() - t0) * 1e6)
            if not accepted:
                r["rejected"].append({"tool": case.tool, "step": step, "of": len(tokens),
                                      "token": vocab.llm.detokenize([tok]).decode("utf-8", "replace"),
                                      "after": vocab.llm.detokenize(tokens[:step]).decode("utf-8", "replace")[-60:]})
                live[name] = None
        if not any(live.values()):
            break
    for name, m in live.items():
        if m is not None:
            rec[name]["walked"] += 1


@contextlib.contextmanager
def native_stderr(into: list[str]):
    """What native code writes to file descriptor 2 inside the block (xgrammar's converter warns there when it
    relaxes a schema), appended to ``into`` line by line without its time stamp and source location."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            into.extend(re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", ln) for ln in f.read().decode("utf-8", "replace").splitlines()
                        if ln.strip())


RELATIONS = ("same", "stricter", "looser", "other")


def relation(mask: np.ndarray, today: np.ndarray) -> str:
    """How an arm's mask at a step relates to today's: the same set, a strict subset (``stricter``), a strict
    superset (``looser``), or each allows a token the other does not (``other``)."""
    extra, missing = bool((mask & ~today).any()), bool((today & ~mask).any())
    return "same" if not (extra or missing) else "stricter" if not extra else "looser" if not missing else "other"


def quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    a = np.asarray(xs)
    return {"n": len(xs), "p50": round(float(np.percentile(a, 50)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3), "mean": round(float(a.mean()), 3)}


def run_vocab(vocab: Vocab, cases: list[Case], names: list[str], every: dict[str, int]) -> dict[str, Any]:
    """Every arm on every case of ``vocab``; an arm in ``every`` walks only every K-th case (it still compiles
    all)."""
    t0 = time.perf_counter()
    arms = make_arms(vocab, names)
    setup_s = time.perf_counter() - t0
    rec = {n: new_record() for n in names}
    for i, case in enumerate(cases):
        matchers = {}
        for name in names[i % len(names):] + names[:i % len(names)]:
            warn: list[str] = []
            with native_stderr(warn):
                t = time.perf_counter()
                try:
                    matchers[name] = arms[name].build(case, warn)
                    rec[name]["compile_ms"].append((time.perf_counter() - t) * 1e3)
                except CompileFailed as e:
                    rec[name]["failed"].append({"tool": case.tool, "error": str(e)[:300], "keywords": case.keywords})
            if warn:
                rec[name]["warned"][case.tool] = warn
        walking = {n: m for n, m in matchers.items() if i % every.get(n, 1) == 0}
        if case.text is not None and walking:
            walk(case, vocab, walking, rec)
        for m in matchers.values():
            m.close()
        if (i + 1) % 25 == 0 or i + 1 == len(cases):
            print(f"[{vocab.name}] {i + 1}/{len(cases)} schemas, {time.perf_counter() - t0:.0f} s", file=sys.stderr,
                  flush=True)
    out: dict[str, Any] = {"gguf": vocab.path.name, "n_vocab": vocab.n, "setup_s": round(setup_s, 2), "arms": {}}
    for name, r in rec.items():
        failed_kw: dict[str, int] = {}
        for f in r["failed"]:
            for k in f["keywords"]:
                failed_kw[k] = failed_kw.get(k, 0) + 1
        arm = {"compile_ms": quantiles(r["compile_ms"]), "mask_us": quantiles(r["mask_us"]),
               "accept_us": quantiles(r["accept_us"]),
               "compiled": len(cases) - len(r["failed"]), "failed": r["failed"],
               "failed_by_keyword": dict(sorted(failed_kw.items(), key=lambda kv: -kv[1])), "warned": r["warned"],
               "walked": r["walked"], "walkable": sum(c.text is not None for c in cases[::every.get(name, 1)]),
               "walk_every": every.get(name, 1), "rejected": r["rejected"],
               "vs_today": {k: round(r["vs_today"].count(k) / len(r["vs_today"]), 4) for k in RELATIONS}
               if r["vs_today"] else None}
        if name == TODAY:
            arm["one_token_us"] = quantiles(r["one_token_us"])
        out["arms"][name] = arm
    return out


def plot(report: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vocabs = list(report["vocabs"])
    arms = list(report["vocabs"][vocabs[0]]["arms"])
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    lowest = 100.0
    width = 0.8 / len(vocabs)
    x = np.arange(len(arms))
    for j, v in enumerate(vocabs):
        a = report["vocabs"][v]["arms"]
        for ax, key, scale in ((axes[0], "compile_ms", 1.0), (axes[1], "mask_us", 1e-3)):
            p50 = [a[n][key].get("p50", 0) * scale for n in arms]
            p99 = [a[n][key].get("p99", 0) * scale for n in arms]
            ax.bar(x + j * width, p50, width, label=f"{v} p50", color=f"C{j}")
            ax.scatter(x + j * width, p99, marker="_", s=200, color="k", label="p99" if j == 0 else None, zorder=3)
        compiles = [100 * a[n]["compiled"] / report["schemas"] for n in arms]
        walked = [100 * a[n]["walked"] / max(1, a[n]["walkable"]) for n in arms]
        lowest = min(lowest, *compiles, *walked)
        axes[2].bar(x + j * width, compiles, width, color=f"C{j}", label=f"{v}: compiles")
        axes[2].scatter(x + j * width, walked, marker="o", color="k", s=12,
                        label="gold JSON walked to the end" if j == 0 else None, zorder=3)
    for j, v in enumerate(vocabs):
        if TODAY in arms:
            axes[1].scatter([arms.index(TODAY) + j * width], [report["vocabs"][v]["arms"][TODAY]["one_token_us"]["p50"]
                                                              * 1e-3], marker="*", s=80, color="r", zorder=4,
                            label="llama.cpp one-token check p50 (engine's fast path)" if j == 0 else None)
    titles = ("compile to a ready matcher (ms, log)", "per-token mask, whole vocabulary (ms, log)",
              f"coverage of {report['schemas']} schemas (%)")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks(x + width * (len(vocabs) - 1) / 2, [n.replace("/", "\n") for n in arms], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[2].set_ylim(max(0.0, lowest - 5), 100.5)
    fig.suptitle("grammar engines for tool arguments (1 thread, arms interleaved)", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def summary(report: dict) -> dict:
    return {v: {n: {"compile_ms_p50": a["compile_ms"].get("p50"), "mask_us_p50": a["mask_us"].get("p50"),
                    "mask_us_p99": a["mask_us"].get("p99"), "compiled": a["compiled"],
                    "walked": f"{a['walked']}/{a['walkable']}", "vs_today": a["vs_today"]}
                for n, a in r["arms"].items()}
            for v, r in report["vocabs"].items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default=str(REPO / "data" / "mcp_tools"))
    ap.add_argument("--queries", default=str(REPO / "data" / "queries" / "train.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="the first N tools of the registry (0 = all)")
    ap.add_argument("--vocabs", default=",".join(VOCABS), help=f"comma-separated, of {', '.join(VOCABS)}")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--walk-every", action="append", default=[], metavar="ARM=K",
                    help="walk ARM over every K-th schema only (it still compiles all): for an arm too slow for "
                         f"all of them (default: {', '.join(f'{k}={v}' for k, v in WALK_EVERY.items())})")
    ap.add_argument("--json", default="reports/grammar.json")
    a = ap.parse_args(argv)
    vocabs = [v for v in a.vocabs.split(",") if v]
    arms = [n for n in a.arms.split(",") if n]
    if not vocabs or set(vocabs) - set(VOCABS):
        ap.error(f"--vocabs: of {', '.join(VOCABS)}")
    if not arms or set(arms) - set(ARMS):
        ap.error(f"--arms: of {', '.join(ARMS)}")
    if a.limit < 0:
        ap.error("--limit must be 0 (all) or more")
    every = dict(WALK_EVERY)
    for spec in a.walk_every:
        arm, _, k = spec.partition("=")
        if arm not in ARMS or not k.isdigit() or int(k) < 1:
            ap.error(f"--walk-every: ARM=K (K >= 1) with ARM of {', '.join(ARMS)}, not {spec!r}")
        every[arm] = int(k)

    t0 = time.perf_counter()
    cases = load_cases(a.tools, a.queries, a.limit)
    sources = {s: sum(c.source == s for c in cases) for s in ("gold", "generated", "none")}
    print(f"{len(cases)} schemas ({sources}), {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "schemas": len(cases), "args_source": sources,
        "today_fallbacks": [{"tool": c.tool, "reason": c.fallback} for c in cases if c.fallback],
        "threads": 1, "vocabs": {},
    }
    for name in vocabs:
        vocab = Vocab(name, vocab_path(name))
        report["vocabs"][name] = run_vocab(vocab, cases, arms, every)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    from evals.routing import write_report

    write_report(a.json, report, plot, echo=[summary(report)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
