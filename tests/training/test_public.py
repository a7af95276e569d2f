"""The public-tools encoder (training/public.py) and the public protocol (evals/public.py, `nexus eval routing --protocol public`): the Seal-Tools
data loads as MCP tools and request-tool pairs, the overlap filter drops what comes close to a shipped tool (and the
requests that call it), a 20-pair run trains one step into a loadable sentence-transformers directory with a
checkpoint it resumes from, and the probe scores an encoder on a small registry, never keying a request on itself.
The full run is `python -m training.public` (~40 min on 2 cores)."""

import json
from pathlib import Path

import numpy as np
import pytest

from services.common.tools import Tool
from tests.conftest import REPO
from training import public


def test_seal_tools_and_pairs_load_as_mcp_tools_with_json_schema_types():
    tools = public.load_seal_tools()
    assert len(tools) == 4076 and len({t.name for t in tools}) == 4076
    types = {p["type"] for t in tools for p in t.input_schema["properties"].values()}
    assert types <= {"string", "integer", "number", "boolean", "array", "object", "null"}
    pairs = public.load_seal_pairs(known={t.name for t in tools})
    assert len({p.request_id for p in pairs}) == 1400
    # single-call requests give one pair, multi-call ones one per distinct call
    assert len(pairs) > 3000 and all(p.query and p.tool for p in pairs)
    per_request = {}
    for p in pairs:
        per_request.setdefault(p.request_id, []).append(p.tool)
    assert all(len(v) == len(set(v)) for v in per_request.values())
    assert max(len(v) for v in per_request.values()) > 1


def test_the_tool_document_reads_names_as_words_with_description_and_parameters():
    t = Tool("getWaterQuality", "Retrieve the  water quality\nof a lake", {
        "type": "object", "properties": {"location": {"type": "string"}, "date": {"type": "string"}}})
    assert public.tool_doc(t) == "get Water Quality: Retrieve the water quality of a lake Parameters: location, date"
    assert public.name_words("get_file_contents") == "get file contents"
    assert public.name_words("getHTTPResponse") == "get HTTP Response"


def _tool(name, desc):
    return Tool(name, desc, {"type": "object", "properties": {"x": {"type": "string"}}})


def test_the_overlap_filter_drops_close_and_hand_listed_tools_and_their_requests(tmp_path, monkeypatch):
    from training.public import Pair, apply_filter, base_embed_fn, overlap_filter

    shipped = [_tool("get_current_time", "Get current time in a specific timezone"),
               _tool("slack_post_message", "Post a new message to a Slack channel")]
    pub = [_tool("getCurrentTime", "Get the current time in a given time zone"),
           _tool("sendInternalMessage", "Send a message to internal team members"),
           _tool("analyzeSoilSample", "Analyze the nutrient content of a soil sample")]
    embed = base_embed_fn()
    rep = overlap_filter(pub, shipped, embed, hand={"sendInternalMessage": ("slack_post_message", "posts a message")})
    by = {r["tool"]: r for r in rep["dropped"]}
    assert set(by) == {"getCurrentTime", "sendInternalMessage"}
    assert by["getCurrentTime"]["nearest_shipped"] == "get_current_time" and by["getCurrentTime"]["cosine"] >= 0.8
    assert by["sendInternalMessage"]["by"] == "hand"
    assert rep["n_dropped"] == 2 and rep["by"]["hand"] == 1
    with pytest.raises(ValueError, match="not in the public set"):
        overlap_filter(pub, shipped, embed, hand={"noSuchTool": ("get_current_time", "")})
    # a request calling a dropped tool goes whole, its other calls too
    pairs = [Pair("r1", "what time is it in Oslo and how is the soil", "getCurrentTime"),
             Pair("r1", "what time is it in Oslo and how is the soil", "analyzeSoilSample"),
             Pair("r2", "test this soil", "analyzeSoilSample")]
    assert apply_filter(pairs, {"getCurrentTime"}) == [pairs[2]]
    # the report is cached by its inputs: a second call reads it, another threshold recomputes it
    path = tmp_path / "dropped.json"
    monkeypatch.setattr(public, "HAND_DROPPED", {})
    first = public.dropped_tools(pub, shipped, path, embed=embed)
    assert json.loads(path.read_text())["key"] == first["key"]
    assert public.dropped_tools(pub, shipped, path, embed=lambda t: pytest.fail("recomputed"))["key"] == first["key"]
    assert public.dropped_tools(pub, shipped, path, embed=embed, threshold=0.99)["key"] != first["key"]


