"""Placing the rows routed to one task at their local positions (engine.steps' Collect).

Why a module of its own: the task side of a step (engine.steps) collects, calls the DL engine and
scatters; where each arriving row goes, the checks that every id arrives exactly once, and which
rows stay where they arrived (memory-mapped exchange files, engine.routed_files) are one job with
its own invariants and tests (tests/engine/test_steps_collect.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkgnn import npsets
from sparkgnn.arrowvec import aligned_empty, to_numpy_matrix
from sparkgnn.engine import static
from sparkgnn.engine.routing import ROW_SCHEMA


def vector_column(batch) -> str:
    """The vector column of routed rows (v) or of a feature table (x)."""
    return "v" if "v" in batch.schema.names else "x"


@dataclass(frozen=True)
class Placement:
    """Where rows of one kind go: the vector of id sorted_ids[i] becomes row i. `count_error` is
    formatted with expected/received when the count is wrong."""

    sorted_ids: np.ndarray
    what: str
    count_error: str


class Received:
    """Everything Spark routed to one task, taken in batch by batch as the task reads it.

    Why streaming: holding the whole input as one Arrow table before unpacking it kept a second
    copy of every payload row alive for the whole step (1.6 GB per task at 32M edges, P=2), and a
    task's peak memory is what decides how many partitions the planner needs (more partitions
    ship more bytes). Kinds with a known id list (own rows, mirror and destination payloads) go
    straight to their local position in one aligned buffer (the DL side uses it without a copy)
    and the batch is dropped; kinds whose count is only known at the end (partial states,
    per-edge rows) are kept as Arrow batches. Every placed id must be known and arrive exactly once."""

    def __init__(
        self, part: int, placements: dict[int, Placement], kept: tuple[int, ...], mapped: tuple[int, ...] = ()
    ):
        self.part = part
        self._placements = placements
        self._kept: dict[int, list[pa.RecordBatch]] = {kind: [] for kind in kept}
        self._vectors: dict[int, np.ndarray] = {}
        # mapped kinds: rows stay where they arrived (views of the exchange's memory-mapped files)
        # as (positions, vectors) blocks instead of being copied into one buffer (mapped_blocks)
        self._blocks: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {k: [] for k in mapped if k in placements}
        self._seen = {kind: np.zeros(len(p.sorted_ids), dtype=bool) for kind, p in placements.items()}
        self._index = {kind: static.IdIndex(p.sorted_ids) for kind, p in placements.items()}
        self._received = dict.fromkeys(placements, 0)
        self._schema: pa.Schema | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        self._schema = self._schema or batch.schema
        kinds = batch.column("kind").to_numpy()
        if (kinds == kinds[0]).all():  # the usual case (np.unique cost ~20 ms per 20K-row batch)
            self._take(int(kinds[0]), batch, None)
            return
        for kind in npsets.unique(kinds).tolist():
            self._take(kind, batch, kinds == kind)

    def _take(self, kind: int, batch: pa.RecordBatch, mask: np.ndarray | None) -> None:
        """Place or keep the rows of `kind` (all rows of the batch when mask is None)."""
        if kind in self._placements:
            self._place(kind, batch, mask)
        elif kind in self._kept:
            self._kept[kind].append(batch if mask is None else batch.filter(pa.array(mask)))

    def _place(self, kind: int, batch: pa.RecordBatch, mask: np.ndarray | None) -> None:
        column = batch.column(vector_column(batch))
        # Rows of other kinds in the same batch may be of another width: unpack only this kind's.
        values = to_numpy_matrix(column if mask is None else column.filter(pa.array(mask)))
        ids = batch.column("id").to_numpy()
        self.place(kind, ids if mask is None else ids[mask], values)

    def place(self, kind: int, ids: np.ndarray, values: np.ndarray) -> None:
        """Rows of a placed kind: copied to their local positions, or kept as a block (mapped kinds)."""
        placement = self._placements[kind]
        if kind in self._blocks:
            self._check_width(kind, values)
            pos = self._index[kind].positions(ids, placement.what)
            self._blocks[kind].append((pos, values))
            self._received[kind] += len(values)
            self._seen[kind][pos] = True
            return
        out = self._vectors.get(kind)
        if out is None:
            out = self._vectors[kind] = aligned_empty((len(placement.sorted_ids), values.shape[1]), np.float32)
        elif values.shape[1] != out.shape[1]:
            raise ValueError(f"{placement.what} vectors differ in width ({out.shape[1]} and {values.shape[1]})")
        self._received[kind] += len(values)
        pos = self._index[kind].positions(ids, placement.what)
        out[pos] = values
        self._seen[kind][pos] = True

    def _check_width(self, kind: int, values: np.ndarray) -> None:
        blocks = self._blocks[kind]
        if blocks and values.shape[1] != blocks[0][1].shape[1]:
            what = self._placements[kind].what
            raise ValueError(f"{what} vectors differ in width ({blocks[0][1].shape[1]} and {values.shape[1]})")

    def _check_complete(self, kind: int) -> int:
        """Each id of `kind` arrived exactly once; returns how many there are."""
        placement = self._placements[kind]
        expected, received = len(placement.sorted_ids), self._received[kind]
        if received != expected:
            raise ValueError(placement.count_error.format(expected=expected, received=received))
        if expected and not self._seen[kind].all():  # as many rows as ids: one came twice, another never
            raise ValueError(f"received duplicate {placement.what} rows for some vertices")
        return expected

    def mapped(self, kind: int) -> bool:
        return kind in self._blocks

    def vectors(self, kind: int) -> np.ndarray:
        """The placed vectors of `kind` in local order, after checking that each id came once. A
        mapped kind that arrived as one block already in local order is returned as that view;
        otherwise its blocks are assembled into one buffer."""
        if not self._check_complete(kind):
            return np.zeros((0, 0), np.float32)
        if kind in self._blocks:
            blocks = self._blocks[kind]
            if len(blocks) == 1 and _identity(blocks[0][0]):
                return blocks[0][1]
            out = aligned_empty((len(self._placements[kind].sorted_ids), blocks[0][1].shape[1]), np.float32)
            for pos, values in blocks:
                out[pos] = values
            return out
        return self._vectors[kind]

    def mapped_blocks(self, kind: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """A mapped kind's (local positions, vectors) blocks in arrival order, after the same checks."""
        self._check_complete(kind)
        return [block for block in self._blocks[kind] if len(block[0])]

    def rows(self, kind: int) -> pa.Table:
        """The kept rows of `kind` (possibly none)."""
        batches = self._kept[kind]
        if batches:
            return pa.Table.from_batches(batches)
        return (self._schema or ROW_SCHEMA).empty_table()  # no batch seen: files placed whole


def _identity(positions: np.ndarray) -> bool:
    return bool(len(positions) == 0 or (positions[0] == 0 and (np.diff(positions) == 1).all()))
