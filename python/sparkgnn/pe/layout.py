"""Where a PE store keeps what, and the one way its manifest is read and written.

    <store>/<graph fingerprint>/<model fingerprint>/manifest.json
    <store>/<graph fingerprint>/<model fingerprint>/layer=<l>/part-*.parquet   id, h[, state]
    <store>/<graph fingerprint>/<model fingerprint>/metrics/<name>/part-*.parquet

WHY fingerprints in the path: a store can hold PEs of several models over several graphs side by
side, and a reader asked for (graph G, model M) can only ever open G/M's directory, so stale PEs
are never picked up by accident. The manifest is the COMMIT RECORD: a layer directory counts only
once its number is in `layers_complete`; anything else on disk (a half-written `.tmp-*` dir, an
orphaned layer dir from a crashed forced rerun) is ignored and cleaned up by the next writer.

Local filesystem only: the commit protocol relies on POSIX rename of a directory and
os.replace of a file being atomic. On HDFS the same protocol works with FileSystem.rename (atomic
for directories); on S3 (no atomic rename) it needs a committer or a manifest-only commit.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import uuid

MANIFEST_FILE = "manifest.json"
FORMAT = 1
METRICS_DIR = "metrics"


def local_path(path) -> str:
    """Plain absolute local path (accepts file: URIs); refuses remote URIs (see module doc)."""
    path = str(path)
    if path.startswith("file://"):
        path = path[len("file://") :]
    elif path.startswith("file:"):
        path = path[len("file:") :]
    if "://" in path:
        raise NotImplementedError(
            f"PE stores are local-filesystem only for now, got {path!r} "
            "(HDFS needs FileSystem.rename, S3 a manifest-only commit)"
        )
    return os.path.abspath(path)


def spark_uri(path: str) -> str:
    """file: URI so Spark writes/reads the LOCAL path even when its default FS is HDFS."""
    return "file://" + local_path(path)


def store_dir(root, graph_fp: str, model_fp: str) -> str:
    return os.path.join(local_path(root), graph_fp, model_fp)


def layer_dir(base: str, layer: int) -> str:
    return os.path.join(base, f"layer={int(layer)}")


def tmp_dir(final: str) -> str:
    return f"{final}.tmp-{uuid.uuid4().hex}"


def stale_tmp_dirs(final: str) -> list[str]:
    """Left-overs of crashed commits of this very directory (`<final>.tmp-*`)."""
    parent, name = os.path.split(final)
    if not os.path.isdir(parent):
        return []
    prefix = name + ".tmp-"
    return [os.path.join(parent, d) for d in sorted(os.listdir(parent)) if d.startswith(prefix)]


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_manifest(base: str) -> dict | None:
    path = os.path.join(base, MANIFEST_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def write_manifest(base: str, manifest: dict) -> None:
    """Atomic: write a temp file beside it, fsync, os.replace. Readers see the old or the new
    manifest, never half of one, so the manifest can serve as the commit record."""
    os.makedirs(base, exist_ok=True)
    target = os.path.join(base, MANIFEST_FILE)
    tmp = f"{target}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)


def dir_bytes(path: str) -> int:
    """Bytes of the data files under a directory (Spark's .crc/_SUCCESS side files excluded)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            if not f.startswith((".", "_")):
                total += os.path.getsize(os.path.join(root, f))
    return total
