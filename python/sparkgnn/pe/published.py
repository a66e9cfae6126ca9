"""Published versions of a followed PE store: the graph each committed store version reflects, as a
graph directory the online service opens like any other, and a pointer to the latest one.

    <store root>/.published/latest.json           the latest version: {"graph": <graph dir>,
                                                  "graph_fingerprint", "store": <version dir>,
                                                  "sequence": n, "published_at": unix seconds}
    <store root>/.published/graphs/<graph fp>/   a graph directory (graph/writer.py) of that version

`sparkgnn-refresh follow` (pe/follow.py) publishes after each store version it commits; a service
with `follow_store` (serving/online/store_follow.py) reads `latest.json` and swaps to it.

WHY a whole graph directory per commit rather than an edge log over the base graph: every reader
of a version needs the whole graph in memory anyway (a worker's serving context, the front end's
graph facts), so a log would move the O(E) cost from the follower to each reader and grow with
every commit until compacted; the directory is written once, read by each reader as any graph is,
and needs no new reader. It costs the follower one pass over the graph per COMMIT, not per batch
(the follower commits every `commit_every_s`; docs/ARCHITECTURE.md gives the measured cost).

WHY under the store root: a service following a store needs nothing but the store's root to find
what to serve next. Entries starting with "." are not store versions (PEStore ignores them).

Crash safety: a graph directory is written into a hidden folder and renamed to its fingerprint's
name when complete (a reader never sees a partial one), and the pointer is replaced atomically
after it, so `latest.json` only ever names a complete graph whose store version is committed.
The newest KEEP_GRAPHS directories are kept (a service still swapping to an older one finds it);
older ones are removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid

from sparkgnn import files
from sparkgnn.errors import SparkGNNError

log = logging.getLogger(__name__)

PUBLISHED_DIR = ".published"
LATEST_FILE = "latest.json"
GRAPHS_DIR = "graphs"
KEEP_GRAPHS = 8
_TMP_PREFIX = ".tmp-"


class PublishError(SparkGNNError, ValueError):
    """A publication that cannot be written or read: a graph whose written fingerprint is not its
    own, a malformed `latest.json`."""


def published_dir(store_root: str) -> str:
    """The folder a store root's publications live in (a local store root: a path or a file: URI;
    PublishError for another filesystem)."""
    from sparkgnn.graph import layout

    root = str(store_root)
    if not layout.is_local(root):
        raise PublishError(f"PE store {root}: versions are published only for a store on the local filesystem")
    path = layout.strip_scheme(root)
    path = path[2:] if path.startswith("///") else path  # file:///abs -> /abs
    return os.path.join(os.path.abspath(path), PUBLISHED_DIR)


def graph_dir(store_root: str, graph_fp: str) -> str:
    """The published graph directory of the graph version `graph_fp`."""
    return os.path.join(published_dir(store_root), GRAPHS_DIR, graph_fp)


def latest(store_root: str) -> dict | None:
    """The latest publication of `store_root` (module doc), or None when nothing was published;
    PublishError when the pointer is not one."""
    path = os.path.join(published_dir(store_root), LATEST_FILE)
    try:
        record = files.read_json(path)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise PublishError(f"{path} is not JSON: {exc}") from None
    if not isinstance(record, dict) or not all(
        isinstance(record.get(k), str) for k in ("graph", "graph_fingerprint", "store")
    ):
        raise PublishError(f"{path} is not a publication (graph, graph_fingerprint and store strings)")
    return record


def publish(store_root: str, graph, store_base: str, *, keep: int = KEEP_GRAPHS) -> dict:
    """Publish `graph` (a GraphData) as the latest version of `store_root`, whose committed store
    version for it is `store_base`: write its graph directory (unless one is there already),
    then point `latest.json` at it, then remove all but the newest `keep` graph directories.
    Returns the publication; publishing the version already latest returns it unchanged."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the latest graph is always kept), got {keep}")
    fp = str(graph.fingerprint)
    current = latest(store_root)
    if current is not None and current["graph_fingerprint"] == fp and os.path.isdir(current["graph"]):
        return current
    started = time.perf_counter()
    folder = graph_dir(store_root, fp)
    if not os.path.isdir(folder):
        _write_graph(graph, folder)
    record = {
        "graph": folder,
        "graph_fingerprint": fp,
        "store": str(store_base),
        "sequence": int((current or {}).get("sequence", 0)) + 1,
        "published_at": time.time(),
    }
    files.write_json_atomic(os.path.join(published_dir(store_root), LATEST_FILE), record)
    _prune(os.path.dirname(folder), keep, fp)
    log.info(f"published graph {fp[:12]} of {store_root} ({time.perf_counter() - started:.3f}s)")
    return record


def _write_graph(graph, folder: str) -> None:
    """Write `graph` as a graph directory into a hidden folder beside `folder`, then rename it
    into place. The follower's graph came from validated updates: it is not validated again."""
    from sparkgnn.graph.writer import GraphDirWriter

    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with GraphDirWriter(
            staging,
            graph.feature_dim,
            has_weight=graph.has_weight,
            has_labels=graph.has_labels,
            has_split=graph.split is not None,
            edge_attr_dim=graph.edge_attr_dim,
            name=graph.name,
        ) as writer:
            writer.write_vertices(graph.ids, graph.x, graph.y, graph.split)
            writer.write_edges(graph.src_ids, graph.dst_ids, graph.weight, graph.edge_attr)
            meta = writer.close(num_classes=graph.num_classes, validated=True)
        if meta["fingerprint"] != graph.fingerprint:
            raise PublishError(
                f"graph written to {folder} has fingerprint {meta['fingerprint'][:12]}, not its own "
                f"{str(graph.fingerprint)[:12]}: not published"
            )
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _prune(graphs: str, keep: int, latest_fp: str) -> None:
    """Remove all but the newest `keep` published graph directories (the latest always stays),
    and hidden folders a killed publisher left (one follower publishes to a store at a time)."""
    for entry in os.scandir(graphs):
        if entry.name.startswith(_TMP_PREFIX):
            shutil.rmtree(entry.path, ignore_errors=True)
    entries = [e for e in os.scandir(graphs) if e.is_dir() and not e.name.startswith(".")]
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    for entry in entries[keep:]:
        if entry.name != latest_fp:
            shutil.rmtree(entry.path, ignore_errors=True)
