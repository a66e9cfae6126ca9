"""The refresh follower's update files (pe/follow.py): read once on arrival, applied in groups.

Two per-file costs dominate a stream of small update files, more than the refresh of the rows
they reach: parsing a file (GraphUpdate.from_table runs a dozen Arrow kernels whatever the file's
size) and applying it (graph.updates.apply validates and builds a graph per call; the follower
composes the steps of a batch, a pass over the graph per step). This module removes both:

- `read_arrival`: a waiting file is read ONCE, as bytes and its Arrow table; the follower logs
  those bytes (no second read to copy it) and the batch parses the tables it was given.
- `apply_files`: consecutive files are applied as ONE update where that is provably the same as
  applying them one after the other (`groups`), so a batch of many files costs one parse, one
  apply and no composition.

WHY the grouping rule is "a file joins the group before it only when it holds nothing but edge
inserts": an update is a set (its deletes before its inserts), so merging files is not in general
the same as applying them in order. For a file F of edge inserts only, applied after a group G,
it is: F's edges are validated against the graph after G, whose vertices are the original ones G
did not delete plus those G inserted -- exactly what one update G+F validates them against --
and they are appended after G's inserted edges in both cases; F adds no vertex, so nothing of G
is validated differently in G+F. A merged group that is refused (a file of it is bad) is applied
file by file instead, so each file is applied or dead-lettered exactly as on its own.

`merged_for_publication` uses the same rule across batches, so a published delta holds a few
merged update files instead of every small file the commit covers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sparkgnn.errors import SparkGNNError

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkgnn.graph.data import GraphData
    from sparkgnn.graph.updates import Applied, GraphUpdate

EDGE_INSERT_KIND = "edge_insert"


@dataclass
class Arrival:
    """An update file read while it waits for its batch: its modification time (the arrival),
    its bytes (None: it could not be read), its Arrow table (None: not a readable Parquet file;
    its batch then reads it from the log and dead-letters it with the reader's reason) and its
    update rows (1 for a file that cannot be read)."""

    mtime: float
    content: bytes | None
    table: pa.Table | None
    rows: int
    inode: int = -1  # the file's inode when read (log_arrival links it only while it is the same)
    inserts_only: bool = False  # every row an edge insert (only_edge_inserts): it may join a group


def read_table(content: bytes) -> pa.Table | None:
    """The Arrow table of an update file's bytes, None when they are not readable Parquet.
    WHY from bytes: the follower holds them anyway (it logs them), and a ParquetFile over a
    buffer skips the filesystem resolution a path costs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(pa.BufferReader(content)).read(use_threads=False)
    except (pa.ArrowException, OSError, ValueError):
        return None


def read_arrival(path: str, mtime: float) -> Arrival:
    """Read the update file `path` (arrived at `mtime`) once: bytes, table, rows."""
    try:
        with open(path, "rb") as fh:
            content = fh.read()
            inode = os.fstat(fh.fileno()).st_ino
    except OSError:
        return Arrival(mtime, None, None, 1)
    table = read_table(content)
    if table is None:
        return Arrival(mtime, content, None, 1, inode)
    return Arrival(mtime, content, table, max(int(table.num_rows), 1), inode, only_edge_inserts(table))


def log_arrival(arrival: Arrival, source: str, logged: str) -> None:
    """Put the bytes `arrival` read from `source` at `logged` (the follower's log): a hard link
    to the same file where `source` still is the file that was read, else the bytes written.
    WHY a link: creating and writing a small file costs about a millisecond on a journaling file
    system, a link a few tens of microseconds, and update files are never rewritten in place (a
    producer writes a new name, GraphUpdate.write renames a finished file into place)."""
    assert arrival.content is not None  # the follower copies a file it could not read
    try:
        os.link(source, logged)
        if os.stat(logged).st_ino == arrival.inode:
            return
        os.remove(logged)  # another file took the name since it was read
    except OSError:
        pass  # no links here (another file system, a file system without them): write the bytes
    with open(logged, "wb") as fh:
        fh.write(arrival.content)


def only_edge_inserts(table: pa.Table) -> bool:
    """Whether every row of an update table is an edge insert (a file that may join a group)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "kind" not in table.column_names:
        return False
    kind = table.column("kind")
    if not (pa.types.is_string(kind.type) or pa.types.is_large_string(kind.type)):
        return False
    return table.num_rows == 0 or bool(pc.all(pc.equal(kind, EDGE_INSERT_KIND), skip_nulls=False).as_py())


def groups(names: list[str], arrivals: dict[str, Arrival]) -> list[list[str]]:
    """`names` cut into runs applied as one update each (module doc): a file joins the run before
    it when it was read on arrival, holds only edge inserts and has the run's schema."""
    out: list[list[str]] = []
    first: pa.Table | None = None
    for name in names:
        arrival = arrivals.get(name)
        table = None if arrival is None else arrival.table
        joins = arrival is not None and arrival.inserts_only
        if out and first is not None and table is not None and joins and table.schema.equals(first.schema):
            out[-1].append(name)
            continue
        out.append([name])
        first = table
    return out


@dataclass
class Step:
    """Files applied as one update: their names in order, the update, and its Applied."""

    names: list[str]
    update: GraphUpdate
    applied: Applied


def apply_files(
    graph: GraphData,
    names: list[str],
    arrivals: dict[str, Arrival],
    path_of: Callable[[str], str],
) -> tuple[list[Step], list[tuple[str, str]]]:
    """Apply the update files `names` to `graph` in order, grouped (module doc); `arrivals`: the
    files as read on arrival, where they were (absent or unreadable: read from `path_of(name)`,
    the logged copy, which then gives the reader's own refusal). Returns the
    steps applied, in order, and (name, reason) for every file refused (unreadable, malformed,
    or not applicable to the graph as of its turn), each judged as on its own."""
    import pyarrow as pa

    from sparkgnn.graph.updates import GraphUpdate, apply

    steps: list[Step] = []
    refused: list[tuple[str, str]] = []
    tables = {name: arrival.table for name, arrival in arrivals.items()}
    for group in groups(names, arrivals):
        if len(group) > 1:
            try:
                update = GraphUpdate.from_table(
                    pa.concat_tables([tables[name] for name in group]),
                    source=f"graph update files {path_of(group[0])} .. {os.path.basename(group[-1])}",
                )
                step = apply(update, graph)
            except (SparkGNNError, pa.ArrowException):
                pass  # one of them is bad: each file on its own below, refused with its own reason
            else:
                steps.append(Step(group, update, step))
                graph = step.graph
                continue
        for name in group:
            path = path_of(name)
            table = tables.get(name)
            try:
                update = (
                    GraphUpdate.read(path)
                    if table is None
                    else GraphUpdate.from_table(table, source=f"graph update {path}")
                )
                step = apply(update, graph)
            except SparkGNNError as exc:
                refused.append((name, str(exc)))
                continue
            steps.append(Step([name], update, step))
            graph = step.graph
    return steps, refused


def _only_edge_inserts(update: GraphUpdate) -> bool:
    counts = update.counts()
    return all(n == 0 for kind, n in counts.items() if kind != EDGE_INSERT_KIND)


def merged_for_publication(updates: list[GraphUpdate]) -> list[GraphUpdate]:
    """`updates` (applied in this order) as fewer updates that apply to the same graph: each one
    of edge inserts only is merged into the one before it (module doc), when the edge inserts of
    both carry weights or neither's do, and none carries edge attributes."""
    from sparkgnn.graph.updates import GraphUpdate

    out: list[GraphUpdate] = []
    run: list[GraphUpdate] = []
    weighted: bool | None = None  # whether the run's edge inserts carry weights (None: it has none)

    def close() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            head = run[0]
            weights = None
            if weighted:
                no_weights = np.zeros(0, np.float32)
                weights = np.concatenate(
                    [no_weights if u.edge_insert_weight is None else u.edge_insert_weight for u in run]
                )
            out.append(
                GraphUpdate(
                    edge_insert_src=np.concatenate([u.edge_insert_src for u in run]),
                    edge_insert_dst=np.concatenate([u.edge_insert_dst for u in run]),
                    edge_insert_weight=weights,
                    edge_delete_src=head.edge_delete_src,
                    edge_delete_dst=head.edge_delete_dst,
                    edge_delete_weight=head.edge_delete_weight,
                    vertex_insert_ids=head.vertex_insert_ids,
                    vertex_insert_x=head.vertex_insert_x,
                    feature_update_ids=head.feature_update_ids,
                    feature_update_x=head.feature_update_x,
                    vertex_delete_ids=head.vertex_delete_ids,
                )
            )
        run.clear()

    for update in updates:
        has = len(update.edge_insert_src) > 0
        carries = update.edge_insert_weight is not None
        joins = (
            bool(run)
            and _only_edge_inserts(update)
            and update.edge_insert_attr is None
            and run[0].edge_insert_attr is None
            and (not has or weighted is None or weighted == carries)
        )
        if not joins:
            close()
            weighted = None
        run.append(update)
        if has:
            weighted = carries
    close()
    return out
