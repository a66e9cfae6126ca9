"""What a serving worker serves: the deployments it was started with, named in task headers by id.

WHY: a worker's data port takes TASKs from any peer that reaches it (TCP loopback by default).
If a header could name a graph, model or store path, a URI or engine options (cache size,
device), any local user reaching the port could make the worker read any file it can, or a
remote URI, and fill its memory. So the serving ops ("serve_batch", "serving_partials",
"serve_evict") take no path and no option from a header: a header names a deployment by its
id, and the worker serves only the deployments given to it by whoever started it:

- a deployments file named at start (`sparkgnn-worker --deployments FILE`): JSON
  `{"deployments": [spec, ...]}`. The worker reads it at start and again when a header names an
  id it does not know and the file has changed since (its size or mtime), so the process that
  started the worker (its controller: the online service's worker pool, a job's local[N]) adds
  a version by rewriting the file atomically, and withdraws one the same way. The file must be
  owned by the worker's user and writable by no one else (refused otherwise, like ssh's
  authorized_keys): the authority to add a deployment is the authority to write that file.
- `register(spec)` in this process itself (the online service's in-process pool, the in-process
  CGP transport): there the caller is the controller.

A spec is `{"graph": DIR, "model": PATH, "store": DIR or null, "options": {mode: {...}},
"cache": {"policy", "bytes", "device"}}`; its id (`deployment_id`) is the SHA-256 of its JSON with
sorted keys, so a controller and its workers compute it alike without sharing anything else,
and an id grants nothing beyond the spec it names. An id this process does not serve is refused
with one line (UnknownDeployment) that names no path.

The caches the ops keep (loaded deployments, CGP shards) are bounded by `cache_bytes()`
(`--serve-cache-bytes`), least recently used first out; what a running call uses stays.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading

from sparkgnn.errors import SparkGNNError

ID_HEX_DIGITS = 64
SPEC_KEYS: dict[str, type | tuple[type, ...]] = {
    "graph": str,
    "model": str,
    "store": (str, type(None)),
    "options": dict,
    "cache": dict,
}
# Header fields that named paths or engine options before deployments were registered; a header
# still carrying one is refused (not ignored), so a stale caller fails loudly.
FORBIDDEN_HEADER_FIELDS = ("cfg", "graph", "store", "model_path", "options", "cache", "device", "spec", "path")
DEFAULT_CACHE_BYTES = 8 << 30

_LOCK = threading.Lock()
_REGISTERED: dict[str, tuple[dict, int]] = {}  # id -> (spec, registrations) made in this process
_FILE: dict = {"path": None, "stamp": None, "specs": {}}  # the deployments file named at start
_CACHE_BYTES = [DEFAULT_CACHE_BYTES]


class UnknownDeployment(SparkGNNError, ValueError):
    """A task header names a deployment this worker was not started with, or names paths."""


def deployment_id(spec: dict) -> str:
    """The id of a deployment spec: SHA-256 (hex) of its JSON with sorted keys."""
    return hashlib.sha256(json.dumps(check_spec(spec), sort_keys=True).encode()).hexdigest()


def check_spec(spec, where: str = "deployment") -> dict:
    """`spec` with exactly the keys of SPEC_KEYS, of their types; UnknownDeployment otherwise."""
    if not isinstance(spec, dict) or set(spec) != set(SPEC_KEYS):
        keys = sorted(spec) if isinstance(spec, dict) else type(spec).__name__
        raise UnknownDeployment(f"{where}: a deployment spec has exactly the keys {sorted(SPEC_KEYS)}, got {keys}")
    for key, kind in SPEC_KEYS.items():
        if not isinstance(spec[key], kind):
            raise UnknownDeployment(f"{where}: deployment {key!r} has the wrong type {type(spec[key]).__name__}")
    return spec


def check_id(value, field: str = "deployment") -> str:
    """`value` if it is a deployment id (64 lower-case hex digits), else UnknownDeployment saying
    that headers carry ids, never paths or specs."""
    if not isinstance(value, str) or len(value) != ID_HEX_DIGITS or value.strip("0123456789abcdef"):
        raise UnknownDeployment(
            f"task header {field!r} must be a deployment id ({ID_HEX_DIGITS} hex digits); a worker "
            f"serves only the deployments named at its start, never paths or specs from a header"
        )
    return value


def check_header(header: dict) -> None:
    """UnknownDeployment when a serving op's header carries a field that names paths or options."""
    found = sorted(k for k in FORBIDDEN_HEADER_FIELDS if k in header)
    if found:
        raise UnknownDeployment(
            f"task header fields {found} are not accepted: a worker takes no path or engine option from "
            f"a header, only a deployment id it was started with"
        )


