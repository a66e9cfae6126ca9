"""Published versions of a followed PE store: the graph each committed store version reflects --
as a full graph directory, or as a checked delta over the previous publication -- and a pointer to
the latest one.

    <store root>/.published/latest.json           the latest version: {"graph": <graph dir or delta
                                                  dir>, "graph_fingerprint", "store": <version dir>,
                                                  "sequence": n, "published_at": unix seconds,
                                                  "full": <the full graph dir its chain starts from>,
                                                  "chain": [{"dir", "graph_fingerprint", "bytes"}]}
    <store root>/.published/graphs/<graph fp>/   a graph directory (graph/writer.py) of a version
    <store root>/.published/deltas/<seq>-<fp>/   a delta: delta.json and the update files (graph.updates
                                                  Parquet) that turn its base graph into its graph

A delta's `delta.json` names its base and result graph fingerprints, the fingerprint's running
sums before and after (follow_state.RunningFingerprint), each update file's size and SHA-256, the
full graph directory its chain starts from and the chain itself (every delta from that directory
up to this one). `open_graph` reads either kind: a delta is applied to a held graph that is in its
chain (the service's previous version), each file checked and the result's fingerprint compared
to the recorded one; a held graph outside the chain (a gap) or a delta that does not check out
falls back, logged, to the full directory and the chain replayed from it. The publisher writes a
full directory instead of a delta every `compact_every` deltas or `compact_bytes` of update files
(compaction), so a cold reader never replays an unbounded chain. The follower does that off its
publishing path: from `compaction_due` (half those bounds) on it writes a version's full
directory on a background thread (`write_full`), and hands it to a later `publish` (`full=`),
which REBASES the chain on it -- the delta published over the latest graph as before, its chain
starting from that directory (the links after its graph) -- so publishing stays a delta and the
synchronous compaction at the bound is only a fallback.

`sparkgnn-refresh follow` (pe/follow.py) publishes after each store version it commits; a service
with `follow_store` (serving/online/store_follow.py) reads `latest.json` and swaps to it.

WHY deltas rather than a graph directory per commit: writing the whole graph costs the follower a
pass over every edge per commit, and re-reading it costs every reader the same per swap, while a
reader that serves the previous version already holds all but the change in memory. A delta costs
the follower a copy of the update files it applied; a reader holding its base applies them
(graph.updates.apply: the follower's own semantics, so the result is the follower's graph, which
the fingerprint check proves). Graphs with edge attributes are published whole (their fingerprint
is not kept as running sums).

WHY under the store root: a service following a store needs nothing but the store's root to find
what to serve next. Entries starting with "." are not store versions (PEStore ignores them).

Crash safety: a graph directory is written into a hidden folder and renamed to its fingerprint's
name when complete (a reader never sees a partial one), and the pointer is replaced atomically
after it, so `latest.json` only ever names a complete graph whose store version is committed.
The newest KEEP_GRAPHS directories are kept (a service still swapping to an older one finds it);
older ones are removed, with the deltas whose chain starts from one of them. Only entries this
module writes under `.published/` are ever removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass

from sparkgnn import files
from sparkgnn.errors import SparkGNNError

log = logging.getLogger(__name__)

PUBLISHED_DIR = ".published"
LATEST_FILE = "latest.json"
GRAPHS_DIR = "graphs"
DELTAS_DIR = "deltas"
DELTA_FILE = "delta.json"
DELTA_FORMAT = 1
KEEP_GRAPHS = 8
COMPACT_EVERY = 16  # deltas published after a full graph directory before the next full one
COMPACT_BYTES = 64 << 20  # update bytes in one chain before the next full graph directory
_TMP_PREFIX = ".tmp-"

# the last graph `open_graph` built from a delta over a held graph in this process: (delta folder,
# its graph fingerprint, the held graph's fingerprint) -> the graph. A service with an in-process
# pool opens each followed delta twice (the front end's version, then the worker's deployment):
# the second open returns the graph the first built and checked. One entry: the next delta replaces it.
_LAST_OPENED: dict[tuple[str, str, str], object] = {}
_LAST_OPENED_LOCK = threading.Lock()


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


@dataclass(frozen=True)
class Delta:
    """What turns the latest publication's graph into the one being published: the update files
    applied to it, in order (`updates`: paths), and the graph fingerprint's running sums
    (vertex sum, edge sum; follow_state.RunningFingerprint) of the base graph and of the result."""

    base_fingerprint: str
    base_sums: tuple[int, int]
    sums: tuple[int, int]
    updates: tuple[str, ...]


def publish(
    store_root: str,
    graph,
    store_base: str,
    *,
    keep: int = KEEP_GRAPHS,
    delta: Delta | None = None,
    compact_every: int = COMPACT_EVERY,
    compact_bytes: int = COMPACT_BYTES,
    full: str | None = None,
) -> dict:
    """Publish `graph` (a GraphData) as the latest version of `store_root`, whose committed store
    version for it is `store_base`: as a delta over the latest publication when `delta` is given
    and applies to it (its base is the latest graph, the chain is shorter than `compact_every`
    deltas and `compact_bytes`), else as a full graph directory (unless one is there already);
    then point `latest.json` at it, then remove all but the newest `keep` graph directories (and
    the deltas over them). `full`: a complete graph directory of this root (`write_full`) of a
    graph in the latest publication's chain: the delta's chain is rebased to start from it
    (module doc; ignored, logged, when that graph is not in the chain). Returns the publication;
    publishing the version already latest returns it unchanged."""
    if keep < 1 or compact_every < 0 or compact_bytes < 0:
        raise ValueError(
            f"keep must be >= 1 (the latest graph is always kept) and compact_every, compact_bytes >= 0; got "
            f"{keep}, {compact_every}, {compact_bytes}"
        )
    fp = str(graph.fingerprint)
    current = latest(store_root)
    if current is not None and current["graph_fingerprint"] == fp and os.path.isdir(current["graph"]):
        return current
    started = time.perf_counter()
    sequence = int((current or {}).get("sequence", 0)) + 1
    rebased = _rebase(store_root, current, full) if full is not None and delta is not None else None
    current = rebased or current
    why_full = _why_full(current, graph, delta, compact_every, compact_bytes)
    if why_full is None:
        assert current is not None and delta is not None  # _why_full says so
        record = _write_delta(store_root, graph, store_base, current, delta, sequence)
    else:
        folder = graph_dir(store_root, fp)
        if not os.path.isdir(folder):
            _write_graph(graph, folder)
        record = {"graph": folder, "graph_fingerprint": fp, "full": folder, "full_graph_fingerprint": fp, "chain": []}
    record.update(store=str(store_base), sequence=sequence, published_at=time.time())
    files.write_json_atomic(os.path.join(published_dir(store_root), LATEST_FILE), record)
    if why_full is not None or rebased is not None:
        _prune(os.path.dirname(record["full"]), keep, str(record["full_graph_fingerprint"]))
    kind = f"delta {len(record['chain'])} of its chain" if why_full is None else f"whole ({why_full})"
    kind += ", rebased on a full directory written beside" if why_full is None and rebased is not None else ""
    log.info(f"published graph {fp[:12]} of {store_root}: {kind} ({time.perf_counter() - started:.3f}s)")
    return record


def compaction_due(record: dict, *, compact_every: int = COMPACT_EVERY, compact_bytes: int = COMPACT_BYTES) -> bool:
    """Whether a full directory of the publication `record`'s graph should be written beside the
    publisher now (`write_full`): its chain holds half the deltas or bytes that force `publish`
    to write one itself."""
    chain = record.get("chain") or []
    size = sum(int(link["bytes"]) for link in chain)
    return bool(chain) and (len(chain) >= max(compact_every // 2, 1) or size > compact_bytes // 2)


def write_full(store_root: str, graph) -> str:
    """Write `graph`'s full graph directory under `store_root`'s publications (unless it is there
    already) without publishing it, and return it: what a later `publish(..., full=)` rebases a
    chain on. Safe beside `publish` of later versions (a hidden folder renamed into place)."""
    folder = graph_dir(store_root, str(graph.fingerprint))
    if not os.path.isdir(folder):
        _write_graph(graph, folder)
    return folder


def _rebase(store_root: str, current: dict | None, full: str) -> dict | None:
    """`current` (the latest publication) with its chain starting from the full directory `full`
    of one of its graphs (the links after that graph); None, logged, when it is not one of them."""
    fp = os.path.basename(os.path.normpath(full))
    if current is None or not current.get("full") or full != graph_dir(store_root, fp) or not os.path.isdir(full):
        log.info(f"publish: {full} is not a full graph directory of {store_root} to rebase on; not used")
        return None
    chain = list(current.get("chain") or [])
    at = [str(current.get("full_graph_fingerprint")), *(str(link["graph_fingerprint"]) for link in chain)]
    if fp not in at:
        log.info(f"publish: graph {fp[:12]} is not in the latest publication's chain; {full} not used")
        return None
    i = len(at) - 1 - at[::-1].index(fp)
    return {**current, "full": full, "full_graph_fingerprint": fp, "chain": chain[i:]}


def _why_full(current: dict | None, graph, delta: Delta | None, compact_every: int, compact_bytes: int) -> str | None:
    """Why `graph` is published as a full directory rather than `delta`, in a few words; None
    when the delta applies to the latest publication and its chain has room."""
    if delta is None:
        return "no delta given"
    if graph.edge_attr is not None:
        return "a graph with edge attributes"
    if current is None or not current.get("full"):
        return "no earlier publication to apply a delta to"
    if current["graph_fingerprint"] != delta.base_fingerprint:
        return f"the latest publication is graph {current['graph_fingerprint'][:12]}, not the delta's base"
    chain = current.get("chain") or []
    if len(chain) >= compact_every:
        return f"compaction after {len(chain)} deltas"
    size = sum(int(link["bytes"]) for link in chain) + sum(os.path.getsize(p) for p in delta.updates)
    if size > compact_bytes:
        return f"compaction: the chain's update files would hold {size} bytes"
    return None


def _write_delta(store_root: str, graph, store_base: str, current: dict, delta: Delta, sequence: int) -> dict:
    """Write `delta` (over the latest publication `current`) as a delta folder, renamed into place
    when complete; returns its publication record (without store, sequence and time)."""
    fp = str(graph.fingerprint)
    parent = os.path.join(published_dir(store_root), DELTAS_DIR)
    folder = os.path.join(parent, f"{sequence:08d}-{fp[:16]}")
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, _staging_name())
    os.makedirs(staging)
    try:
        updates, size = [], 0
        for i, path in enumerate(delta.updates):
            name = f"{i:06d}.parquet"
            with open(path, "rb") as fh:
                content = fh.read()
            with open(os.path.join(staging, name), "wb") as fh:
                fh.write(content)
            updates.append({"file": name, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()})
            size += len(content)
        chain = [*(current.get("chain") or []), {"dir": folder, "graph_fingerprint": fp, "bytes": size}]
        meta = {
            "format": DELTA_FORMAT,
            "base_graph_fingerprint": delta.base_fingerprint,
            "graph_fingerprint": fp,
            "base_sums": [int(v) for v in delta.base_sums],
            "sums": [int(v) for v in delta.sums],
            "updates": updates,
            "store": str(store_base),
            "full": current["full"],
            "full_graph_fingerprint": current["full_graph_fingerprint"],
            "chain": chain,
        }
        files.write_json_atomic(os.path.join(staging, DELTA_FILE), meta)
        os.rename(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "graph": folder,
        "graph_fingerprint": fp,
        "full": current["full"],
        "full_graph_fingerprint": current["full_graph_fingerprint"],
        "chain": chain,
    }


def is_delta(ref: str) -> bool:
    """Whether `ref` (what a publication's "graph" names) is a delta folder, not a graph directory."""
    return os.path.isfile(os.path.join(str(ref), DELTA_FILE))


def open_graph(ref: str, *, held=None):
    """The graph `ref` names: a graph directory read whole, or a delta folder (module doc)
    applied to `held` (a GraphData) when `held` is in its chain, else -- logged -- to its full
    graph directory with the chain replayed. PublishError when the chain does not check out
    from the full directory either (a file changed or missing, a fingerprint that differs), and
    for a delta naming a directory outside the `.published` folder it lies in (a swap asked over
    the wire may name a delta folder: it reads nothing beyond that folder). The last delta built
    over a held graph in this process is remembered: opening it again over a graph of the same
    fingerprint returns that graph (`_LAST_OPENED`; graphs are never written once built)."""
    from sparkgnn.graph.reader import read_graph_dir

    ref = str(ref)
    if not is_delta(ref):
        return read_graph_dir(ref)
    meta = _read_delta_meta(ref)
    chain = meta["chain"]
    real = os.path.realpath(ref)
    key = (real, str(meta["graph_fingerprint"]), "" if held is None else str(held.fingerprint))
    with _LAST_OPENED_LOCK:
        found = _LAST_OPENED.get(key) if held is not None else None
    if found is not None:  # this delta over this graph, built and checked by an earlier call
        return found
    home = os.path.dirname(os.path.dirname(real))  # the .published folder it lies in
    for path in (meta["full"], *(str(link.get("dir")) for link in chain)):
        if os.path.dirname(os.path.dirname(os.path.realpath(path))) != home:
            raise PublishError(f"delta {ref} names {path}, outside the publications {home} it lies in")
    if held is not None:
        at = [meta["full_graph_fingerprint"], *(link["graph_fingerprint"] for link in chain)]
        if held.fingerprint in at:
            try:
                graph = _replay(held, chain[at.index(held.fingerprint) :])
            except PublishError as exc:
                log.warning(f"delta {ref}: {exc}; reading the full publication {meta['full']} instead")
            else:
                with _LAST_OPENED_LOCK:
                    _LAST_OPENED.clear()
                    _LAST_OPENED[key] = graph
                return graph
        else:
            log.warning(
                f"delta {ref}: the held graph {str(held.fingerprint)[:12]} is not in its chain (a gap); reading the "
                f"full publication {meta['full']} and {len(chain)} deltas instead"
            )
    graph = read_graph_dir(meta["full"])
    if graph.fingerprint != meta["full_graph_fingerprint"]:
        raise PublishError(
            f"delta {ref}: its full graph {meta['full']} has fingerprint {str(graph.fingerprint)[:12]}, not "
            f"{meta['full_graph_fingerprint'][:12]}"
        )
    return _replay(graph, chain)


def _read_delta_meta(folder: str) -> dict:
    path = os.path.join(folder, DELTA_FILE)
    try:
        meta = files.read_json(path)
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path} cannot be read: {exc}") from None
    keys = ("base_graph_fingerprint", "graph_fingerprint", "full", "full_graph_fingerprint")
    if (
        not isinstance(meta, dict)
        or meta.get("format") != DELTA_FORMAT
        or not all(isinstance(meta.get(k), str) for k in keys)
        or not all(isinstance(meta.get(k), list) for k in ("base_sums", "sums", "updates", "chain"))
    ):
        raise PublishError(f"{path} is not a delta of format {DELTA_FORMAT}")
    return meta


