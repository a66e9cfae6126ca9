"""Where a PE store keeps what, and the one way its manifest is read and written.

    <store>/<graph fingerprint>/<model fingerprint>/manifest.json          the commit record
    <store>/<graph fingerprint>/<model fingerprint>/_writer.json           the writer's lease
    <store>/<graph fingerprint>/<model fingerprint>/layer=<l>/attempt=<id>/part-*.parquet   id, h[, state]
    <store>/<graph fingerprint>/<model fingerprint>/metrics/<name>/attempt=<id>/part-*.parquet

WHY fingerprints in the path: a store can hold PEs of several models over several graphs side by
side, and a reader asked for (graph G, model M) can only ever open G/M's directory, so stale PEs
are never picked up by accident.

WHY attempts and a manifest, not renames: the store must work where there is no rename (S3 and
other object stores, where a "move" is a copy and a directory is only a key prefix). Every write of
a layer goes to a fresh `attempt=<uuid>/` folder, and the manifest -- one JSON object, written
last and whole (files.write_json_atomic: a put on an object store, temp + rename on a disk) -- is
the COMMIT RECORD: it names the layers in `layers_complete`, the attempt folder of each under
`paths`, and every file of it (size, CRC-32) under `files`. Anything else on disk (an attempt of a
crashed or concurrent run, a legacy `layer=<l>.tmp-*` dir) is never read and is deleted by the
next writer once its own commit is in. Stores written before attempts existed have no `paths`:
their layer files lie in `layer=<l>/` itself, and readers still find them there.

Paths are local paths or URIs (sparkgnn.files: s3://, hdfs://, ...); Python reads and writes go
through pyarrow.fs, Spark's through `spark_uri` (its own Hadoop filesystem).
"""

from __future__ import annotations

import datetime as _dt
import uuid

from sparkgnn import files

MANIFEST_FILE = "manifest.json"
LEASE_FILE = "_writer.json"
FORMAT = 1
METRICS_DIR = "metrics"
PATHS_KEY = "paths"
ATTEMPT_PREFIX = "attempt="


def normal_path(path) -> str:
    """A local path (or file: URI) as a plain absolute path; a remote URI without a trailing '/'."""
    path = str(path)
    if files.is_local(path):
        return files.filesystem(path)[1]
    return path.rstrip("/")


def spark_uri(path: str) -> str:
    """What Spark's Hadoop filesystem is given: file:// for local paths (so it stays local when
    the default FS is HDFS), s3a:// for s3:// (needs hadoop-aws on the cluster)."""
    return files.spark_uri(path)


def store_dir(root, graph_fp: str, model_fp: str) -> str:
    """`<root>/<graph fp>/<model fp>`; fingerprints that are not hex of their length are refused."""
    from sparkgnn.graph.fingerprint import check_fingerprint as check_graph
    from sparkgnn.models.serialization import check_fingerprint as check_model

    check_graph(graph_fp, "PE store: graph fingerprint")
    check_model(model_fp, "PE store: model fingerprint")
    return files.join(normal_path(root), graph_fp, model_fp)


def layer_dir(base: str, layer: int) -> str:
    """The folder of layer `layer` (its attempts lie inside; see committed_dir)."""
    return files.join(base, layer_key(layer))


def layer_key(layer: int) -> str:
    """Key of a layer in manifest["files"] and manifest["paths"] (its folder under the store)."""
    return f"layer={int(layer)}"


def metrics_key(name: str) -> str:
    return f"{METRICS_DIR}/{name}"


def new_attempt(key: str) -> str:
    """A fresh attempt folder for `key`, relative to the store directory."""
    return f"{key}/{ATTEMPT_PREFIX}{uuid.uuid4().hex}"


def committed_dir(base: str, manifest: dict, key: str) -> str:
    """Where the manifest says the committed files of `key` (a layer or metrics table) lie: its
    attempt folder, or the key's folder itself for stores written before attempts existed."""
    rel = (manifest.get(PATHS_KEY) or {}).get(key) or key
    return files.join(base, rel)


def committed_files(base: str, manifest: dict, key: str) -> list[str] | None:
    """The paths of the files the manifest recorded for `key` (None: no record, read the folder)."""
    recorded = (manifest.get("files") or {}).get(key)
    if not recorded:
        return None
    folder = committed_dir(base, manifest, key)
    return [files.join(folder, r["file"]) for r in recorded]


def read_table(base: str, manifest: dict, key: str, columns=None):
    """The committed rows of `key` with pyarrow: exactly the recorded files (a stray file in the
    folder is never read), or the whole folder when the store has no file record."""
    import pyarrow.parquet as pq

    listed = committed_files(base, manifest, key)
    if listed is None:
        fs, inner = files.filesystem(committed_dir(base, manifest, key))
        return pq.read_table(inner, filesystem=fs, columns=columns)
    fs = files.filesystem(listed[0])[0]
    return pq.read_table([files.filesystem(p)[1] for p in listed], filesystem=fs, columns=columns)


def spark_paths(base: str, manifest: dict, key: str) -> list[str]:
    """What Spark reads for `key`: the recorded files, or the committed folder without a record."""
    listed = committed_files(base, manifest, key)
    return [spark_uri(p) for p in listed] if listed else [spark_uri(committed_dir(base, manifest, key))]


def stale_tmp_dirs(final: str) -> list[str]:
    """Left-overs of the rename-based protocol of earlier versions (`<final>.tmp-*`)."""
    folder, _sep, name = final.rstrip("/").rpartition("/")
    prefix = name + ".tmp-"
    return [files.join(folder, d) for d in sorted(files.entries(folder)) if d.startswith(prefix)]


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_manifest(base: str) -> dict | None:
    try:
        return files.read_json(files.join(base, MANIFEST_FILE))
    except FileNotFoundError:
        return None


def write_manifest(base: str, manifest: dict) -> None:
    """Atomic (one put on an object store; temp file, fsync, rename on a disk): readers see the
    old or the new manifest, never half of one, so the manifest serves as the commit record."""
    files.write_json_atomic(files.join(base, MANIFEST_FILE), manifest, indent=2, sort_keys=True)


def dir_bytes(path: str) -> int:
    """Bytes of the data files under a directory (Spark's .crc/_SUCCESS side files excluded)."""
    return sum(f.size for f in files.data_files(path))
