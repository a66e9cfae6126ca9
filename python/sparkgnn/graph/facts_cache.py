"""What a job learnt about a graph directory that graph.json does not vouch for, kept in the work
dir so the next job on the same files does not read them again to learn it.

WHY: a directory written by another tool (no graph.json, or one without a data stamp) is
validated and fingerprinted from its content by every job: two or three Spark passes over the
vertices and edges, most of a cold job's fixed cost on such a graph. The answers depend only on
the files, and the data stamp (dirfacts.data_stamp: each data file's relative path, size and
modification time, one listing) says whether they are still the same files. So once a job has
validated and fingerprinted a directory, it records the facts under
`<work_dir>/graphs/<key>.json`, keyed by the directory's absolute path and its stamp at the time
the job opened it; a later job whose stamp matches adopts them instead of recomputing. Changed
files change the stamp (a new key: validated and fingerprinted again, never served a stale
fingerprint); the trade is graph.json's own (see dirfacts). The user's directory is never
written to: it may be read-only or shared.

A record that cannot be read or does not hold sane values is ignored (the facts are recomputed);
a work dir that cannot be written costs the recomputation next time, nothing else.
"""

from __future__ import annotations

import hashlib
import logging

from sparkgnn import files
from sparkgnn.errors import GraphValidationError
from sparkgnn.graph.fingerprint import check_fingerprint

log = logging.getLogger(__name__)

FOLDER = "graphs"
VERSION = 1
#: The facts a record holds (all ints except the fingerprint); edge_attr_dim only for graphs with edge_attr.
COUNT_KEYS = ("num_vertices", "num_edges", "feature_dim", "num_classes")
OPTIONAL_KEYS = ("edge_attr_dim",)


def _record_path(work_dir: str, path: str, stamp: str) -> str:
    key = hashlib.blake2b(f"{path}\n{stamp}".encode(), digest_size=16).hexdigest()
    return files.join(work_dir, FOLDER, f"{key}.json")


def recall(work_dir: str, path: str, stamp: str | None) -> dict | None:
    """The facts recorded for `path` with data stamp `stamp` ({fingerprint, validated: True, the
    COUNT_KEYS, [edge_attr_dim]}), or None when there is no usable record (see the module)."""
    if not stamp:
        return None
    record = _record_path(work_dir, path, stamp)
    try:
        doc = files.read_json(record)
    except (OSError, ValueError):
        return None
    try:
        if doc.get("version") != VERSION or doc.get("path") != path or doc.get("data_stamp") != stamp:
            return None
        facts = doc["facts"]
        known = {"fingerprint": check_fingerprint(facts["fingerprint"]), "validated": True}
        for key in COUNT_KEYS + tuple(k for k in OPTIONAL_KEYS if k in facts):
            value = facts[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return None
            known[key] = value
    except (AttributeError, KeyError, TypeError, GraphValidationError):
        log.warning(f"sparkgnn: ignoring the unreadable graph facts in {record}: they are computed again")
        return None
    return known


def remember(work_dir: str, path: str, stamp: str | None, facts: dict) -> bool:
    """Record `facts` (a validated graph's fingerprint and COUNT_KEYS, [edge_attr_dim]) for `path`
    as it was when stamped `stamp`; returns whether the record was written."""
    if not stamp:
        return False
    kept = {key: facts[key] for key in ("fingerprint", *COUNT_KEYS, *OPTIONAL_KEYS) if key in facts}
    doc = {"version": VERSION, "path": path, "data_stamp": stamp, "facts": kept}
    try:
        files.write_json_atomic(_record_path(work_dir, path, stamp), doc)
    except OSError as exc:
        log.info(
            f"sparkgnn: could not record the graph's facts in {work_dir} ({exc}): the next job computes them again"
        )
        return False
    return True
