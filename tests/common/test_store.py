"""Both store implementations against the same contract: a local directory and a real redis-server."""

import os
import threading

import pytest

from services.common.errors import ArtifactNotFound, DataCorruption, InvalidArgument, Unavailable
from services.common.store import LocalStore, RedisStore, artifact_key, open_store
from services.common.tools import parse_tool


@pytest.fixture(params=["local", "redis"])
def store(request, tmp_path):
    if request.param == "local":
        yield LocalStore(tmp_path / "store")
    else:
        yield request.getfixturevalue("redis_store")


def _tool(name, desc="d"):
    return parse_tool({"name": name, "description": desc, "inputSchema": {"type": "object"}})


def test_put_get_roundtrip_with_meta(store):
    info = store.put("k-1", b"payload", {"tokens": 3})
    data, got = store.get_with_info("k-1")
    assert data == b"payload" and got.sha256 == info.sha256 and got.meta == {"tokens": 3}
    assert store.exists("k-1") and store.delete("k-1") and not store.exists("k-1")


def test_missing_is_not_found(store):
    with pytest.raises(ArtifactNotFound):
        store.get("nope")


def test_bad_key_is_invalid(store):
    with pytest.raises(InvalidArgument):
        store.put("../escape", b"x")


def test_registry_versions_and_removal(store):
    v0 = store.registry_version()
    v1 = store.registry_put([_tool("a"), _tool("b")])
    assert v1 == v0 + 1
    tools, v = store.registry_snapshot()
    assert set(tools) == {"a", "b"} and v == v1
    v2 = store.registry_put([_tool("a", "new")])
    assert store.registry_get("a").description == "new" and v2 == v1 + 1
    removed, missing, v3 = store.registry_remove(["a", "zzz"])
    assert removed == ["a"] and missing == ["zzz"] and v3 == v2 + 1
    removed, missing, v4 = store.registry_remove(["zzz"])
    assert removed == [] and v4 == v3  # nothing changed, no version bump


def test_reading_one_tool_parses_only_that_tool_and_each_stored_text_once(store, monkeypatch):
    """The engine reads its tool on every turn: neither the other tools nor a text parsed before cost a schema
    check (a registry's worth was ~0.4 s a turn)."""
    import services.common.store as store_mod
    parsed = []
    monkeypatch.setattr(store_mod, "parse_tool", lambda raw: parsed.append(raw) or parse_tool(raw))
    store_mod.stored_tool.cache_clear()
    names = [f"t{os.getpid()}_{i}" for i in range(5)]
    store.registry_put([_tool(n) for n in names])
    assert store.registry_get(names[2]).name == names[2] and len(parsed) == 1
    assert store.registry_get(names[2]) is store.registry_get(names[2]) and len(parsed) == 1
    assert store.registry_get("nope") is None
    store.registry_put([_tool(names[2], "changed")])  # a new text is parsed anew: never a stale tool
    assert store.registry_get(names[2]).description == "changed" and len(parsed) == 2
    assert {n for n in store.registry_snapshot()[0]} >= set(names)


def test_concurrent_registry_writers_never_lose_an_update(store):
    def writer(i):
        for j in range(10):
            store.registry_put([_tool(f"t{i}_{j}")])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tools, version = store.registry_snapshot()
    assert len(tools) == 40 and version == 40


def test_flipped_byte_is_detected_locally(tmp_path):
    s = LocalStore(tmp_path)
    s.put("k", b"hello world")
    p = tmp_path / "objects" / "k"
    blob = bytearray(p.read_bytes())
    blob[-1] ^= 0x01
    p.write_bytes(bytes(blob))
    with pytest.raises(DataCorruption, match="checksum"):
        s.get("k")


def test_truncated_object_is_detected_locally(tmp_path):
    s = LocalStore(tmp_path)
    s.put("k", b"hello world")
    p = tmp_path / "objects" / "k"
    p.write_bytes(p.read_bytes()[:-3])
    with pytest.raises(DataCorruption):
        s.get("k")


def test_flipped_byte_is_detected_in_redis(redis_store):
    redis_store.put("k", b"hello world")
    raw = bytearray(redis_store._r.get(redis_store._k("k")))
    raw[-2] ^= 0x40
    redis_store._r.set(redis_store._k("k"), bytes(raw))
    with pytest.raises(DataCorruption):
        redis_store.get("k")


def test_interrupted_write_leaves_old_object_and_no_temp_file(tmp_path, monkeypatch):
    s = LocalStore(tmp_path)
    s.put("k", b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        s.put("k", b"new")
    monkeypatch.undo()
    assert s.get("k") == b"old"
    assert [p.name for p in (tmp_path / "objects").iterdir()] == ["k"]


def test_redis_down_is_unavailable():
    s = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.5)
    with pytest.raises(Unavailable):
        s.ping()
    with pytest.raises(Unavailable):
        s.get("k")


def test_open_store_dispatch(tmp_path, redis_url):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert isinstance(open_store(f"file://{tmp_path}"), LocalStore)
    assert isinstance(open_store(redis_url), RedisStore)
    with pytest.raises(InvalidArgument):
        open_store("")


def test_artifact_key_is_content_addressed():
    k1 = artifact_key("atb", "f" * 64, "a" * 64)
    assert k1 == artifact_key("atb", "f" * 64, "a" * 64)
    assert k1 != artifact_key("atb", "e" * 64, "a" * 64) != artifact_key("atb", "f" * 64, "b" * 64)
