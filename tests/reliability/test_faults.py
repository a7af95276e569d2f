"""Faults injected into real processes: Redis stopped and restarted under a running router + compiler,
Redis SIGKILLed after acknowledged writes, a client dying inside MULTI, a writer killed inside
LocalStore.put, the engine restarted on the same store. The scenarios live in scenarios.py (shared with
bench/reliability.py)."""

from __future__ import annotations

import pytest

from tests.conftest import start_compiler, start_engine, start_router
from tests.reliability import scenarios

pytestmark = pytest.mark.integration


def test_redis_outage_router_keeps_serving_compiler_unavailable_then_recovers(redis_proc, small_tools):
    tools = [t for t in small_tools if t.name in ("get_current_time", "convert_time", "git_status", "git_log",
                                                   "brave_web_search", "read_text_file")]
    out = scenarios.redis_outage(redis_proc, tools, start_compiler, start_router, routes=10)
    assert out["route_errors_during_outage"] == 0 and out["route_same_answer"], out
    assert out["compile_status_during_outage"] == "UNAVAILABLE", out
    assert out["get_artifact_status_during_outage"] == "UNAVAILABLE", out
    assert out["register_status_during_outage"] == "UNAVAILABLE", out
    assert out["compile_recovered"] and out["artifacts_lost"] == 0, out
    assert out["registry_tools_after_restart"] == len(tools) == out["registry_tools_registered"]


def test_redis_sigkill_loses_no_acknowledged_write(redis_proc):
    out = scenarios.redis_kill9_durability(redis_proc, n_objects=30)
    assert out["artifacts_lost"] == 0 and out["registry_version_kept"], out


def test_client_dying_inside_multi_changes_nothing(redis_proc):
    assert scenarios.redis_multi_interrupted(redis_proc)["registry_unchanged"]


def test_writer_killed_inside_local_put_leaves_no_partial_object(tmp_path):
    out = scenarios.interrupted_local_writes(tmp_path / "store")
    for hook, r in out["kills"].items():
        assert r["exit"] == 9, (hook, r)  # it really died inside put
        assert r["old_content_intact"], (hook, r)
    assert out["fresh_exit"] == 9 and not out["fresh_key_visible"]
    assert out["artifacts_lost"] == 0


def test_engine_restart_reloads_artifacts_from_the_store(rc_cluster):
    # rc_cluster registered (compiled) the small registry into its store; a fresh engine reads it there.
    out = scenarios.engine_restart(rc_cluster["store_url"], "get_current_time", start_engine)
    assert out["generate_after_restart_ok"] and out["same_arguments"], out