def test_the_shipped_overlap_report_matches_the_data():
    """data/public_tools/dropped.json is the filter's answer for the committed tools and hand list."""
    rep = json.loads((REPO / "data" / "public_tools" / public.DROPPED).read_text())
    pub, shipped = public.load_seal_tools(), public.load_shipped_tools()
    assert rep["key"] == public.filter_key(pub, shipped, public.OVERLAP_THRESHOLD, public.HAND_DROPPED)
    assert {r["tool"] for r in rep["dropped"]} >= set(public.HAND_DROPPED)
    shipped_names = {t.name for t in shipped}
    assert all(r["nearest_shipped"] in shipped_names for r in rep["dropped"])


def _server(root, server, tools, requests):
    d = root / public.WRITTEN
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{server}.json").write_text(json.dumps({
        "server": server, "about": "", "requests": [{"tool": t, "query": q} for t, q in requests],
        "tools": [{"name": n, "description": desc, "inputSchema": {"type": "object", "properties": {}}}
                  for n, desc in tools]}))


def test_written_servers_load_keyed_by_server_and_pass_the_overlap_filter(tmp_path):
    """Written servers (--with-written): tools keyed server/name (two servers may share a name), every request a
    pair; a tool as close to a shipped one as Seal's dropped ones goes with its requests; bad files are errors."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "time.json").write_text(json.dumps({"server": "time", "tools": [
        {"name": "get_current_time", "description": "Get current time in a specific timezone",
         "inputSchema": {"type": "object", "properties": {}}}]}))
    _server(tmp_path, "payments", [("create_refund", "Refund a charge, fully or in part."),
                                   ("list_users", "List the account's users."),
                                   ("get_current_time", "Get the current time in a given time zone")],
            [("create_refund", "refund ch_123"), ("list_users", "who can log in?"),
             ("get_current_time", "what time is it in Lima"), ("create_refund", "give Ana her $20 back")])
    _server(tmp_path, "crm", [("list_users", "List the CRM's users and their roles.")],
            [("list_users", "which sales reps have seats")])
    tools, pairs = public.load_written(tmp_path)
    assert set(tools) == {"payments/create_refund", "payments/list_users", "payments/get_current_time",
                          "crm/list_users"}
    assert tools["crm/list_users"].name == "list_users" and len(pairs) == 5
    kept, kept_tools, report = public.written_pairs(tmp_path, shipped, hand={})
    assert [r["tool"] for r in report["dropped"]] == ["payments/get_current_time"]
    assert "payments/get_current_time" not in kept_tools and len(kept) == 4
    assert {p.tool for p in kept} == {"payments/create_refund", "payments/list_users", "crm/list_users"}
    assert json.loads((tmp_path / public.WRITTEN / public.DROPPED).read_text())["key"] == report["key"]
    # follow-ups with history (--with-written-context) read as the router embeds them; a dropped tool's go too
    ctx = tmp_path / public.WRITTEN_CONTEXT
    ctx.mkdir()
    hist = [{"role": "user", "content": "refund ch_123"}, {"role": "assistant", "content": "Refunded $20."}]
    (ctx / "payments.json").write_text(json.dumps({"server": "payments", "requests": [
        {"tool": "list_users", "query": "and who approved it?", "history": hist},
        {"tool": "get_current_time", "query": "and there?", "history": hist}]}))
    follow = public.load_written_context(tmp_path, kept_tools)
    assert [(p.tool, p.query) for p in follow] == [
        ("payments/list_users", "and who approved it?\n[context] assistant: Refunded $20. | user: refund ch_123")]
    # another folder of the same form (a later round of such requests) reads alike, under its own request ids
    (tmp_path / "round2").mkdir()
    (tmp_path / "round2" / "payments.json").write_text((ctx / "payments.json").read_text())
    again = public.load_written_context(tmp_path, kept_tools, "round2")
    assert [(p.tool, p.query) for p in again] == [(p.tool, p.query) for p in follow]
    assert [p.request_id for p in again] == ["round2/payments/0"] != [p.request_id for p in follow]
    (ctx / "payments.json").write_text(json.dumps({"server": "payments", "requests": [
        {"tool": "void_charge", "query": "void it", "history": hist}]}))
    with pytest.raises(ValueError, match="not a tool of payments"):
        public.load_written_context(tmp_path, kept_tools)
    _server(tmp_path, "crm", [("list_users", "x")], [("delete_user", "remove Bo")])
    with pytest.raises(ValueError, match="not a tool of crm"):
        public.load_written(tmp_path)
    _server(tmp_path, "crm", [("list_users", "x"), ("list_users", "y")], [])
    with pytest.raises(ValueError, match="twice"):
        public.load_written(tmp_path)


def test_the_written_servers_overlap_report_matches_the_data():
    """data/public_tools/written/dropped.json is the filter's answer for the committed written servers, and every
    written request names a tool of its server."""
    tools, pairs = public.load_written()
    rep = json.loads((REPO / "data" / "public_tools" / public.WRITTEN / public.DROPPED).read_text())
    assert rep["key"] == public.filter_key(list(tools.values()), public.load_shipped_tools(),
                                           public.OVERLAP_THRESHOLD, public.WRITTEN_HAND_DROPPED, list(tools))
    assert len(tools) >= 1000 and len(pairs) >= 3 * len(tools) - 10
    dropped = {r["tool"] for r in rep["dropped"]}
    assert dropped <= set(tools) and set(public.WRITTEN_HAND_DROPPED) <= dropped
    # the issue trackers keep only what github's and gitlab's issue tools do not do
    assert {"jira/jira_create_issue", "jira/jira_add_comment", "linear/create_issue"} <= dropped
    assert not {"jira/jira_list_sprints", "linear/list_cycles"} & dropped
    # the Hugging Face Hub keeps its models', datasets' and Spaces' operations, not its git hosting
    assert {"huggingface-hub/create_pull_request", "huggingface-hub/list_repo_commits"} <= dropped
    assert not {"huggingface-hub/hf_list_models", "huggingface-hub/restart_space"} & dropped


def test_the_shipped_pairs_hold_out_whole_servers():
    """--with-shipped adds the shipped registry's own requests (the router's recipe); --holdout-servers leaves out
    every line of those servers, so a fold's encoder never reads a request of the servers it is scored on."""
    tools = [t.name for t in public.load_shipped_tools()]
    every = public.load_shipped_pairs(public.SHIPPED_REQUESTS, tools)
    lines = [json.loads(x) for f in [REPO / "data/queries/train.jsonl",
                                     *sorted((REPO / "data/routing_augment").glob("*.jsonl"))]
             for x in f.read_text().splitlines() if x.strip()]
    assert len(every) == len(lines) and {p.tool for p in every} == set(tools)
    assert all(p.request_id.startswith("shipped/") for p in every)
    server_of = {d["tool"]: d["server"] for d in lines}
    held = public.load_shipped_pairs(public.SHIPPED_REQUESTS, tools, holdout_servers=["time", "redis"])
    assert held and not [p for p in held if server_of[p.tool] in ("time", "redis")]
    assert len(held) == sum(d["server"] not in ("time", "redis") for d in lines)
    assert not public.load_shipped_pairs(public.SHIPPED_REQUESTS, [])  # unknown tools are skipped
    # a line is its bare query, history or not
    queries = {f"shipped/{d['id']}": d["query"] for d in lines}
    assert all(p.query == queries[p.request_id] for p in held)
    # the assembled pool (a cross-encoder's negatives) holds none of a held-out server's tools either
    import argparse

    ap = argparse.ArgumentParser()
    public.add_data_args(ap)
    pairs, pool, _ = public.assemble(ap.parse_args(["--with-shipped", "--holdout-servers", "time,redis"]))
    shipped_pool = {n for n in pool if n in server_of}
    assert shipped_pool and not {n for n in shipped_pool if server_of[n] in ("time", "redis")}
    assert {p.tool for p in pairs if p.request_id.startswith("shipped/")} <= shipped_pool


