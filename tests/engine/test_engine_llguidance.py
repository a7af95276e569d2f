"""The engine with ``grammar_engine = "llguidance"`` and the real SmolLM2 model: arguments sampled under llguidance on
the tool's JSON Schema are valid JSON for that schema; a schema llguidance cannot compile samples under the GBNF."""

import json
import logging

import jsonschema
import pytest

from services.common.store import LocalStore
from services.engine.config import EngineConfig
from services.engine.engine import Engine, Result


@pytest.fixture(scope="module")
def engine(tmp_path_factory, small_tools, all_tools):
    store = LocalStore(tmp_path_factory.mktemp("estore"))
    store.registry_put(small_tools + [t for t in all_tools if t.name == "browser_drop"])
    return Engine(EngineConfig(store_url=str(store.root), grammar_engine="llguidance"), store)


def result(engine, query, tool, **kw) -> Result:
    (res,) = [e for e in engine.generate(query, tool, **kw) if isinstance(e, Result)]
    return res


@pytest.mark.parametrize(
    "query, tool",
    [
        ("open a pull request from feature-x into main in octo/demo", "github_create_pull_request"),
        ("What time is it in Tokyo right now?", "get_current_time"),
        ("show the git status of /home/me/repo", "git_status"),
        ("merge pull request 42 of octo/demo with a squash", "github_merge_pull_request"),
    ],
)
def test_llguidance_arguments_validate_against_the_schema(engine, query, tool):
    res = result(engine, query, tool)
    schema = engine.store.registry_get(tool).input_schema
    args = json.loads(res.arguments_json)
    jsonschema.validate(args, schema)
    assert res.schema_valid
    assert set(args) <= set(schema["properties"])  # closed as the GBNF closes it: no keys of the model's own
    assert engine.stats["llguidance_fallbacks"] == 0


def test_stated_values_are_mapped_under_llguidance(engine):
    res = result(engine, "What time is it in Tokyo right now?", "get_current_time")
    assert json.loads(res.arguments_json) == {"timezone": "Asia/Tokyo"}


def test_a_schema_llguidance_cannot_compile_samples_under_the_gbnf(engine, caplog):
    """browser_drop's ``data`` uses propertyNames (llguidance: unimplemented): the request is served under the
    compiler's GBNF, and the fallback is logged once for the tool, not on every turn."""
    with caplog.at_level(logging.WARNING, logger="nexus.engine"):
        for target in ("e12", "e13"):
            res = result(engine, f"drop /tmp/a.png onto the element {target}", "browser_drop", max_tokens=8)
            assert res.schema_valid
    assert engine.stats["llguidance_fallbacks"] == 2
    assert sum("llguidance cannot compile" in r.getMessage() for r in caplog.records) == 1