def register(spec: dict) -> str:
    """Serve `spec` in this process (the caller is its controller); returns its id. Counted:
    each register needs its own withdraw."""
    key = deployment_id(spec)
    with _LOCK:
        _, count = _REGISTERED.get(key, (spec, 0))
        _REGISTERED[key] = (json.loads(json.dumps(spec)), count + 1)
    return key


def withdraw(key: str) -> None:
    """Undo one `register` of `key` (no-op for an id not registered here)."""
    with _LOCK:
        found = _REGISTERED.get(key)
        if found is None:
            return
        if found[1] > 1:
            _REGISTERED[key] = (found[0], found[1] - 1)
        else:
            del _REGISTERED[key]


def serve_file(path: str | None) -> int:
    """Serve the deployments listed in the file `path` (None: none); read it now (refusing a
    malformed, foreign-owned or group/world-writable file) and again when it changes. Returns
    how many it lists."""
    with _LOCK:
        _FILE.update(path=None if path is None else os.path.abspath(path), stamp=None, specs={})
        if path is None:
            return 0
        _reload_locked(force=True)
        return len(_FILE["specs"])


def set_cache_bytes(n: int) -> None:
    """The bound of each serving cache (loaded deployments, CGP shards) in this process."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"serving cache bytes must be an integer >= 1, got {n!r}")
    _CACHE_BYTES[0] = n


def cache_bytes() -> int:
    return _CACHE_BYTES[0]


def lookup(key) -> dict:
    """The spec of deployment id `key`; UnknownDeployment (one line, no path) when this process
    does not serve it (the deployments file is re-read first when it changed)."""
    key = check_id(key)
    with _LOCK:
        found = _serving_locked(key)
        if found is None and _FILE["path"] is not None:
            _reload_locked(force=False)
            found = _serving_locked(key)
    if found is None:
        raise UnknownDeployment(
            f"deployment {key[:12]} is not served here: a worker serves only the deployments it was "
            f"started with (--deployments) or its controller registered"
        )
    return found


def serves(key: str) -> bool:
    """Whether `key` is served now (re-reading a changed deployments file): retirement asks this,
    so a peer can make a worker drop only what its controller withdrew."""
    with _LOCK:
        if _FILE["path"] is not None:
            _reload_locked(force=False)
        return _serving_locked(key) is not None


def _serving_locked(key: str) -> dict | None:
    registered = _REGISTERED.get(key)
    return registered[0] if registered is not None else _FILE["specs"].get(key)


def _reload_locked(force: bool) -> None:
    path = _FILE["path"]
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UnknownDeployment(f"deployments file {path}: cannot read it ({exc.strerror})") from None
    stamp_now = (info.st_size, info.st_mtime_ns, info.st_ino)
    if not force and stamp_now == _FILE["stamp"]:
        return
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnknownDeployment(
            f"deployments file {path}: must be owned by this worker's user and writable by no one else"
        )
    _FILE["specs"] = read_file(path)
    _FILE["stamp"] = stamp_now


def read_file(path: str) -> dict[str, dict]:
    """{id: spec} of a deployments file; UnknownDeployment (one line) when it is malformed."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError, RecursionError) as exc:
        raise UnknownDeployment(f"deployments file {path}: not readable JSON ({type(exc).__name__})") from None
    if not isinstance(data, dict) or set(data) != {"deployments"} or not isinstance(data["deployments"], list):
        raise UnknownDeployment(f'deployments file {path}: want {{"deployments": [spec, ...]}}')
    return {deployment_id(check_spec(s, f"deployments file {path}")): s for s in data["deployments"]}


def write_file(path: str, specs: list[dict]) -> list[str]:
    """Write a deployments file (the controller's side): atomically (a worker reading it sees the
    old list or the new), mode 0600. Returns the ids, in order."""
    ids = [deployment_id(s) for s in specs]
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"deployments": specs}, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return ids
