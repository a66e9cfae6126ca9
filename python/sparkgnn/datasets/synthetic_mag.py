"""A seeded synthetic typed graph shaped like OGB-MAG, at any size, in memory or streamed to Parquet.

Node types: `paper` (features, labels, split), `author`, `institution`, `field_of_study`
(features of their own width when asked, none by default, as in OGB-MAG). Edge types, with
OGB-MAG's proportions per paper by default: (author, writes, paper), (paper, cites, paper),
(author, affiliated_with, institution), (paper, has_topic, field_of_study); with `reverse=True`
also the `rev_` reverses of those between two types (PyG ToUndirected's names), after the
forward types.

Why each ingredient:
- Power-law degrees: the endpoint a relation concentrates on is drawn Zipf-like (P(rank r) ~
  (r+1)^-alpha over a seeded ranking of the type's vertices): cited papers, prolific authors
  (writes' source), large institutions, popular fields; the other endpoint is uniform. Hubs are
  what stress partitioning and memory plans.
- Class-informative paper features: x = centroid[y] + N(0, 1), as in synthetic.py.
- Test shapes: `isolated_frac` of every type's vertices take part in no edge; `self_loop_frac`
  of the cites edges are self loops (none otherwise); `parallel_frac` of every relation's edges
  repeat the edge before them (parallel edges beyond those drawn by chance).
- Determinism: every chunk draws from its own generator seeded by (seed, stream, type, chunk)
  with fixed chunk sizes, so the in-memory graph and the streamed directory are the same graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sparkgnn.graph.checks import NO_SPLIT
from sparkgnn.graph.typed import EdgeType, TypedEdges, TypedGraphData, node_table
from sparkgnn.graph.typed_io import EdgeTypeSpec, NodeTypeSpec, TypedGraphDirWriter

NODE_CHUNK = 1 << 16
EDGE_CHUNK = 1 << 20
_POOL, _NODES, _EDGES, _CENTROIDS, _LABELS = range(5)
NODE_TYPES = ("paper", "author", "institution", "field_of_study")
# edge type -> (count basis, which endpoint is power-law: "src" or "dst")
RELATIONS: dict[EdgeType, tuple[str, str]] = {
    ("author", "writes", "paper"): ("writes_per_paper", "src"),
    ("paper", "cites", "paper"): ("cites_per_paper", "dst"),
    ("author", "affiliated_with", "institution"): ("affiliations_per_author", "dst"),
    ("paper", "has_topic", "field_of_study"): ("topics_per_paper", "dst"),
}


@dataclass(frozen=True)
class MagSpec:
    """Sizes are per paper (OGB-MAG's ratios by default) except affiliations, per author."""

    num_papers: int
    dim: int = 128
    num_classes: int = 8
    seed: int = 0
    authors_per_paper: float = 1.5
    institutions_per_paper: float = 0.012
    fields_per_paper: float = 0.08
    writes_per_paper: float = 9.7
    cites_per_paper: float = 7.3
    affiliations_per_author: float = 0.9
    topics_per_paper: float = 10.2
    author_dim: int = 0
    institution_dim: int = 0
    field_dim: int = 0
    zipf_alpha: float = 0.8
    isolated_frac: float = 0.01
    self_loop_frac: float = 0.0
    parallel_frac: float = 0.0
    reverse: bool = False
    train_frac: float = 0.6
    val_frac: float = 0.2
    test_frac: float = 0.2
    name: str = "synthetic-mag"

    def __post_init__(self):
        if self.num_papers < 2 or self.dim < 1 or self.num_classes < 1:
            raise ValueError(f"need num_papers >= 2, dim >= 1, num_classes >= 1; got {self}")
        if min(self.author_dim, self.institution_dim, self.field_dim) < 0:
            raise ValueError("author_dim, institution_dim and field_dim must be >= 0 (0: no features)")
        for what in ("isolated_frac", "self_loop_frac", "parallel_frac"):
            if not 0 <= getattr(self, what) < 1:
                raise ValueError(f"{what} must be in [0, 1), got {getattr(self, what)}")
        if self.train_frac + self.val_frac + self.test_frac > 1 + 1e-9:
            raise ValueError("train_frac + val_frac + test_frac must not exceed 1")

    def num_nodes(self, node_type: str) -> int:
        per_paper = {
            "paper": 1.0,
            "author": self.authors_per_paper,
            "institution": self.institutions_per_paper,
            "field_of_study": self.fields_per_paper,
        }[node_type]
        return max(1, int(round(self.num_papers * per_paper)))

    def feature_dim(self, node_type: str) -> int:
        return {
            "paper": self.dim,
            "author": self.author_dim,
            "institution": self.institution_dim,
            "field_of_study": self.field_dim,
        }[node_type]

    def num_edges(self, edge_type: EdgeType) -> int:
        basis, _ = RELATIONS[edge_type]
        per = getattr(self, basis)
        rows = self.num_nodes("author") if basis == "affiliations_per_author" else self.num_papers
        return int(round(rows * per))


def _rng(spec: MagSpec, *key: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed, *key])


