"""Listing, checksumming and footer-checking the data files of a directory, on any filesystem
pyarrow reaches (local paths, file: URIs, and the remote schemes pyarrow.fs supports).

WHY one module: the graph reader (is graph.json still describing these files?), the PE store
(are the committed layer files the ones the manifest vouches for?) and the output writer (swap a
finished result into place) all need the same three facts about a directory -- which data files it
holds, their sizes and modification times, and whether each is a readable Parquet file -- and must
agree on what counts as a data file (Spark's `_SUCCESS`, `.crc` and `.tmp-*` side files do not).

It is also the one filesystem layer for what the driver and the tasks read and write themselves
(PE store manifests and lookups, the model store, prepared-layout markers, small JSON files):
`read_bytes` / `write_bytes_atomic` / `read_json` / `write_json_atomic`, `entries`, `delete`.

Remote URIs. `s3://bucket/key` (also `s3a://`, `s3n://`, the Hadoop spellings) resolves to
pyarrow's S3FileSystem, configured the AWS way: AWS_ENDPOINT_URL (an S3-compatible endpoint such
as MinIO or moto, `http://host:port`), AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_REGION. A
filesystem configured in code can be bound to a URI prefix with `register_filesystem("s3://bucket",
fs)`: paths under it then use `fs` (this process only; Spark tasks see the environment, not the
registry). `hdfs://` and the other schemes pyarrow knows go through `FileSystem.from_uri`.
Spark's own reads and writes never come here: `spark_uri` turns a path into what Spark's Hadoop
filesystem expects (`file://` for local paths, `s3a://` for S3, which needs the hadoop-aws
connector on the cluster; pyspark does not ship it).

Atomic single objects: on a local disk (and HDFS) a hidden temporary file beside the target,
then a rename; on an object store (no rename: a "move" is a copy) the whole object in one put,
which becomes visible only once complete, so readers see the old or the new object, never half.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
import zlib
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs
import pyarrow.parquet as pq

_CHUNK = 8 << 20


@dataclass(frozen=True)
class DataFile:
    rel: str  # path relative to the listed directory, '/'-separated
    size: int
    mtime_ns: int


def is_local(path) -> bool:
    """A plain path or a file: URI (decided from the text: no remote filesystem is contacted)."""
    path = str(path)
    return path.startswith("file:") or "://" not in path


def absolute(path) -> str:
    """`path` as every process of a cluster must see it: a plain path or file: URI made absolute
    against this (the driver's) working directory, a remote URI unchanged. Why: tasks resolve a
    relative path against their own working directory, which on a cluster is the executor's
    (`.../work/app-<id>/<n>/` under local-cluster), not the driver's: a relative --graph failed
    there with "Failed to open local file .../work/app-.../1/data/...".
    """
    path = str(path)
    if path.startswith("file:"):
        return "file://" + filesystem(path)[1]
    return path if "://" in path else os.path.abspath(path)


def parquet_batches(path, columns: list[str], batch_size: int):
    """The record batches of one Parquet file (only `columns`), read through its filesystem."""
    fs, inner = filesystem(path)
    with fs.open_input_file(inner) as handle:
        yield from pq.ParquetFile(handle).iter_batches(batch_size=batch_size, columns=columns)


def dealt_batches(files: list[str], columns: list[str], reader: int, readers: int, batch_size: int):
    """The record batches reader `reader` of `readers` reads of a set of Parquet files: the row
    groups of `files`, numbered file by file, whose number is `reader` modulo `readers` (only
    `columns`). WHY row groups, not whole files: a graph written as one file (as most are below a
    few million rows a file) was read by one task while the other cores waited (prepare's first
    pass); every reader opens each footer instead, a small read."""
    unit = 0
    for path in files:
        fs, inner = filesystem(path)
        with fs.open_input_file(inner) as handle:
            parquet = pq.ParquetFile(handle)
            mine = [g for g in range(parquet.num_row_groups) if (unit + g) % readers == reader]
            unit += parquet.num_row_groups
            if mine:
                yield from parquet.iter_batches(batch_size=batch_size, columns=columns, row_groups=mine)


# Object stores: no directories, no rename; pyarrow addresses an object as "bucket/key".
OBJECT_STORE_SCHEMES = ("s3", "gs", "gcs")
# Hadoop's spellings of S3 (what Spark is given) read as pyarrow's s3.
_S3_ALIASES = ("s3a", "s3n")
# The environment pyarrow's S3 filesystem is configured from (a cached filesystem is reused only
# while these are unchanged).
_S3_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
)
_REGISTERED: dict[str, pafs.FileSystem] = {}
_CACHE: dict[tuple, pafs.FileSystem] = {}
_LOCK = threading.Lock()


def register_filesystem(prefix: str, fs: pafs.FileSystem) -> None:
    """Route every path equal to or under the URI `prefix` (e.g. "s3://bucket") to `fs`, a pyarrow
    filesystem configured in code (endpoint, credentials). The path inside it is what pyarrow
    expects: "bucket/key" for object stores, the URI's path otherwise. This process only."""
    prefix = _pyarrow_uri(str(prefix)).rstrip("/")
    if "://" not in prefix:
        raise ValueError(f"register_filesystem needs a URI prefix such as s3://bucket, got {prefix!r}")
    with _LOCK:
        _REGISTERED[prefix] = fs


def unregister_filesystem(prefix: str) -> None:
    with _LOCK:
        _REGISTERED.pop(_pyarrow_uri(str(prefix)).rstrip("/"), None)


def _pyarrow_uri(path: str) -> str:
    scheme, sep, rest = path.partition("://")
    return f"s3://{rest}" if sep and scheme in _S3_ALIASES else path


def is_object_store(path) -> bool:
    """An s3:// (s3a://, s3n://) or gs:// URI: no rename, so commits are manifests written last."""
    scheme, sep, _rest = str(path).partition("://")
    return bool(sep) and (scheme in OBJECT_STORE_SCHEMES or scheme in _S3_ALIASES)


def _inner_path(uri: str) -> str:
    scheme, _sep, rest = uri.partition("://")
    if scheme in OBJECT_STORE_SCHEMES:
        rest = rest.split("?", 1)[0]
        return rest.rstrip("/") or rest
    return urlparse(uri).path


def filesystem(path) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it). Plain paths and file: URIs are local and made absolute;
    remote URIs use a registered filesystem (register_filesystem), else pyarrow's from_uri (one
    filesystem per bucket / authority and configuration, reused)."""
    path = str(path)
    if path.startswith("file:"):
        path = path[len("file://") :] if path.startswith("file://") else path[len("file:") :]
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    path = _pyarrow_uri(path)
    with _LOCK:
        matches = [p for p in _REGISTERED if path == p or path.startswith(p + "/")]
        if matches:
            return _REGISTERED[max(matches, key=len)], _inner_path(path)
    if "?" in path:  # options in the URI itself: pyarrow parses them each time
        return pafs.FileSystem.from_uri(path)
    parsed = urlparse(path)
    key = (parsed.scheme, parsed.netloc, tuple(os.environ.get(k) for k in _S3_ENV))
    with _LOCK:
        fs = _CACHE.get(key)
    if fs is None:
        fs, inner = pafs.FileSystem.from_uri(path)
        with _LOCK:
            _CACHE[key] = fs
        return fs, inner
    return fs, _inner_path(path)


def spark_uri(path) -> str:
    """`path` as Spark's Hadoop filesystem must be given it: a local path as an absolute file: URI
    (so it stays local when the cluster's default filesystem is HDFS), s3:// as s3a:// (Hadoop's
    S3 connector, hadoop-aws, which the cluster must provide), other URIs unchanged."""
    path = str(path)
    if is_local(path):
        return "file://" + filesystem(path)[1]
    scheme, _sep, rest = path.partition("://")
    return f"s3a://{rest}" if scheme == "s3" else path


def join(path: str, *parts: str) -> str:
    return "/".join([str(path).rstrip("/"), *parts])


def parent(path: str) -> str:
    """The folder holding `path` (a path or URI; '/'-separated)."""
    head, _sep, _name = str(path).rstrip("/").rpartition("/")
    return head


def exists(path) -> bool:
    return kind(path) != "missing"


def entries(path) -> dict[str, str]:
    """{name: 'dir' | 'file'} of the direct children of the folder `path` ({} when absent)."""
    fs, inner = filesystem(path)
    try:
        infos = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True, recursive=False))
    except (FileNotFoundError, NotADirectoryError):
        return {}
    found = {}
    for info in infos:
        if info.type in (pafs.FileType.Directory, pafs.FileType.File):
            found[info.base_name] = "dir" if info.type == pafs.FileType.Directory else "file"
    return found


def delete(path) -> None:
    """Remove a file or a folder with everything under it; an absent path is not an error."""
    fs, inner = filesystem(path)
    info = fs.get_file_info(inner)
    try:
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(inner)
        elif info.type == pafs.FileType.File:
            fs.delete_file(inner)
    except FileNotFoundError:
        pass


def makedirs(path) -> None:
    """Create a folder and its parents (object stores have no folders: nothing to do)."""
    if is_object_store(path):
        return
    fs, inner = filesystem(path)
    fs.create_dir(inner, recursive=True)


def read_bytes(path) -> bytes:
    """A whole file. Raises FileNotFoundError when it is absent."""
    fs, inner = filesystem(path)
    if fs.get_file_info(inner).type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: no such file")
    with fs.open_input_stream(inner) as stream:
        return stream.readall()


def write_bytes_atomic(path, data: bytes) -> None:
    """Write `data` as the whole content of `path` so that readers see the previous content or
    this one, never part of it: on an object store one put (an object appears only once its
    upload completes), elsewhere a hidden temporary file beside it, synced, then renamed over it
    (atomic on a local disk and on HDFS). Parent folders are created."""
    data = bytes(data)
    if is_object_store(path):
        fs, inner = filesystem(path)
        with fs.open_output_stream(inner) as sink:
            sink.write(data)
        return
    fs, inner = filesystem(path)
    folder, _sep, name = inner.rstrip("/").rpartition("/")
    temporary = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(folder or "/", exist_ok=True)
        try:
            with open(temporary, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temporary, inner)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        return
    fs.create_dir(folder, recursive=True)
    try:
        with fs.open_output_stream(temporary) as sink:
            sink.write(data)
        fs.move(temporary, inner)  # pyarrow.fs: a file at the destination is replaced
    except BaseException:
        if fs.get_file_info(temporary).type == pafs.FileType.File:
            fs.delete_file(temporary)
        raise


def read_json(path):
    """A JSON document. Raises FileNotFoundError when absent, ValueError when it does not parse."""
    return json.loads(read_bytes(path))


def write_json_atomic(path, content, **dump_options) -> None:
    """`content` as JSON, written with write_bytes_atomic (`dump_options`: json.dumps's)."""
    write_bytes_atomic(path, json.dumps(content, **dump_options).encode())


def kind(path) -> str:
    """'dir', 'file' or 'missing'."""
    fs, inner = filesystem(path)
    info = fs.get_file_info(inner)
    return {pafs.FileType.Directory: "dir", pafs.FileType.File: "file"}.get(info.type, "missing")


def is_data_name(rel: str) -> bool:
    """Spark and Hadoop mark side files (_SUCCESS, .part.crc, _temporary/, .tmp dirs) by a leading
    '_' or '.' in some path component; everything else is data."""
    return not any(part.startswith(("_", ".")) for part in rel.split("/"))


def data_files(path) -> list[DataFile]:
    """Every data file under `path` (recursive; partition folders like part=3/ included), sorted
    by relative path. An absent directory lists as []."""
    fs, inner = filesystem(path)
    if fs.get_file_info(inner).type != pafs.FileType.Directory:
        return []
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True))
    prefix = inner.rstrip("/") + "/"
    found = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(prefix) :] if info.path.startswith(prefix) else info.base_name
        if is_data_name(rel):
            found.append(DataFile(rel, int(info.size), int(info.mtime_ns or 0)))
    return sorted(found, key=lambda f: f.rel)


