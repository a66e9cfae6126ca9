"""A graph directory's validity and fingerprint, learnt by the tasks that already read its files.

WHY: a directory nothing vouches for (no graph.json data stamp, no earlier job's record in the work
dir, graph.facts_cache) must be validated and fingerprinted from its content. Done on their own,
that is two Spark passes over the vertices and edges (spark_checks' aggregates and joins, the
fingerprint's partial sums) before prepare reads the same files a third time. Prepare's tasks
(engine.prepare_tasks) read every edge and every vertex id anyway, so they count the defects and
sum the fingerprint's row hashes of what they read: a reader task reports a `ScanPartial` for its
edge files and vertex files, a partition task the checks that need a partition's whole id set
(duplicate ids, dangling endpoints), and the driver adds the partials up (`ScanTotals`).

The fingerprint is fingerprint.py's multiset hash, whose row sums add across any split of the rows:
the value is the one Graph.fingerprint computes, so caches and stores keyed by it stay valid.

The tasks only COUNT defects, with the rules of spark_checks (the SQL validation of the normalised
frames): a graph with any defect is handed to `Graph.validate`, whose one line (counts and first
offenders) is the refusal, exactly as when validation ran on its own. A valid graph, the common
case, costs no Spark job for either.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgnn.graph import checks
from sparkgnn.graph.fingerprint import FingerprintAccumulator, edge_hash_sum, vertex_hash_sum

_MASK = (1 << 64) - 1
_SPLITS = pa.array(["train", "val", "test"])


class ScanFoundDefects(Exception):
    """The tasks' counts show a defect: the caller removes what was written and lets
    Graph.validate word the refusal (its counts and first offenders)."""


def _signed(value: int) -> int:
    """A uint64 sum as the signed 64-bit value a Spark `long` column carries."""
    return value - (1 << 64) if value >= (1 << 63) else value


@dataclass
class ScanPartial:
    """What one task learnt from the rows it read: defect counts by spark_checks' rules, sizes and
    the fingerprint's row-hash sums (signed 64-bit, as Spark carries them). -1 in `min_width`,
    `max_width` and `max_label`: no such value seen."""

    vertices: int = 0
    null_id: int = 0
    null_x: int = 0
    min_width: int = -1
    max_width: int = -1
    x_nonfinite: int = 0
    bad_label: int = 0
    bad_split: int = 0
    max_label: int = -1
    vertex_sum: int = 0
    edges: int = 0
    null_endpoint: int = 0
    bad_weight: int = 0
    edge_sum: int = 0
    duplicate_ids: int = 0
    dangling_src: int = 0
    dangling_dst: int = 0

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def ddl(cls) -> str:
        """The partial's columns as Spark DDL, to append to a task's report schema."""
        return ", ".join(f"scan_{name} long" for name in cls.names())

    def arrays(self) -> dict[str, pa.Array]:
        """One report row's scan columns (ddl's names)."""
        return {f"scan_{name}": pa.array([int(getattr(self, name))], pa.int64()) for name in self.names()}

    @classmethod
    def from_row(cls, row) -> ScanPartial:
        """The partial a task's report row (a Spark Row or a mapping) carries."""
        return cls(**{name: int(row[f"scan_{name}"]) for name in cls.names()})

    def add_vertices(self, batch: pa.RecordBatch) -> None:
        """Count the defects of a batch of vertex rows (id, x, [y], [split]) and add its rows'
        hashes; a batch with null ids or bad vectors is counted, not hashed (it will be refused)."""
        self.vertices += batch.num_rows
        id_column = batch.column("id")
        self.null_id += id_column.null_count
        x_column = batch.column("x")
        nulls = x_column.null_count
        self.null_x += nulls
        lengths = pc.list_value_length(x_column).drop_null().to_numpy(zero_copy_only=False)
        if len(lengths):
            low, high = int(lengths.min()), int(lengths.max())
            self.min_width = low if self.min_width < 0 else min(self.min_width, low)
            self.max_width = max(self.max_width, high)
        names = batch.schema.names
        if "y" in names:
            labels = batch.column("y").drop_null().to_numpy(zero_copy_only=False)
            if len(labels):
                self.bad_label += int((labels < -1).sum())
                self.max_label = max(self.max_label, int(labels.max()))
        if "split" in names:
            split = batch.column("split").cast(pa.string())
            self.bad_split += int(pc.sum(pc.invert(pc.is_in(split.drop_null(), value_set=_SPLITS))).as_py() or 0)
        if id_column.null_count or nulls or (len(lengths) and low != high):
            return
        ids = id_column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        with np.errstate(over="ignore"):  # a double beyond float32 becomes inf, as Spark's cast: counted below
            x, problems = checks.vector_column(ids, x_column, low if len(lengths) else 0)
        if problems:  # unreachable: nulls and widths were counted above
            return
        self.x_nonfinite += int((~np.isfinite(x).all(axis=1)).sum()) if x.size else 0
        self.vertex_sum = _signed((self.vertex_sum + vertex_hash_sum(ids, x)) & _MASK)

    def add_edges(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None) -> None:
        """Add a batch of edges without null endpoints (count those with `null_endpoints`): the
        weights' defects (as float32, the normalised type) and the rows' hashes."""
        self.edges += len(src)
        if weight is not None:
            self.bad_weight += int((~np.isfinite(weight) | (weight < 0)).sum())
        self.edge_sum = _signed((self.edge_sum + edge_hash_sum(src, dst, weight)) & _MASK)

    def null_endpoints(self, batch: pa.RecordBatch) -> int:
        """Count a batch's edges with a null src or dst (and its rows); returns the count: a batch
        holding any is not read further (the graph will be refused)."""
        src, dst = batch.column("src"), batch.column("dst")
        if not (src.null_count or dst.null_count):
            return 0
        bad = int(pc.sum(pc.or_(src.is_null(), dst.is_null())).as_py())
        self.null_endpoint += bad
        self.edges += batch.num_rows
        return bad


