"""`nexus eval formats`: Qwen's native tool-call format vs the engine's prompt; the format is the template's own."""

import json

import pytest

from evals import formats as F
from evals.stats import paired
from services.common.models import resolve_generator_gguf
from services.common.tools import Tool
from services.runtime.prompt import CHATML, SYSTEM, ChatTemplate, Turn

TOOL = Tool("get_x", "Get <the> x & 'y'", {"type": "object", "properties": {"a": {"type": "string"}},
                                            "required": ["a"]})


@pytest.fixture(scope="module")
def qwen_template() -> ChatTemplate:
    import llama_cpp

    llm = llama_cpp.Llama(str(resolve_generator_gguf()), vocab_only=True, verbose=False)
    return ChatTemplate(llm.metadata["tokenizer.chat_template"])


def test_the_native_prompt_is_what_qwens_own_template_writes_for_the_tool(qwen_template):
    window = [Turn("user", "earlier"), Turn("assistant", "ok")]
    msgs = [{"role": "system", "content": SYSTEM}] + [{"role": t.role, "content": t.content} for t in window]
    own = qwen_template.render(msgs + [{"role": "user", "content": "q"}], tools=[F.openai_function(TOOL)])
    ours = F.format_prompt(qwen_template, "native + schema", TOOL, "get_x(a: str)", "q", window)
    assert ours == own + '<tool_call>\n{"name": "get_x", "arguments": '
    assert "<the> x & 'y'" in own  # JSON as Hugging Face writes it: no HTML escaping
    sig = F.format_prompt(qwen_template, "native + signature", TOOL, "get_x(a: str)", "q", window)
    assert "<tools>\nget_x(a: str)\n</tools>" in sig and sig.endswith(F.call_head("get_x"))
    base = F.format_prompt(qwen_template, F.BASE, TOOL, "get_x(a: str)", "q", window)
    assert "Function: get_x(a: str)" in base and "<tools>" not in base and base.endswith("<|im_start|>assistant\n")
    assert F.supports_native(qwen_template) and not F.supports_native(ChatTemplate(CHATML))


def test_a_template_without_tools_ignores_them():
    out = ChatTemplate(CHATML).render([{"role": "user", "content": "q"}], tools=[F.openai_function(TOOL)])
    assert out == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"


def test_each_native_format_is_paired_with_the_engine_prompt_per_argument():
    def line(base, sig, schema):
        return {"arms": {F.BASE: {"args": base, "valid": True, "prompt_tokens": 10},
                         "native + signature": {"args": sig, "valid": True, "prompt_tokens": 9},
                         "native + schema": {"args": schema, "valid": False, "prompt_tokens": 30}}}

    s = F.summarize([line([True, False], [True, True], [False, False])] * 8)
    assert s["args"] == 16 and s["formats"][F.BASE]["arg_accuracy"] == 0.5
    sig, schema = s["formats"]["native + signature"], s["formats"]["native + schema"]
    assert (sig["vs_engine_prompt"]["gained"], sig["vs_engine_prompt"]["lost"]) == (8, 0)
    assert sig["vs_engine_prompt"]["verdict"] == "gains" and schema["vs_engine_prompt"]["verdict"] == "loses"
    assert schema["schema_valid"] == 0.0 and schema["prompt_tokens_median"] == 30


def test_paired_trials_must_be_the_same_items():
    assert paired([True, False, True], [False, False, True])["net"] == 1
    with pytest.raises(ValueError):
        paired([True], [True, False])


@pytest.mark.integration
def test_a_real_run_on_qwen_resumes_from_its_checkpoint(tmp_path):
    out = tmp_path / "formats.json"
    kw = dict(model_path=str(resolve_generator_gguf()), limit=2, workdir=str(tmp_path / "w"), progress=False)
    rep = F.evaluate("data/queries/train.jsonl", "data/mcp_tools", str(out), **kw)
    assert rep["lines"] == 2 and rep["args"] >= 2 and set(rep["formats"]) == set(F.FORMATS)
    for fmt in F.FORMATS:
        assert rep["formats"][fmt]["schema_valid"] == 1.0  # the grammar holds in every format
    line = rep["per_line"][0]["arms"]
    assert line["native + schema"]["prompt_tokens"] > line["native + signature"]["prompt_tokens"]
    assert out.with_suffix(".png").is_file()
    again = F.evaluate("data/queries/train.jsonl", "data/mcp_tools", str(out), **kw)  # every line checkpointed
    assert again["formats"] == rep["formats"] and json.loads(out.read_text())["lines"] == 2


def test_smollm2s_template_has_no_native_format(tmp_path):
    from services.common.models import resolve_gguf

    with pytest.raises(ValueError, match="no tool-call format"):
        F.evaluate("data/queries/train.jsonl", "data/mcp_tools", str(tmp_path / "f.json"),
                   model_path=str(resolve_gguf("")), limit=1, workdir=str(tmp_path / "w"), progress=False)
