"""The engine's arguments under the compiled grammar, with the real SmolLM2 model: valid JSON for the tool's schema,
closed to its keys; a keyword the grammar cannot enforce is checked after sampling; a stored grammar that does not
compile for the model's vocabulary samples any JSON object (counted, logged) and is still validated."""

import json
import logging

import jsonschema
import pytest

from services.common.store import LocalStore
from services.compiler.compiler import grammar_key, signature_key
from services.compiler.signature import signature
from services.engine.config import EngineConfig
from services.engine.engine import Engine, Result


@pytest.fixture(scope="module")
def engine(tmp_path_factory, small_tools, all_tools):
    store = LocalStore(tmp_path_factory.mktemp("estore"))
    store.registry_put(small_tools + [t for t in all_tools if t.name == "browser_drop"])
    return Engine(EngineConfig(store_url=str(store.root)), store)


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
def test_arguments_validate_against_the_schema(engine, query, tool):
    res = result(engine, query, tool)
    schema = engine.store.registry_get(tool).input_schema
    args = json.loads(res.arguments_json)
    jsonschema.validate(args, schema)
    assert res.schema_valid
    assert set(args) <= set(schema["properties"])  # closed: no keys of the model's own
    assert engine.stats["grammar_fallbacks"] == 0


def test_stated_values_are_mapped(engine):
    res = result(engine, "What time is it in Tokyo right now?", "get_current_time")
    assert json.loads(res.arguments_json) == {"timezone": "Asia/Tokyo"}


def test_a_keyword_the_grammar_cannot_enforce_is_checked_after_sampling(engine):
    """browser_drop's ``data`` uses propertyNames (llguidance: unimplemented): the rest of its schema is enforced and
    the call is validated against the whole schema."""
    res = result(engine, "drop /tmp/a.png onto the element e12", "browser_drop", max_tokens=8)
    assert res.schema_valid and engine.stats["grammar_fallbacks"] == 0


def test_a_stored_grammar_that_does_not_compile_samples_any_object(tmp_path, small_tools, caplog):
    store = LocalStore(tmp_path)
    store.registry_put(small_tools)
    tool = next(t for t in small_tools if t.name == "get_current_time")
    eng = Engine(EngineConfig(store_url=str(store.root)), store)
    store.put(signature_key(tool), signature(tool).encode(), {"tool": tool.name})
    store.put(grammar_key(tool), b'{"grammars": [{"json_schema": {"type": "strang"}}]}', {"tool": tool.name})
    with caplog.at_level(logging.WARNING, logger="nexus.engine"):
        res = result(eng, "What time is it in Tokyo right now?", tool.name, max_tokens=16)
    assert isinstance(json.loads(res.arguments_json), dict)
    assert eng.stats["grammar_fallbacks"] == 1
    assert any("grammar fallback" in r.getMessage() for r in caplog.records)
    eng.close()