def missing(sorted_ids: np.ndarray, values: np.ndarray) -> int:
    """How many of `values` are not in `sorted_ids` (ascending)."""
    if not len(values):
        return 0
    if not len(sorted_ids):
        return len(values)
    pos = np.minimum(np.searchsorted(sorted_ids, values), len(sorted_ids) - 1)
    return int((sorted_ids[pos] != values).sum())


def repeated(sorted_ids: np.ndarray) -> int:
    """How many distinct values appear more than once in `sorted_ids` (ascending)."""
    if len(sorted_ids) < 2:
        return 0
    same = sorted_ids[1:] == sorted_ids[:-1]
    return int((same & ~np.concatenate(([False], same[:-1]))).sum())


class ScanTotals:
    """The partials of every task added up: whether the graph has a defect, and its facts and
    fingerprint when it has none."""

    def __init__(self, has_weight: bool):
        self.has_weight = bool(has_weight)
        self.total = ScanPartial()

    def add(self, partial: ScanPartial) -> None:
        t = self.total
        for name in ScanPartial.names():
            if name in ("min_width",):
                mine, theirs = t.min_width, partial.min_width
                t.min_width = theirs if mine < 0 else (mine if theirs < 0 else min(mine, theirs))
            elif name in ("max_width", "max_label"):
                setattr(t, name, max(getattr(t, name), getattr(partial, name)))
            elif name in ("vertex_sum", "edge_sum"):
                setattr(t, name, _signed((getattr(t, name) + getattr(partial, name)) & _MASK))
            else:
                setattr(t, name, getattr(t, name) + getattr(partial, name))

    @property
    def has_defect(self) -> bool:
        """Whether spark_checks would report a problem for what has been added so far."""
        t = self.total
        counts = (t.null_id, t.null_x, t.x_nonfinite, t.bad_label, t.bad_split, t.null_endpoint, t.bad_weight)
        return any(counts) or t.min_width != t.max_width or t.duplicate_ids > 0 or t.dangling_src + t.dangling_dst > 0

    @property
    def feature_dim(self) -> int:
        return max(self.total.min_width, 0)

    def facts(self) -> dict:
        """The counts Graph.stats serves (validation's facts), for a graph without defects."""
        t = self.total
        return {
            "num_vertices": t.vertices,
            "num_edges": t.edges,
            "feature_dim": self.feature_dim,
            "num_classes": t.max_label + 1 if t.max_label >= 0 else 0,
        }

    def fingerprint(self) -> str:
        """Graph.fingerprint's value, from the partial sums (a graph without edge attributes)."""
        t = self.total
        acc = FingerprintAccumulator(self.feature_dim, self.has_weight, 0)
        acc.add_partial(
            vertices=t.vertices, vertex_sum=t.vertex_sum & _MASK, edges=t.edges, edge_sum=t.edge_sum & _MASK
        )
        return acc.hexdigest()