class _Pool:
    """One node type's vertices that take part in edges, and its seeded Zipf ranking."""

    def __init__(self, spec: MagSpec, type_index: int, n: int):
        rng = _rng(spec, _POOL, type_index)
        isolated = rng.random(n) < spec.isolated_frac
        active = np.flatnonzero(~isolated)
        self.active = active if len(active) else np.arange(n)
        self.ranked = rng.permutation(self.active)
        self.cdf = np.cumsum(np.arange(1, len(self.active) + 1, dtype=np.float64) ** -spec.zipf_alpha)

    def draw(self, rng: np.random.Generator, count: int, power_law: bool) -> np.ndarray:
        m = len(self.active)
        if power_law:
            return self.ranked[np.minimum(np.searchsorted(self.cdf, rng.random(count) * self.cdf[-1]), m - 1)]
        return self.active[rng.integers(m, size=count)]

    def next_after(self, ids: np.ndarray) -> np.ndarray:
        """The next active vertex after each id (moves a source off its destination)."""
        pos = np.searchsorted(self.active, ids)
        return self.active[(pos + 1) % len(self.active)]


class _Plan:
    def __init__(self, spec: MagSpec):
        self.spec = spec
        self.pools = {t: _Pool(spec, i, spec.num_nodes(t)) for i, t in enumerate(NODE_TYPES)}
        self.y = _rng(spec, _LABELS).integers(spec.num_classes, size=spec.num_papers)
        scale = 1.5 / np.sqrt(spec.dim)
        self.centroids = (_rng(spec, _CENTROIDS).standard_normal((spec.num_classes, spec.dim)) * scale).astype(
            np.float32
        )

    def nodes(self, node_type: str, chunk: int, start: int, count: int):
        """(ids, x or None, y or None, split or None) of one vertex chunk."""
        spec = self.spec
        rng = _rng(spec, _NODES, NODE_TYPES.index(node_type), chunk)
        ids = np.arange(start, start + count, dtype=np.int64)
        width = spec.feature_dim(node_type)
        if node_type != "paper":
            x = rng.standard_normal((count, width), dtype=np.float32) if width else None
            return ids, x, None, None
        y = self.y[start : start + count]
        x = self.centroids[y] + rng.standard_normal((count, width), dtype=np.float32)
        cuts = np.cumsum([spec.train_frac, spec.val_frac, spec.test_frac])
        split = np.array(["train", "val", "test", NO_SPLIT], dtype="<U5")[
            np.searchsorted(cuts, rng.random(count), side="right")
        ]
        return ids, x, y.astype(np.int64), split

    def edges(self, edge_type: EdgeType, chunk: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(src, dst) ids of one edge chunk of a forward edge type."""
        spec = self.spec
        rng = _rng(spec, _EDGES, list(RELATIONS).index(edge_type), chunk)
        src_type, _, dst_type = edge_type
        hub = RELATIONS[edge_type][1]
        src = self.pools[src_type].draw(rng, count, hub == "src")
        dst = self.pools[dst_type].draw(rng, count, hub == "dst")
        loops = rng.random(count) < spec.self_loop_frac
        parallel = np.flatnonzero(rng.random(count) < spec.parallel_frac)
        if src_type == dst_type:
            clash = (src == dst) & ~loops
            src = np.where(clash, self.pools[src_type].next_after(src), src)
            src = np.where(loops, dst, src)
        parallel = parallel[parallel % 2 == 1]  # copy from an even row, which is never overwritten
        src[parallel], dst[parallel] = src[parallel - 1], dst[parallel - 1]
        return src.astype(np.int64), dst.astype(np.int64)


def _chunks(total: int, size: int):
    for chunk, start in enumerate(range(0, total, size)):
        yield chunk, start, min(size, total - start)


def _edge_types(spec: MagSpec) -> list[EdgeType]:
    """The forward types, then (reverse=True) the reverses of those between two types (PyG's
    ToUndirected makes a same-type relation undirected in place instead; cites stays directed)."""
    forward = list(RELATIONS)
    return forward + ([(d, f"rev_{r}", s) for s, r, d in forward if s != d] if spec.reverse else [])


def synthetic_mag_graph(num_papers: int, **options) -> TypedGraphData:
    """The OGB-MAG-shaped graph in memory (options: MagSpec fields)."""
    spec = MagSpec(int(num_papers), **options)
    plan = _Plan(spec)
    nodes = {}
    for t in NODE_TYPES:
        parts = [plan.nodes(t, c, s, n) for c, s, n in _chunks(spec.num_nodes(t), NODE_CHUNK)]
        ids = np.concatenate([p[0] for p in parts])
        x = np.concatenate([p[1] for p in parts]) if spec.feature_dim(t) else None
        y = np.concatenate([p[2] for p in parts]) if t == "paper" else None
        split = np.concatenate([p[3] for p in parts]) if t == "paper" else None
        nodes[t] = node_table(ids, x, y=y, split=split, name=f"{spec.name}/{t}")
    edges = {}
    for et in RELATIONS:
        parts = [plan.edges(et, c, n) for c, _, n in _chunks(spec.num_edges(et), EDGE_CHUNK)]
        src = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
        dst = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.int64)
        edges[et] = TypedEdges(src, dst)
    for s, r, d in _edge_types(spec)[len(RELATIONS) :]:
        forward = edges[(d, r[len("rev_") :], s)]
        edges[(s, r, d)] = TypedEdges(forward.dst, forward.src)
    return TypedGraphData(nodes, edges, name=spec.name)


def write_synthetic_mag(
    out_dir: str, num_papers: int, *, rows_per_file: int | None = None, overwrite: bool = False, **options
) -> dict:
    """Stream the OGB-MAG-shaped graph to a typed graph directory chunk by chunk; returns
    graph.json. Only O(vertices) arrays and one chunk live in memory at a time."""
    spec = MagSpec(int(num_papers), **options)
    plan = _Plan(spec)
    node_specs = {
        t: NodeTypeSpec(spec.feature_dim(t), has_labels=t == "paper", has_split=t == "paper") for t in NODE_TYPES
    }
    with TypedGraphDirWriter(
        out_dir,
        node_specs,
        {et: EdgeTypeSpec() for et in _edge_types(spec)},
        name=spec.name,
        rows_per_file=rows_per_file,
        overwrite=overwrite,
    ) as writer:
        for t in NODE_TYPES:
            for chunk, start, count in _chunks(spec.num_nodes(t), NODE_CHUNK):
                writer.write_vertices(t, *plan.nodes(t, chunk, start, count))
        for et in RELATIONS:
            for chunk, _, count in _chunks(spec.num_edges(et), EDGE_CHUNK):
                src, dst = plan.edges(et, chunk, count)
                writer.write_edges(et, src, dst)
                if spec.reverse and et[0] != et[2]:
                    writer.write_edges((et[2], f"rev_{et[1]}", et[0]), dst, src)
        return writer.close(
            validated=True,
            extra={
                "generator": {
                    "kind": "synthetic-mag",
                    "seed": spec.seed,
                    "zipf_alpha": spec.zipf_alpha,
                    "isolated_frac": spec.isolated_frac,
                    "self_loop_frac": spec.self_loop_frac,
                    "parallel_frac": spec.parallel_frac,
                }
            },
        )
