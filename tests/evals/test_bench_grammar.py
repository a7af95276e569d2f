"""bench/grammar.py on the SmolLM2 vocabulary: on the registry's first 3 tools every arm compiles, its masks let
every token of the gold argument JSON through and then the end of generation, the report says so per arm and the
plot is written; a JSON that breaks its schema is stopped by every arm's mask at the token that breaks it; bad flags
are clear errors."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_bench

VOCAB = "smollm2-135m"


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "bench" / "grammar.py"), "--json", str(tmp_path / "g.json"),
                           *extra], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_every_arm_compiles_and_lets_the_gold_arguments_through(tmp_path):
    bench = load_bench("grammar")
    out = _run(tmp_path, "--limit", "3", "--vocabs", VOCAB)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads((tmp_path / "g.json").read_text())
    assert rep["schemas"] == 3 and rep["args_source"]["gold"] == 3 and list(rep["vocabs"]) == [VOCAB]
    arms = rep["vocabs"][VOCAB]["arms"]
    assert list(arms) == list(bench.ARMS)
    for name, a in arms.items():
        # what an arm cannot compile is reported with its error and the schema's keywords (llguidance's GBNF-to-Lark
        # refuses the converter's bounded strings as too deeply nested)
        assert a["compiled"] + len(a["failed"]) == 3 and all(f["error"] and f["keywords"] for f in a["failed"])
        if name in (bench.TODAY, "llama.cpp/gbnf"):
            assert a["compiled"] == 3, (name, a["failed"])
        if not a["compiled"]:
            continue
        # every gold token (and the end of generation after it) was in the arm's mask: the walk reached the end
        assert a["rejected"] == [] and a["walked"] == a["walkable"] > 0, (name, a["rejected"])
        assert a["compile_ms"]["n"] == a["compiled"] and 0 < a["mask_us"]["p50"] <= a["mask_us"]["p99"]
        assert sum(a["vs_today"].values()) == pytest.approx(1.0, abs=1e-3)  # rounded shares
    assert arms[bench.TODAY]["vs_today"]["same"] == 1.0 and arms[bench.TODAY]["one_token_us"]["n"] > 0
    # the walk-every default: xgrammar on the GBNF walks the first schema only
    assert arms["xgrammar/gbnf"]["walk_every"] == 20 and arms["xgrammar/gbnf"]["walkable"] == 1
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_json_that_breaks_its_schema_is_stopped_at_the_breaking_token():
    bench = load_bench("grammar")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    from services.common.tools import parse_tool
    from services.compiler.grammar import compile_grammar, schema_for_matcher

    tool = parse_tool({"name": "count", "description": "", "inputSchema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}})
    text = '{"n": "five"}'
    schema, _ = schema_for_matcher(tool)
    case = bench.Case(tool.name, compile_grammar(tool).text, "", json_schema_to_gbnf(json.dumps(schema)), "", schema,
                      text, "gold", ["type"])
    vocab = bench.Vocab(VOCAB, bench.vocab_path(VOCAB))
    arms = bench.make_arms(vocab, list(bench.ARMS))
    rec = {n: bench.new_record() for n in arms}
    bench.walk(case, vocab, {n: arm.build(case, []) for n, arm in arms.items()}, rec)
    assert [vocab.llm.detokenize([t]) for t in vocab.tokenize(text)][3] == b' "'  # opens a string: the bad token
    for name, r in rec.items():
        assert r["walked"] == 0 and r["rejected"] == [
            {"tool": "count", "step": 3, "of": 7, "token": ' "', "after": '{"n":'}], name
        assert len(r["mask_us"]) == 4  # no arm is asked past the token it refused


@pytest.mark.parametrize("flags, message", [
    (["--vocabs", "gpt2"], "--vocabs: of smollm2-135m, qwen2.5-coder-0.5b"),
    (["--arms", "outlines"], "--arms: of llguidance/schema, llama.cpp/gbnf"),
    (["--walk-every", "xgrammar/gbnf=0"], "--walk-every: ARM=K (K >= 1)"),
])
def test_bad_flags_are_clear_errors(tmp_path, flags, message):
    out = _run(tmp_path, *flags)
    assert out.returncode == 2 and message in out.stderr
