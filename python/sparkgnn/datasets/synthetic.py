"""Synthetic graphs with the shape that stresses GNN inference: power-law in-degrees, learnable
labels, isolated vertices, any size, reproducible from a seed.

Why each ingredient:
- Zipf-like in-degrees (dst drawn with P(rank r) ~ (r+1)^-alpha over a seeded ranking of the
  vertices): real graphs have hubs, and hubs are what break naive partitioning, batching and
  memory plans. alpha = 0.8 gives a max in-degree of ~38K at 200K vertices / 2M edges (the
  benchmark shape in docs/PLATFORM.md); sources are uniform, so out-degrees stay near the mean.
- Class-informative features: x = centroid[y] + N(0, 1) noise, centroids ~ N(0, class_sep^2/F),
  so centroids sit ~class_sep*sqrt(2) apart whatever F is: a plain MLP gets part of the way, and
- homophily: with probability `homophily` an edge's source is drawn from the destination's own
  class, so aggregating neighbours really helps (a GNN beats an MLP on these labels).
- Isolated vertices (`isolated_frac`): they take part in no edge, a case every engine must
  handle (empty aggregations). No self loops are generated (GCN-style layers add their own).
  Multi-edges can occur, as in real crawls.
- Determinism: every chunk draws from its own generator seeded by (seed, stream, chunk index),
  with fixed chunk sizes, so `synthetic_graph` (in memory) and `write_synthetic` (streamed to
  Parquet, any rows_per_file) produce exactly the same graph for the same arguments.

Memory: per-vertex arrays (labels, Zipf ranking and CDF, class buckets) are O(N); edges and
features are generated and written one chunk at a time, vectorised, never as Python lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkgnn.graph import GraphData
from sparkgnn.graph.checks import NO_SPLIT
from sparkgnn.graph.writer import GraphDirWriter

NODE_CHUNK = 1 << 16
EDGE_CHUNK = 1 << 20
# generator streams: (seed, stream, chunk) keeps every random draw independent of chunking.
_LABELS, _ISOLATED, _RANKING, _CENTROIDS, _EDGES, _NODES = range(6)


@dataclass(frozen=True)
class SyntheticSpec:
    num_nodes: int
    num_edges: int
    dim: int
    num_classes: int = 8
    seed: int = 0
    zipf_alpha: float = 0.8
    homophily: float = 0.7
    class_sep: float = 1.5
    isolated_frac: float = 0.01
    weighted: bool = False
    id_offset: int = 0
    train_frac: float = 0.6
    val_frac: float = 0.2
    test_frac: float = 0.2
    name: str = "synthetic"

    def __post_init__(self):
        if self.num_nodes < 2 or self.num_edges < 0 or self.dim < 1 or self.num_classes < 1:
            raise ValueError(f"need num_nodes >= 2, num_edges >= 0, dim >= 1, num_classes >= 1; got {self}")
        if not 0 <= self.isolated_frac < 1 or not 0 <= self.homophily <= 1:
            raise ValueError("isolated_frac must be in [0, 1) and homophily in [0, 1]")
        if self.train_frac + self.val_frac + self.test_frac > 1 + 1e-9:
            raise ValueError("train_frac + val_frac + test_frac must not exceed 1")


def _rng(spec: SyntheticSpec, stream: int, chunk: int = 0) -> np.random.Generator:
    return np.random.default_rng([spec.seed, stream, chunk])


class _Plan:
    """The O(N) state every chunk needs: labels, who is isolated, the Zipf ranking, class buckets."""

    def __init__(self, spec: SyntheticSpec):
        self.spec = spec
        n = spec.num_nodes
        index_type = np.int32 if n < 2**31 else np.int64
        self.y = _rng(spec, _LABELS).integers(spec.num_classes, size=n)
        isolated = _rng(spec, _ISOLATED).random(n) < spec.isolated_frac
        active = np.flatnonzero(~isolated).astype(index_type)
        if len(active) < 2:  # keep the generator well defined on tiny graphs
            active = np.arange(n, dtype=index_type)
        self.active = active
        self.ranked = _rng(spec, _RANKING).permutation(active)
        weights = np.arange(1, len(active) + 1, dtype=np.float64) ** -spec.zipf_alpha
        self.cdf = np.cumsum(weights)
        active_classes = self.y[active]
        order = np.argsort(active_classes, kind="stable")
        self.by_class = active[order]
        self.class_start = np.searchsorted(active_classes[order], np.arange(spec.num_classes))
        self.class_count = np.bincount(active_classes, minlength=spec.num_classes)
        scale = spec.class_sep / np.sqrt(spec.dim)
        self.centroids = (_rng(spec, _CENTROIDS).standard_normal((spec.num_classes, spec.dim)) * scale).astype(
            np.float32
        )

    def edges(self, chunk: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Dense (src, dst, weight) of edge chunk `chunk`."""
        rng = _rng(self.spec, _EDGES, chunk)
        m = len(self.active)
        dst = self.ranked[np.minimum(np.searchsorted(self.cdf, rng.random(count) * self.cdf[-1]), m - 1)]
        # uniform source among active vertices, shifted by one position to avoid self loops
        pos = rng.integers(m, size=count)
        pos = np.where(self.active[pos] == dst, (pos + 1) % m, pos)
        uniform_src = self.active[pos]
        # same-class source, same trick inside the class bucket (when it has 2+ members)
        cls = self.y[dst]
        size = self.class_count[cls]
        j = np.minimum((rng.random(count) * size).astype(np.int64), size - 1)
        same = self.by_class[self.class_start[cls] + j]
        j = np.where((same == dst) & (size > 1), (j + 1) % np.maximum(size, 1), j)
        same = self.by_class[self.class_start[cls] + j]
        same = np.where(same == dst, uniform_src, same)  # a class of one: fall back to uniform
        src = np.where(rng.random(count) < self.spec.homophily, same, uniform_src)
        weight = rng.uniform(0.5, 1.5, size=count).astype(np.float32) if self.spec.weighted else None
        return src.astype(np.int64), dst.astype(np.int64), weight

    def nodes(self, chunk: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(ids, x, y, split) of vertex chunk `chunk` (rows start..start+count)."""
        rng = _rng(self.spec, _NODES, chunk)
        y = self.y[start : start + count]
        x = self.centroids[y] + rng.standard_normal((count, self.spec.dim), dtype=np.float32)
        u = rng.random(count)
        cuts = np.cumsum([self.spec.train_frac, self.spec.val_frac, self.spec.test_frac])
        split = np.array(["train", "val", "test", NO_SPLIT], dtype="<U5")[np.searchsorted(cuts, u, side="right")]
        ids = np.arange(start, start + count, dtype=np.int64) + self.spec.id_offset
        return ids, x, y.astype(np.int64), split


def _chunks(total: int, size: int):
    for chunk, start in enumerate(range(0, total, size)):
        yield chunk, start, min(size, total - start)


def _spec(num_nodes, num_edges, dim, **options) -> SyntheticSpec:
    return SyntheticSpec(int(num_nodes), int(num_edges), int(dim), **options)


def synthetic_graph(
    num_nodes: int, num_edges: int, dim: int, num_classes: int = 8, seed: int = 0, **options
) -> GraphData:
    """The synthetic graph in memory (see module doc; options are SyntheticSpec fields)."""
    spec = _spec(num_nodes, num_edges, dim, num_classes=num_classes, seed=seed, **options)
    plan = _Plan(spec)
    node_parts = [plan.nodes(c, s, n) for c, s, n in _chunks(spec.num_nodes, NODE_CHUNK)]
    edge_parts = [plan.edges(c, n) for c, _, n in _chunks(spec.num_edges, EDGE_CHUNK)]
    ids, x, y, split = (np.concatenate(parts) for parts in zip(*node_parts, strict=True))
    src = np.concatenate([p[0] for p in edge_parts]) if edge_parts else np.empty(0, np.int64)
    dst = np.concatenate([p[1] for p in edge_parts]) if edge_parts else np.empty(0, np.int64)
    weight = None
    if spec.weighted:
        weight = np.concatenate([p[2] for p in edge_parts]) if edge_parts else np.empty(0, np.float32)
    return GraphData(ids, x, src, dst, weight=weight, y=y, split=split, name=spec.name)


def write_synthetic(
    out_dir: str,
    num_nodes: int,
    num_edges: int,
    dim: int,
    num_classes: int = 8,
    seed: int = 0,
    rows_per_file: int | None = None,
    overwrite: bool = False,
    **options,
) -> dict:
    """Stream the synthetic graph straight to a graph directory, chunk by chunk; returns graph.json.

    Only O(num_nodes) arrays and one chunk (~1M edges or 64K vertices) live in memory at a time.
    """
    spec = _spec(num_nodes, num_edges, dim, num_classes=num_classes, seed=seed, **options)
    plan = _Plan(spec)
    with GraphDirWriter(
        out_dir,
        spec.dim,
        has_weight=spec.weighted,
        has_labels=True,
        has_split=True,
        name=spec.name,
        rows_per_file=rows_per_file,
        overwrite=overwrite,
    ) as writer:
        for chunk, start, count in _chunks(spec.num_nodes, NODE_CHUNK):
            writer.write_vertices(*plan.nodes(chunk, start, count))
        for chunk, _, count in _chunks(spec.num_edges, EDGE_CHUNK):
            src, dst, weight = plan.edges(chunk, count)
            writer.write_edges(src + spec.id_offset, dst + spec.id_offset, weight)
        return writer.close(
            num_classes=spec.num_classes,
            validated=True,
            extra={
                "generator": {
                    "kind": "synthetic",
                    "seed": spec.seed,
                    "zipf_alpha": spec.zipf_alpha,
                    "homophily": spec.homophily,
                    "class_sep": spec.class_sep,
                    "isolated_frac": spec.isolated_frac,
                }
            },
        )
