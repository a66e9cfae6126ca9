"""What a graph directory holds, checked before anything trusts it: the folders exist, every data
file is readable Parquet, and graph.json still describes the files beside it.

WHY graph.json is not simply trusted: it caches facts that are expensive to recompute (the content
fingerprint, "validated", sizes), and the prepared layouts and PE stores are keyed by that
fingerprint. If someone rewrites edges/ and keeps graph.json, a trusted fingerprint would serve the
OLD graph's cached layout: a silent wrong answer. So every writer records a `data_stamp` in
graph.json -- a hash of each data file's relative path, size and modification time, one listing
call, no data read -- and a reader trusts graph.json's data facts only while the stamp still
matches. A mismatch (or no stamp: a directory written by another tool, or by an older sparkgnn)
drops those facts, so the graph is validated and fingerprinted from its content again. A copy
that changes modification times costs a recomputation, never a wrong answer.
"""

from __future__ import annotations

import hashlib

from sparkgnn import files
from sparkgnn.errors import GraphValidationError
from sparkgnn.graph import layout

STAMP_KEY = "data_stamp"
# graph.json keys that describe the data itself: only trusted while the stamp matches.
_KEPT_WHEN_STALE = ("name", "format")
MAX_EXAMPLES = 5


def _folders(path: str) -> dict[str, str]:
    return {name: files.join(path, name) for name in (layout.VERTICES_DIR, layout.EDGES_DIR)}


def data_stamp(path) -> str:
    """Hash of (relative path, size, mtime) of every data file under vertices/ and edges/."""
    digest = hashlib.blake2b(digest_size=16)
    for name, folder in _folders(str(path)).items():
        for f in files.data_files(folder):
            digest.update(f"{name}/{f.rel}|{f.size}|{f.mtime_ns}\n".encode())
    return digest.hexdigest()


def check_graph_dir(path) -> None:
    """Raise GraphValidationError naming what makes `path` unreadable as a graph directory:
    a missing vertices/ or edges/ folder, a folder without Parquet files, or data files that are
    not readable Parquet (empty, truncated, foreign; count + first examples). Footers only."""
    path = str(path)
    where = files.kind(path)
    if where != "dir":
        raise GraphValidationError(
            f"graph directory {path} does not exist"
            if where == "missing"
            else f"graph directory {path} is a file, not a directory"
        )
    refuse_typed(path)
    problems = []
    for name, folder in _folders(path).items():
        why = folder_problem(folder, name)
        if why:
            problems.append(why)
    if problems:
        raise GraphValidationError(f"graph directory {path}: " + "; ".join(problems))


def folder_problem(folder: str, name: str) -> str | None:
    """Why the Parquet folder `folder` (shown as `name/`) cannot be read, or None: absent, without
    data files, or holding unreadable files (count + first examples). Footers only."""
    if files.kind(folder) != "dir":
        return f"no {name}/ folder (a graph directory holds vertices/ and edges/ Parquet folders)"
    found = files.data_files(folder)
    if not found:
        return f"{name}/ holds no data files"
    bad = [(f.rel, why) for f in found if (why := files.parquet_problem(files.join(folder, f.rel)))]
    if bad:
        shown = "; ".join(f"{name}/{rel}: {why}" for rel, why in bad[:MAX_EXAMPLES])
        more = ", ..." if len(bad) > MAX_EXAMPLES else ""
        return f"{len(bad)} of {len(found)} files in {name}/ are unreadable: {shown}{more}"
    return None


def refuse_typed(path) -> None:
    """Refuse, in one line, a typed graph directory where a job reads homogeneous graphs only:
    its vertices/ and edges/ hold one folder per type, which a homogeneous reader would
    misread. Typed graphs are read with graph.typed_io / graph.typed_spark."""
    from sparkgnn.graph.typed import is_typed_meta

    meta = layout.read_meta(str(path)) if layout.is_local(str(path)) else None
    if meta is not None and is_typed_meta(meta):
        raise GraphValidationError(
            f"graph directory {path} holds a typed graph (node types {', '.join(meta.get('node_types', []))}); "
            "PE stores, refresh and serving read homogeneous graphs only for now (batch inference runs it: "
            "sparkgnn.infer with a typed model)"
        )


def trusted_meta(path, meta: dict | None) -> tuple[dict | None, str | None]:
    """(graph.json's content to rely on, why the rest was dropped or None). Facts about the data
    (fingerprint, validated, sizes) are kept only when graph.json's data_stamp matches the files."""
    if not meta:
        return meta, None
    recorded = meta.get(STAMP_KEY)
    if recorded and recorded == data_stamp(path):
        return meta, None
    why = (
        "graph.json records no data_stamp (written by another tool or an older sparkgnn)"
        if not recorded
        else "the data files changed after graph.json was written"
    )
    return {k: meta[k] for k in _KEPT_WHEN_STALE if k in meta}, why


def read_trusted_meta(path) -> tuple[dict | None, str | None]:
    """graph.json of a local directory, filtered by `trusted_meta`; a typed graph is refused
    (refuse_typed: the callers are the homogeneous jobs)."""
    refuse_typed(path)
    return trusted_meta(path, layout.read_meta(str(path)) if layout.is_local(str(path)) else None)