def _replay(graph, chain: list[dict]):
    """`graph` with every delta of `chain` applied in order, each checked (`_apply_delta`)."""
    for link in chain:
        graph = _apply_delta(graph, str(link["dir"]))
    return graph


def _apply_delta(graph, folder: str):
    """The delta in `folder` applied to `graph`, its base: each update file checked against its
    recorded size and SHA-256, applied (graph.updates.apply), and the result's fingerprint,
    advanced from the recorded base sums by the rows each file removes and adds, compared to the
    recorded one. PublishError when anything differs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparkgnn.graph.fingerprint import FingerprintAccumulator
    from sparkgnn.graph.updates import GraphUpdate, apply
    from sparkgnn.pe.follow_state import RunningFingerprint

    meta = _read_delta_meta(folder)
    if meta["base_graph_fingerprint"] != graph.fingerprint:
        raise PublishError(
            f"delta {folder} is over graph {meta['base_graph_fingerprint'][:12]}, not {str(graph.fingerprint)[:12]}"
        )
    vertex_sum, edge_sum = (int(v) for v in meta["base_sums"])
    acc = FingerprintAccumulator(graph.feature_dim, graph.weight is not None)
    acc.add_partial(graph.num_nodes, vertex_sum, graph.num_edges, edge_sum)
    if graph.edge_attr is not None or acc.hexdigest() != graph.fingerprint:
        raise PublishError(f"delta {folder}: its base sums are not those of graph {str(graph.fingerprint)[:12]}")
    running = RunningFingerprint(graph, vertex_sum, edge_sum)
    for entry in meta["updates"]:
        path = os.path.join(folder, str(entry["file"]))
        try:
            with open(path, "rb") as fh:
                content = fh.read()
        except OSError as exc:
            raise PublishError(f"delta {folder}: {exc}") from None
        if len(content) != entry["bytes"] or hashlib.sha256(content).hexdigest() != entry["sha256"]:
            raise PublishError(f"delta {folder}: {entry['file']} is not the file published (size or SHA-256)")
        try:
            # one small file: read directly, without the dataset layer's thread pool (read_table)
            table = pq.ParquetFile(pa.BufferReader(content)).read(use_threads=False)
            update = GraphUpdate.from_table(table, source=path)
            running = running.advance(apply(update, running.graph))
        except (SparkGNNError, pa.ArrowException) as exc:
            raise PublishError(f"delta {folder}: {entry['file']} does not apply: {exc}") from None
    if running.graph.fingerprint != meta["graph_fingerprint"]:
        raise PublishError(
            f"delta {folder} gives graph {str(running.graph.fingerprint)[:12]}, not the recorded "
            f"{meta['graph_fingerprint'][:12]}"
        )
    return running.graph


def _write_graph(graph, folder: str) -> None:
    """Write `graph` as a graph directory into a hidden folder beside `folder`, then rename it
    into place. The follower's graph came from validated updates: it is not validated again."""
    from sparkgnn.graph.writer import GraphDirWriter

    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, _staging_name())
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