def test_a_gate_on_an_encoder_is_unseen_only_where_the_encoder_never_read_a_line(tmp_path):
    from evals.public import gate_protocol

    enc, gate = tmp_path / "enc", tmp_path / "gate"
    enc.mkdir()
    gate.mkdir()

    def make(q_epochs, **meta):
        (gate / "gate.json").write_text(json.dumps({"hyperparams": {"encoder": str(enc), "q_epochs": q_epochs}}))
        (enc / "public_meta.json").write_text(json.dumps(meta))

    make(0, with_shipped=False)
    assert gate_protocol(gate) == "unseen"
    make(1, with_shipped=False)  # fine-tuned on the registry's lines by the gate itself
    assert gate_protocol(gate) == "seen"
    make(0, with_shipped=True, holdout_servers="time,redis")
    assert gate_protocol(gate) == "seen" and gate_protocol(gate, ["time", "git"]) == "seen"
    assert gate_protocol(gate, ["time"]) == "unseen" and gate_protocol(gate, ["time", "redis"]) == "unseen"


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """One optimizer step on 20 Seal pairs (one epoch of one batch), from base MiniLM."""
    tools = {t.name: t for t in public.load_seal_tools()}
    pairs = public.load_seal_pairs(known=set(tools))[:20]
    out = tmp_path_factory.mktemp("public") / "enc"
    meta = public.train(pairs, tools, out, public.PublicHyperParams(epochs=1, batch_size=32), progress=False)
    return out, meta, pairs, tools