def crc32(path) -> str:
    """CRC-32 of a file's bytes as 8 hex digits (cheap enough to check on open)."""
    fs, inner = filesystem(path)
    value = 0
    with fs.open_input_stream(inner) as stream:
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            value = zlib.crc32(chunk, value)
    return f"{value & 0xFFFFFFFF:08x}"


class ChecksummedOutput:
    """A file-like writer over an output stream of `path` that keeps the CRC-32 and size of the
    bytes passed through it, so a writer (pyarrow's Parquet and IPC writers take file-likes)
    records a file's checksum as crc32(path) would give it without reading the file back.
    `crc32` is final once the `with` block ends (the stream closed)."""

    def __init__(self, path):
        fs, inner = filesystem(path)
        self._stream = fs.open_output_stream(inner)
        self._value, self.size, self.closed = 0, 0, False

    def write(self, data) -> int:
        view = memoryview(data)
        self._value = zlib.crc32(view, self._value)
        self.size += view.nbytes
        self._stream.write(view)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self._stream.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._stream.close()

    @property
    def crc32(self) -> str:
        return f"{self._value & 0xFFFFFFFF:08x}"

    def __enter__(self) -> ChecksummedOutput:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parquet_problem(path) -> str | None:
    """Why `path` is not a readable Parquet file (empty, truncated, foreign), or None. Reads the
    footer only, so it costs one small read per file."""
    fs, inner = filesystem(path)
    try:
        with fs.open_input_file(inner) as handle:
            pq.ParquetFile(handle).metadata  # noqa: B018 - parsing the footer is the check
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad footer
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not a readable Parquet file ({first})"
    return None


def parquet_rows(folder) -> int:
    """The rows of every data file under `folder`, from their footers (one small read per file)."""
    total = 0
    for found in data_files(folder):
        fs, inner = filesystem(join(folder, found.rel))
        with fs.open_input_file(inner) as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    return total


def parquet_columns(path) -> list[str]:
    fs, inner = filesystem(path)
    with fs.open_input_file(inner) as handle:
        return list(pq.ParquetFile(handle).schema_arrow.names)


def reachable(path) -> bool:
    """Whether pyarrow.fs can list `path` (local paths always; a remote scheme only when this
    pyarrow build and its configuration support it). Callers skip file-level checks otherwise
    and let Spark's Hadoop filesystems do the reading."""
    try:
        fs, inner = filesystem(path)
        fs.get_file_info(inner)
    except Exception:  # noqa: BLE001 - unsupported scheme, missing native library, no credentials
        return False
    return True