def _staging_name() -> str:
    """A hidden folder's name for a write in progress, with the writing process's id: _prune
    removes only those of processes no longer running (a live one may be writing it, e.g. the
    follower's background full directory while its loop publishes)."""
    return f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"


def _left_by_a_dead_writer(name: str) -> bool:
    """Whether the hidden staging folder `name` was left by a process that is gone (a killed
    publisher); a name without a process id (an older release's) counts as left."""
    pid_text = name[len(_TMP_PREFIX) :].split("-", 1)[0]
    if not name.startswith(_TMP_PREFIX) or "-" not in name[len(_TMP_PREFIX) :] or not pid_text.isdigit():
        return name.startswith(_TMP_PREFIX)
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _prune(graphs: str, keep: int, latest_fp: str) -> None:
    """Remove all but the newest `keep` published graph directories (the latest always stays),
    the deltas whose chain starts from a removed one, and hidden folders a killed publisher left
    (one follower publishes to a store at a time; a live process's staging is its own to finish)."""
    for entry in os.scandir(graphs):
        if _left_by_a_dead_writer(entry.name):
            shutil.rmtree(entry.path, ignore_errors=True)
    entries = [e for e in os.scandir(graphs) if e.is_dir() and not e.name.startswith(".")]
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    for entry in entries[keep:]:
        if entry.name != latest_fp:
            shutil.rmtree(entry.path, ignore_errors=True)
    deltas = os.path.join(os.path.dirname(graphs), DELTAS_DIR)
    if not os.path.isdir(deltas):
        return
    for entry in os.scandir(deltas):
        if entry.name.startswith(_TMP_PREFIX):
            if _left_by_a_dead_writer(entry.name):
                shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.is_dir() and is_delta(entry.path):
            try:
                full = _read_delta_meta(entry.path)["full"]
            except PublishError:
                continue  # not ours to judge: left as found
            if not os.path.isdir(full):
                shutil.rmtree(entry.path, ignore_errors=True)