def test_a_twenty_pair_run_trains_one_step_checkpoints_and_resumes(tiny_encoder):
    from sentence_transformers import SentenceTransformer

    out, meta, pairs, tools = tiny_encoder
    assert meta["steps"] == 1 and meta["n_pairs"] == 20
    assert (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").is_file()
    m = SentenceTransformer(str(out), device="cpu")
    assert m.max_seq_length == 128
    v = m.encode(["what is the water quality of the lake"], normalize_embeddings=True)
    assert v.shape == (1, 384) and abs(float(np.linalg.norm(v)) - 1) < 1e-4
    again = public.train(pairs, tools, out, public.PublicHyperParams(epochs=1, batch_size=32), progress=False)
    assert again["resumed_from"].endswith("checkpoint-1") and again["steps"] == 1


def test_exemplar_keys_never_key_a_request_on_itself():
    from evals import public as probe
    qv = np.eye(3, dtype=np.float32)
    qv[2] = qv[0]  # line 2 repeats line 0's text: neither may key the other
    ex = probe.exemplar_scores(qv, ["a", "b", "a"], [0, 0, 1], 2)
    assert ex[0, 0] == 0.0 and ex[0, 1] == -np.inf  # line 0: tool 0 only through line 1; line 2 is its own text
    assert ex[1, 0] == 0.0 and ex[2, 0] == 0.0 and ex[2, 1] == -np.inf
    # new requests keyed by the file's: only a key of the same text is left out
    new = probe.exemplar_scores(qv[:2], ["a", "c"], [0, 1], 2, keys=(qv, ["a", "b", "a"], [0, 0, 1]))
    assert new[0, 0] == 0.0 and new[0, 1] == -np.inf and new[1, 0] == 1.0 and new[1, 1] == 0.0


def test_a_centroid_is_the_unit_mean_of_a_tools_document_and_its_keys():
    from evals import public as probe
    dv = np.eye(3, dtype=np.float32)[:2]  # tool 0 along x, tool 1 along y
    kv = np.array([[0, 0, 1], [0, 0, 1]], np.float32)  # two keys of tool 1, along z
    got = probe.centroid_scores(np.eye(3, dtype=np.float32), dv, kv, [1, 1])
    assert np.allclose(got[:, 0], [1, 0, 0])  # tool 0 has no key: its document alone
    assert np.allclose(got[:, 1], np.array([0, 1, 2]) / np.sqrt(5), atol=1e-6)


def test_derived_requests_key_only_the_registered_tool_of_their_schema_hash(tmp_path):
    from evals import public as probe
    from training.data import load_registry
    reg = load_registry(str(REPO / "data" / "mcp_tools")).subset(["get_current_time", "convert_time"])
    by_name = reg.by_name()
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"generator": {"fingerprint": "f"}},
        {"tool": "convert_time", "schema_hash": by_name["convert_time"].schema_hash, "requests": ["a b c", "d e f"]},
        {"tool": "get_current_time", "schema_hash": "0" * 64, "requests": ["an old schema's request"]},
    ]) + "\n")
    texts, tool = probe.derived_keys(str(path), ["get_current_time", "convert_time"], by_name)
    assert texts == ["a b c", "d e f"] and tool == [1, 1]


