"""Content-addressed artifact store and the shared tool registry.

Two real implementations behind one interface:

* ``LocalStore``  - a directory (the embedded default; ``make run`` needs no server).
* ``RedisStore``  - a ``redis://`` URL shared by every node of the cluster.

Every object is written whole or not at all (temp file + ``os.replace`` locally, a single
``SET`` / ``MULTI`` on Redis) inside an envelope that records its SHA-256; reads verify it and
raise ``DataCorruption`` rather than return damaged bytes. Keys are content addresses:
``artifact_key(kind, fingerprint, schema_hash)`` where ``fingerprint`` identifies the model the
artifact depends on. Stored data is never unpickled or evaluated: envelopes are JSON + bytes.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.errors import ArtifactNotFound, DataCorruption, InvalidArgument, Unavailable
from services.common.tools import Tool, parse_tool

_MAGIC = b"NXOBJv1\x00"
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}$")


def artifact_key(kind: str, fingerprint: str, schema_hash: str) -> str:
    """Content address of an artifact: its kind, the model it depends on, the tool's schema hash."""
    return f"{kind}-{fingerprint[:16]}-{schema_hash[:40]}"


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    sha256: str
    meta: dict[str, Any]


def _meta_digest(meta: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


_HEADER_KEYS = {"sha256", "size", "meta", "meta_sha256"}


def encode_envelope(data: bytes, meta: dict[str, Any] | None = None) -> tuple[bytes, ObjectInfo]:
    digest, meta = hashlib.sha256(data).hexdigest(), meta or {}
    header = json.dumps({"sha256": digest, "size": len(data), "meta": meta, "meta_sha256": _meta_digest(meta)},
                        sort_keys=True).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + data, ObjectInfo("", len(data), digest, meta)


def decode_envelope(key: str, blob: bytes) -> tuple[bytes, ObjectInfo]:
    """Split and verify an envelope; any damage raises ``DataCorruption``. The payload is covered by
    ``sha256``, the metadata by ``meta_sha256`` (envelopes written before it existed are read without it),
    and the header's keys must be exactly the known ones, so a flipped bit anywhere is detected."""
    if len(blob) < len(_MAGIC) + 4 or not blob.startswith(_MAGIC):
        raise DataCorruption(f"object {key!r}: bad envelope magic")
    (hlen,) = struct.unpack_from("<I", blob, len(_MAGIC))
    start = len(_MAGIC) + 4
    if start + hlen > len(blob):
        raise DataCorruption(f"object {key!r}: truncated header")
    try:
        header = json.loads(blob[start : start + hlen])
        if not isinstance(header, dict) or not {"sha256", "size"} <= set(header) <= _HEADER_KEYS:
            raise ValueError(f"unexpected header keys {sorted(header) if isinstance(header, dict) else header!r}")
        digest, size, meta = header["sha256"], int(header["size"]), header.get("meta", {})
        if not isinstance(meta, dict):
            raise ValueError("meta is not an object")
    except (ValueError, KeyError, TypeError) as e:
        raise DataCorruption(f"object {key!r}: unreadable header: {e}") from e
    if "meta_sha256" in header and header["meta_sha256"] != _meta_digest(meta):
        raise DataCorruption(f"object {key!r}: metadata checksum mismatch")
    data = blob[start + hlen :]
    if len(data) != size:
        raise DataCorruption(f"object {key!r}: size {len(data)} != recorded {size} (truncated?)")
    if hashlib.sha256(data).hexdigest() != digest:
        raise DataCorruption(f"object {key!r}: checksum mismatch")
    return data, ObjectInfo(key, size, digest, meta)


def _check_key(key: str) -> None:
    if not _KEY_RE.match(key):
        raise InvalidArgument(f"invalid object key {key!r}")


@functools.lru_cache(maxsize=8192)
def stored_tool(raw: str | bytes) -> Tool:
    """A registered tool from its stored canonical JSON, parsed (and its JSON Schema checked) once per distinct
    text: the engine reads its tool on every turn, and checking a schema costs ~1 ms (a whole registry's, ~0.4 s).
    The same text is the same tool, so the memo never answers stale."""
    return parse_tool(raw)


class Store(abc.ABC):
    """Artifact objects plus the versioned tool registry."""

    url: str

    # -- objects ---------------------------------------------------------------------------
    @abc.abstractmethod
    def put(self, key: str, data: bytes, meta: dict[str, Any] | None = None) -> ObjectInfo:
        """Store ``data`` under ``key`` atomically. Returns its info (size, checksum)."""

    @abc.abstractmethod
    def get_with_info(self, key: str) -> tuple[bytes, ObjectInfo]:
        """Read and verify an object; ``ArtifactNotFound`` / ``DataCorruption``."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, key: str) -> bool: ...

    def get(self, key: str) -> bytes:
        return self.get_with_info(key)[0]

    # -- registry --------------------------------------------------------------------------
    @abc.abstractmethod
    def registry_put(self, tools: list[Tool]) -> int:
        """Add or replace tools; returns the new registry version."""

    @abc.abstractmethod
    def registry_remove(self, names: list[str]) -> tuple[list[str], list[str], int]:
        """Remove tools by name; returns (removed, missing, version)."""

    @abc.abstractmethod
    def registry_snapshot(self) -> tuple[dict[str, Tool], int]:
        """All registered tools and the version they are at."""

    @abc.abstractmethod
    def registry_version(self) -> int: ...

    def registry_get(self, name: str) -> Tool | None:
        return self.registry_snapshot()[0].get(name)

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise ``Unavailable`` when the backing store cannot be reached."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class LocalStore(Store):
    """A directory: ``objects/<key>`` envelopes and ``registry.json``, with a lock file for writers."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root).resolve()
        self.url = str(self.root)
        (self.root / "objects").mkdir(parents=True, exist_ok=True)
        self._registry = self.root / "registry.json"
        self._lock = self.root / "registry.lock"

    def _path(self, key: str) -> Path:
        _check_key(key)
        return self.root / "objects" / key

    def _atomic_write(self, path: Path, blob: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.name[:40])
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def put(self, key: str, data: bytes, meta: dict[str, Any] | None = None) -> ObjectInfo:
        blob, info = encode_envelope(data, meta)
        self._atomic_write(self._path(key), blob)
        return ObjectInfo(key, info.size, info.sha256, info.meta)

    def get_with_info(self, key: str) -> tuple[bytes, ObjectInfo]:
        try:
            blob = self._path(key).read_bytes()
        except FileNotFoundError as e:
            raise ArtifactNotFound(f"no artifact {key!r} in store {self.url}") from e
        return decode_envelope(key, blob)

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
            return True
        except FileNotFoundError:
            return False

    @contextlib.contextmanager
    def _locked(self):
        with open(self._lock, "a+") as lf:
            fcntl.flock(lf, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lf, fcntl.LOCK_UN)

    def _read_registry(self) -> tuple[dict[str, Any], int]:
        try:
            data, _ = decode_envelope("registry", self._registry.read_bytes())
        except FileNotFoundError:
            return {}, 0
        doc = json.loads(data)
        return doc["tools"], int(doc["version"])

    def _write_registry(self, tools: dict[str, Any], version: int) -> None:
        blob, _ = encode_envelope(json.dumps({"version": version, "tools": tools}, sort_keys=True).encode())
        self._atomic_write(self._registry, blob)

    def registry_put(self, tools: list[Tool]) -> int:
        with self._locked():
            current, version = self._read_registry()
            for t in tools:
                current[t.name] = t.canonical_json()
            version += 1
            self._write_registry(current, version)
            return version

    def registry_remove(self, names: list[str]) -> tuple[list[str], list[str], int]:
        with self._locked():
            current, version = self._read_registry()
            removed = [n for n in names if n in current]
            missing = [n for n in names if n not in current]
            if removed:
                for n in removed:
                    del current[n]
                version += 1
                self._write_registry(current, version)
            return removed, missing, version

    def registry_snapshot(self) -> tuple[dict[str, Tool], int]:
        raw, version = self._read_registry()
        return {n: stored_tool(j) for n, j in raw.items()}, version

    def registry_get(self, name: str) -> Tool | None:
        raw = self._read_registry()[0].get(name)
        return None if raw is None else stored_tool(raw)

    def registry_version(self) -> int:
        return self._read_registry()[1]

    def ping(self) -> None:
        if not self.root.is_dir():
            raise Unavailable(f"store directory {self.root} is gone")


class RedisStore(Store):
    """Redis-backed store: ``{ns}:obj:<key>`` envelopes, ``{ns}:registry`` hash + ``{ns}:registry:version``."""

    def __init__(self, url: str, namespace: str = "nexus", socket_timeout: float = 5.0):
        import redis

        self.url = url
        self.ns = namespace
        self._r = redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
        self._redis_errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._auth_error = redis.exceptions.AuthenticationError

    @contextlib.contextmanager
    def _guard(self, what: str):
        try:
            yield
        except self._auth_error as e:  # a ConnectionError subclass: say what to fix
            raise Unavailable(f"redis store {self._safe_url()}: authentication failed during {what} "
                              f"(the password goes in the URL, redis://:PASSWORD@host:port/db): {e}") from e
        except self._redis_errors as e:
            raise Unavailable(f"redis store {self._safe_url()} unavailable during {what}: {e}") from e

    def _safe_url(self) -> str:
        return re.sub(r"//[^@/]*@", "//***@", self.url)

    def _k(self, key: str) -> str:
        _check_key(key)
        return f"{self.ns}:obj:{key}"

    def put(self, key: str, data: bytes, meta: dict[str, Any] | None = None) -> ObjectInfo:
        blob, info = encode_envelope(data, meta)
        with self._guard("put"):
            self._r.set(self._k(key), blob)
        return ObjectInfo(key, info.size, info.sha256, info.meta)

    def get_with_info(self, key: str) -> tuple[bytes, ObjectInfo]:
        with self._guard("get"):
            blob = self._r.get(self._k(key))
        if blob is None:
            raise ArtifactNotFound(f"no artifact {key!r} in store {self._safe_url()}")
        return decode_envelope(key, blob)

    def exists(self, key: str) -> bool:
        with self._guard("exists"):
            return bool(self._r.exists(self._k(key)))

    def delete(self, key: str) -> bool:
        with self._guard("delete"):
            return bool(self._r.delete(self._k(key)))

    def registry_put(self, tools: list[Tool]) -> int:
        with self._guard("registry_put"):
            pipe = self._r.pipeline(transaction=True)
            if tools:
                pipe.hset(f"{self.ns}:registry", mapping={t.name: t.canonical_json() for t in tools})
            pipe.incr(f"{self.ns}:registry:version")
            return int(pipe.execute()[-1])

    def registry_remove(self, names: list[str]) -> tuple[list[str], list[str], int]:
        with self._guard("registry_remove"):
            hkey, vkey = f"{self.ns}:registry", f"{self.ns}:registry:version"
            # WATCH makes the read-check-delete-bump atomic against concurrent writers.
            with self._r.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(hkey)
                        present = [bool(x) for x in pipe.hmget(hkey, names)] if names else []
                        removed = [n for n, p in zip(names, present, strict=True) if p]
                        missing = [n for n, p in zip(names, present, strict=True) if not p]
                        pipe.multi()
                        if removed:
                            pipe.hdel(hkey, *removed)
                            pipe.incr(vkey)
                        else:
                            pipe.get(vkey)
                        res = pipe.execute()
                        return removed, missing, int(res[-1] or 0)
                    except Exception as e:  # redis.WatchError: another writer won; retry
                        if type(e).__name__ != "WatchError":
                            raise
                        time.sleep(0.001)

    def registry_snapshot(self) -> tuple[dict[str, Tool], int]:
        with self._guard("registry_snapshot"):
            pipe = self._r.pipeline(transaction=True)
            pipe.hgetall(f"{self.ns}:registry")
            pipe.get(f"{self.ns}:registry:version")
            raw, version = pipe.execute()
        return {k.decode(): stored_tool(v) for k, v in raw.items()}, int(version or 0)

    def registry_get(self, name: str) -> Tool | None:
        with self._guard("registry_get"):
            raw = self._r.hget(f"{self.ns}:registry", name)
        return None if raw is None else stored_tool(raw)

    def registry_version(self) -> int:
        with self._guard("registry_version"):
            return int(self._r.get(f"{self.ns}:registry:version") or 0)

    def ping(self) -> None:
        with self._guard("ping"):
            self._r.ping()

    def close(self) -> None:
        self._r.close()


def open_store(url: str) -> Store:
    """``redis://`` / ``rediss://`` / ``unix://`` URLs open Redis; anything else is a local directory path
    (``file://`` prefix optional)."""
    if not url:
        raise InvalidArgument("store URL is empty")
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    if url.startswith("file://"):
        url = url[len("file://") :]
    return LocalStore(url)
