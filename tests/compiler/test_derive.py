"""Derived requests (services/compiler/derive.py): the prompt and reply parsing, the content address, the batch
file, the compiler's background worker, and the real generator (Qwen2.5-Coder-0.5B-Instruct) end to end through
RegisterTools, ListTools and Route."""

import json
import time

import numpy as np
import pytest

from services.common.store import LocalStore
from services.common.tools import Tool
from services.compiler import derive

TOOL = Tool("shop_refund_order", "Refund a customer's order, fully or in part.",
            {"type": "object", "required": ["order_id"],
             "properties": {"order_id": {"type": "string", "description": "Order number"},
                            "amount": {"type": "number", "description": "Amount to refund; all when absent"},
                            "reason": {"type": "string", "enum": ["damaged", "late", "other"]}}})


def test_the_prompt_holds_the_tool_its_parameters_and_one_worked_example():
    msgs = derive.messages(TOOL)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    last = msgs[-1]["content"]
    assert "shop_refund_order" in last and "Refund a customer's order" in last
    assert "- order_id (string, required): Order number" in last
    assert '- reason (one of "damaged", "late", "other")' in last
    assert "invoice_send" in msgs[1]["content"] and msgs[2]["content"].startswith("1. ")
    assert derive.parameters_text(Tool("x", "d", {"type": "object"})) == "(none)"


def test_a_reply_is_parsed_into_requests_without_the_tools_name():
    reply = ("Sure! Here are some:\n1. Refund order 88123, it arrived broken\n2) \"How can I use the "
             "`shop_refund_order` tool to refund order A-1?\"\n- refund 20 EUR on order 5531\n3. ok\n"
             "4. Refund order 88123, it arrived broken\n5. please call shop_refund_order for order 7")
    got = derive.parse_requests(reply, TOOL, 8)
    assert got == ["Refund order 88123, it arrived broken", "Refund order A-1?", "Refund 20 EUR on order 5531",
                   "Please for order 7"] or got[:3] == ["Refund order 88123, it arrived broken", "Refund order A-1?",
                                                        "Refund 20 EUR on order 5531"]
    assert all("shop_refund_order" not in r for r in got)
    assert derive.parse_requests(reply, TOOL, 2) == got[:2]
    assert derive.parse_requests("no list here", TOOL, 5) == []


def test_quotes_inside_a_request_are_kept_and_only_a_wrapping_pair_is_removed():
    reply = ('1. Echo "Hello, world!"\n2. "Refund order "A-1" today"\n3. \u201cRefund order 9 please\u201d\n'
             '4. "Refund order 12 now"')
    assert derive.parse_requests(reply, TOOL, 8) == ['Echo "Hello, world!"', 'Refund order "A-1" today',
                                                      "Refund order 9 please", "Refund order 12 now"]


def test_the_content_address_is_the_schema_and_the_generator():
    fp = derive.generator_fingerprint("a" * 64)
    assert fp != derive.generator_fingerprint("b" * 64)
    assert fp != derive.generator_fingerprint("a" * 64, derive.DeriveSettings(n=6))
    other = Tool(TOOL.name, TOOL.description + " Partial refunds need a reason.", TOOL.input_schema)
    assert derive.derived_key(TOOL, fp) != derive.derived_key(other, fp)  # same name, another tool
    assert derive.derived_key(TOOL, fp) != derive.derived_key(TOOL, derive.generator_fingerprint("b" * 64))
    data = derive.encode_derived(TOOL, ["refund order 1"], {"fingerprint": fp})
    assert derive.decode_derived(data) == ["refund order 1"]
    with pytest.raises(ValueError):
        derive.decode_derived(b'{"requests": [1, 2]}')
    # the router's default fingerprint is the pinned model's, computed without loading it
    from services.common.models import GENERATOR_MODEL, gguf_manifest

    assert derive.default_fingerprint() == derive.generator_fingerprint(gguf_manifest()[GENERATOR_MODEL]["sha256"])


def test_sampling_is_greedy_at_temperature_zero_and_stays_in_the_nucleus():
    logits = np.array([0.0, 5.0, 4.9, -3.0, 1.0], np.float32)
    rng = np.random.default_rng(0)
    assert derive.sample(logits, rng, 0.0, 0.9) == 1
    picks = {derive.sample(logits, rng, 1.0, 0.9) for _ in range(200)}
    assert picks <= {1, 2, 4} and {1, 2} <= picks
    assert {derive.sample(logits, rng, 1.0, 0.01) for _ in range(50)} == {1}


class FakeGenerator:
    """One layer's stand-in (the real one is tested below): a deterministic reply per tool."""

    parallel = 2

    def __init__(self, fingerprint="f" * 64):
        self.fingerprint = fingerprint
        self.calls: list[list[str]] = []

    def describe(self):
        return {"fingerprint": self.fingerprint}

    def generate_many(self, tools):
        self.calls.append([t.name for t in tools])
        return [[f"do the {t.name} thing now", f"please {t.name} again"] for t in tools]

    def close(self):
        pass


def _tools(n):
    return [Tool(f"t{i}", f"tool number {i}", {"type": "object"}) for i in range(n)]


def test_derive_file_writes_resumes_and_refuses_another_generators_file(tmp_path):
    path = str(tmp_path / "req.jsonl")
    gen = FakeGenerator()
    assert derive.derive_file(_tools(3), path, gen, progress=False) == 3
    assert derive.derive_file(_tools(5), path, gen, progress=False) == 2  # only the two new ones
    header, reqs = derive.read_requests_file(path)
    assert header["fingerprint"] == gen.fingerprint and len(reqs) == 5
    assert reqs[_tools(5)[4].schema_hash] == ["do the t4 thing now", "please t4 again"]
    with pytest.raises(ValueError, match="another file"):
        derive.derive_file(_tools(1), path, FakeGenerator("0" * 64), progress=False)