def test_the_probe_scores_an_encoder_on_a_small_registry(tiny_encoder, tmp_path):
    from evals import public as probe
    out_json = tmp_path / "probe.json"
    rep = probe.evaluate(str(tiny_encoder[0]), str(out_json), servers=("time", "redis"), sizes="3,all", draws=2,
                         new_queries=str(REPO / "data" / "routing_calibration" / "time-b4.jsonl"),
                         derived=str(REPO / "data" / "derived" / "requests.jsonl"))
    p = rep["protocol"]
    assert p["tools"] == 6 and p["lines"] > 10 and p["new_lines"] == 8
    assert set(rep["arms"]) == {"base dense", "base + bm25", "public dense", "public + bm25",
                                "base + exemplar keys (seen)", "base + exemplar keys + bm25 (seen)",
                                "public + exemplar keys (seen)", "public + exemplar keys + bm25 (seen)",
                                "base dense, new requests", "public dense, new requests",
                                "base + exemplar keys, new requests (seen)",
                                "public + exemplar keys, new requests (seen)",
                                "public + exemplar keys + bm25, new requests (seen)",
                                *(f"{e} + derived {k}{t}" for e in ("base", "public")
                                  for k in ("keys", "keys + bm25", "centroid") for t in ("", ", new requests"))}
    assert p["derived_tools"] == 6 and p["derived_keys"] >= 6 * 3
    for arm, a in rep["arms"].items():
        assert a["protocol"] == ("seen" if "exemplar" in arm else "unseen")
        n_lines = p["new_lines"] if "new requests" in arm else p["lines"]
        for s, x in a["by_size"].items():
            assert 0 <= x["top1"] <= x["top3"] <= 1
            lo, hi = x["top1_wilson95"]
            assert lo <= x["top1"] <= hi
            # every draw of "all" is the whole registry: counted once
            assert x["n_lines"] == n_lines and x["n_line_draws"] == n_lines * (1 if s == "all" else 2)
    assert json.loads(out_json.read_text())["encoders"]["public"]["public_meta"]["steps"] == 1
    assert out_json.with_suffix(".png").is_file()


def test_the_public_protocol_adds_the_production_routers_arm(tiny_encoder, small_gate, tmp_path):
    """--gate: the production router (the gate model's INT8 graph, no exemplar key, no bias) routes every line over
    the same drawn registries; a model fine-tuned on these tools' lines is labelled seen, never unseen."""
    from evals import public as protocol

    rep = protocol.evaluate(str(tiny_encoder[0]), str(tmp_path / "p.json"), servers=("time", "redis"), sizes="3,all",
                          draws=2, gate=str(small_gate), plot_png=False,
                          new_queries=str(REPO / "data" / "routing_calibration"))
    (router,) = rep["routers"]
    arm = f"{router['arm']} (seen, tools as new)"
    assert router["protocol"] == "seen" and protocol.gate_protocol(small_gate) == "seen"
    assert rep["arms"][arm]["protocol"] == "seen"
    # the router as it serves (its own exemplar keys) on the new requests: a seen figure whatever the encoder
    served = rep["arms"][f"{router['arm']} (seen, as it serves), new requests"]
    assert served["protocol"] == "seen" and served["by_size"]["all"]["n_lines"] == rep["protocol"]["new_lines"] > 0
    x = rep["arms"][arm]["by_size"]
    assert x["3"]["n_line_draws"] == 2 * rep["protocol"]["lines"] and x["all"]["n_line_draws"] == rep["protocol"]["lines"]
    assert 0 < x["3"]["top1"] <= x["3"]["top3"] <= 1


