"""Listing, checksumming and footer-checking the data files of a directory, on any filesystem
pyarrow reaches (local paths, file: URIs, and the remote schemes pyarrow.fs supports).

WHY one module: the graph reader (is graph.json still describing these files?), the PE store
(are the committed layer files the ones the manifest vouches for?) and the output writer (swap a
finished result into place) all need the same three facts about a directory -- which data files it
holds, their sizes and modification times, and whether each is a readable Parquet file -- and must
agree on what counts as a data file (Spark's `_SUCCESS`, `.crc` and `.tmp-*` side files do not).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

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


def filesystem(path) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it). Plain paths and file: URIs are local and made absolute."""
    path = str(path)
    if path.startswith("file:"):
        path = path[len("file://") :] if path.startswith("file://") else path[len("file:") :]
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return pafs.FileSystem.from_uri(path)


def join(path: str, *parts: str) -> str:
    return "/".join([str(path).rstrip("/"), *parts])


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
    """CRC-32 of a file's bytes as 8 hex digits (~2 GB/s here: cheap enough to check on open)."""
    fs, inner = filesystem(path)
    value = 0
    with fs.open_input_stream(inner) as stream:
        while True:
            chunk = stream.read(_CHUNK)
            if not chunk:
                break
            value = zlib.crc32(chunk, value)
    return f"{value & 0xFFFFFFFF:08x}"


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