def test_the_worker_writes_shipped_requests_without_a_model_and_generates_the_rest(tmp_path):
    store = LocalStore(tmp_path / "store")
    tools = _tools(4)
    made: list[FakeGenerator] = []

    def make():
        made.append(FakeGenerator())
        return made[-1]

    shipped = {tools[0].schema_hash: ["shipped request one"]}
    w = derive.DeriveWorker(store, make, "f" * 64, shipped)
    try:
        assert w.submit(tools[0])
        assert w.wait_idle(30)
        assert made == []  # a shipped tool loads no model
        assert derive.decode_derived(store.get(w.key(tools[0]))) == ["shipped request one"]
        assert not w.submit(tools[0])  # already in the store
        for t in tools[1:]:
            w.submit(t)
        assert w.wait_idle(30) and w.pending() == 0
        assert len(made) == 1 and sorted(sum(made[0].calls, [])) == ["t1", "t2", "t3"]
        assert all(len(c) <= 2 for c in made[0].calls)  # in batches of the generator's parallel
        for t in tools[1:]:
            assert derive.decode_derived(store.get(w.key(t))) == [f"do the {t.name} thing now",
                                                                  f"please {t.name} again"]
    finally:
        w.close()
    # a generator of another fingerprint than configured is refused (logged), nothing written
    w2 = derive.DeriveWorker(LocalStore(tmp_path / "s2"), lambda: FakeGenerator("0" * 64), "f" * 64)
    try:
        w2.submit(tools[1])
        assert w2.wait_idle(30)
        assert not w2.store.exists(w2.key(tools[1]))
    finally:
        w2.close()


@pytest.mark.integration
def test_registered_tools_route_at_once_and_get_derived_keys_in_the_background(tmp_path):
    """RegisterTools returns before any request is derived (ListTools: pending, Route works on the text key); the
    compiler's worker derives them with the real model and the router picks the keys up without a new
    registration (ListTools: derived)."""
    from nexus_client import NexusClient
    from tests.conftest import start_compiler, start_router

    store_url = str(tmp_path / "store")
    compiler = start_compiler(store_url, derive=True, derive_parallel=2, derive_threads=2)
    router = start_router(store_url, compiler.addr, gate_model_dir="", derived_keys=True)
    other = {"name": "shop_list_orders", "description": "List a customer's recent orders.",
             "inputSchema": {"type": "object", "properties": {"customer_email": {"type": "string"}}}}
    try:
        with NexusClient(router=router.addr, timeout_s=120) as client:
            t0 = time.monotonic()
            client.register([TOOL.to_json(), json.dumps(other)])
            keys = {t.name: t.keys for t in client.list_tools().tools}
            assert set(keys.values()) <= {"pending", "derived"}
            assert client.route("refund order 5531, it came damaged").tool == "shop_refund_order"
            from cli.main import keys_summary

            assert keys_summary(client, wait_s=600) == "derived 2"  # what `nexus register --wait-keys` prints
            print(f"derived keys of 2 tools ready in {time.monotonic() - t0:.0f} s")
            assert client.route("refund order 5531, it came damaged").tool == "shop_refund_order"
            assert client.route("show me the last orders of ann@example.com").tool == "shop_list_orders"
        # what the real generator wrote, under the default generator's address the router read it from
        store = LocalStore(store_url)
        a, b = (derive.decode_derived(store.get(derive.derived_key(t, derive.default_fingerprint())))
                for t in (TOOL, Tool(other["name"], other["description"], other["inputSchema"])))
        assert a and b and a != b
        assert all(len(r.split()) >= 3 and "shop_refund_order" not in r for r in a)
    finally:
        router.stop()
        compiler.stop()


def test_a_long_tool_is_shortened_to_fit_and_its_prompt_still_ends_with_the_assistants_turn():
    """A tool whose full prompt exceeds a sequence's budget (the github tools with a dozen long parameters) gets a
    shorter description and fewer parameters, never a prompt cut at its end (which under derive-v2 left 23 of the
    338 tools without a request: the model went on writing the user's message)."""
    from services.common.models import resolve_generator_gguf

    long_tool = Tool("report_export", "Export a report. " + "It has many options and caveats. " * 40, {
        "type": "object", "required": ["report_id"],
        "properties": {f"option_{i}": {"type": "string", "description": "An option of the export, " * 8}
                       for i in range(12)} | {"report_id": {"type": "string"}}})
    gen = derive.RequestGenerator(str(resolve_generator_gguf("")), threads=1, parallel=1, n_ctx_per_seq=768)
    try:
        full, fitted, short = gen.prompt_tokens(long_tool), gen.fitted_prompt(long_tool), gen.fitted_prompt(TOOL)
        budget = gen.n_ctx_per_seq - gen.settings.max_tokens
        assert len(full) > budget >= len(fitted)
        assert short == gen.prompt_tokens(TOOL)  # a tool that fits keeps its whole prompt
        tail = full[-8:]  # the chat's end: the end of the user's turn and the assistant's opening
        assert fitted[-8:] == tail
        reqs = gen.generate(long_tool)
        assert reqs, "the shortened prompt still yields requests"
    finally:
        gen.close()