def test_fold_encoders_score_only_their_unseen_servers_and_pool(tiny_encoder, tmp_path):
    from evals import public_folds

    _, _, pairs, tools = tiny_encoder
    folds = []
    for held in ("time", "redis"):
        out = tmp_path / held
        public.train(pairs, tools, out, public.PublicHyperParams(epochs=1, batch_size=32), progress=False,
                     extra_meta={"holdout_servers": held})
        folds.append(str(out))
    rep = public_folds.evaluate_folds(folds, str(tmp_path / "f.json"), base="", sizes="3,all", draws=2,
                                      servers=("time", "redis"), gates=True, gates_root=str(tmp_path / "gates"))
    assert [f["holdout_servers"] for f in rep["folds"]] == [["time"], ["redis"]]
    # each fold's gate model knows only the other fold's tools: the router's arms are unseen, named alike in both
    other_tools = ({"set", "get", "delete", "list"}, {"get_current_time", "convert_time"})
    for f, tools_known in zip(rep["folds"], other_tools, strict=True):
        gate = json.loads((Path(f["router"]["gate"]) / "gate.json").read_text())
        assert set(gate["tool_schemas"]) == tools_known and f["router"]["protocol"] == "unseen"
    for arm in ("router (unseen, tools as new)", "router (unseen, as it serves), new requests",
                "router (unseen, as it serves + examples), new requests"):
        row = rep["arms"][arm]["by_size"]["all"]
        assert rep["arms"][arm]["protocol"] == "unseen" and set(row["top1_by_server"]) == {"time", "redis"}
        assert 0 < row["top1"] <= row["top3"] <= 1
    assert rep["paired"]["router (unseen, tools as new) vs public dense"]["all"]["sign_test_p"] <= 1
    # the scored servers' own requests registered as examples key their tools: they route the new requests better
    ex = rep["paired"]["router (unseen, as it serves + examples), new requests vs router (unseen, as it serves), "
                       "new requests"]["all"]
    assert ex["fixed"] >= ex["broken"]
    assert rep["protocol"]["scored_servers"] == ["redis", "time"] and rep["protocol"]["unscored_servers"] == []
    dense = rep["arms"]["public dense"]["by_size"]["all"]
    assert set(dense["top1_by_server"]) == {"time", "redis"}
    assert dense["n_lines"] == rep["protocol"]["lines"] == sum(f["lines"] for f in rep["folds"])
    assert dense["top1_wilson95"][0] <= dense["top1"] <= dense["top1_wilson95"][1]
    assert (tmp_path / "f.png").is_file()
    with pytest.raises(ValueError, match="already another fold"):
        public_folds.evaluate_folds([folds[0], folds[0]], str(tmp_path / "g.json"), base="", new_queries="",
                                    servers=("time", "redis"))
    with pytest.raises(ValueError, match="held out no server"):
        public_folds.holdout_of(tiny_encoder[0])
    ce = tmp_path / "ce"  # a fold's second stage must hold out the fold's servers, no more, no fewer
    ce.mkdir()
    (ce / "public_ce.json").write_text(json.dumps({"holdout_servers": "redis"}))
    with pytest.raises(ValueError, match="held out redis, its fold time"):
        public_folds.evaluate_folds([folds[0]], str(tmp_path / "h.json"), cross_encoders=[str(ce)])
    with pytest.raises(ValueError, match="one per fold"):
        public_folds.evaluate_folds(folds, str(tmp_path / "h.json"), cross_encoders=[str(ce)])


def test_pooling_folds_weights_each_by_its_line_draws_and_sums_the_paired_counts():
    from evals.public_folds import pool

    def rep(n, k1, k3, server, fixed, broken):
        row = {"n_line_draws": n, "n_lines": n // 2, "top1": k1 / n, "top3": k3 / n, "top1_by_server": {server: k1 / n}}
        return {"arms": {"public dense": {"protocol": "unseen", "lines": "q", "lexical_weight": 0.0,
                                          "by_size": {"250": row}}},
                "paired": {"public dense vs base dense": {"250": {"fixed": fixed, "broken": broken}}}}

    out = pool([rep(100, 60, 80, "a", 10, 2), rep(300, 240, 270, "b", 5, 5)])
    row = out["arms"]["public dense"]["by_size"]["250"]
    assert row["n_line_draws"] == 400 and row["top1"] == 0.75 and row["top3"] == 0.875
    assert row["top1_by_fold"] == [0.6, 0.8] and row["top1_by_server"] == {"a": 0.6, "b": 0.8}
    p = out["paired"]["public dense vs base dense"]["250"]
    assert (p["fixed"], p["broken"]) == (15, 7) and 0 < p["sign_test_p"] < 1
