"""The graph's out-degree histogram, computed once per graph with Spark and kept in the work dir.

Why: the planner's memory rule needs the distinct sources a task's in-edges reach
(planner.partitions.expected_sources); on a power-law graph the simple bound min(edges, |V|)
overstates them and raises P, and with it the replication factor and the bytes every layer
shuffles. The histogram (how many vertices have out-degree k) is a few thousand numbers for any
graph size. It is only computed when the bound would raise P above the cores: below that, P is
the core count either way.

Cached at <work>/prep/<graph fingerprint>/out_degrees.json (the fingerprint covers the edges, so a
changed graph has another file); written atomically (files.write_json_atomic), and a file that does
not parse is recomputed.

It also holds the one definition of the per-vertex statistics the engine precomputes (GCN's
degree and the weighted in-degree over a vertex's in-edges, PREPARED_STATS; ChebConv's Laplacian
degree over its out-edges, OUT_STATS, computed only for runs that read it), written once as SQL
(stat_sql: prepare's Spark layouts and the pruned run's statistics, engine.vertex_stats) and once
as array code (stat_values, out_stat_sums: the prepare tasks). layers/stats.py keeps their torch
versions, which follow PyG's edge order; tests/engine/test_degrees.py checks the three against each
other. Each statistic exists twice, keyed by sparkgnn.stat_keys.stat_key: `<name>_w` sums the edge
weights, `<name>` counts every edge as 1 (a conv converted without edge weights, whose PyG forward
normalises by the unweighted degree).
"""

from __future__ import annotations

import logging

import numpy as np

from sparkgnn import files
from sparkgnn.stat_keys import WEIGHTED_SUFFIX, split_key

FILE = "out_degrees.json"
log = logging.getLogger(__name__)

#: GCN's degree of one vertex as an SQL aggregate over its in-edges (src, dst, w) grouped by dst,
#: `{w}` standing for an edge's weight: the weights of the edges that are not self loops, plus its
#: self loop's weight, 1 where it has none (PyG's add_remaining_self_loops). Several self loops count
#: once, with the largest weight: Spark has no edge order to keep PyG's last one by.
GCN_DEGREE_TEMPLATE = (
    "coalesce(sum(case when src != dst then {w} end), 0.0) + coalesce(max(case when src = dst then {w} end), 1.0)"
)
#: The degree of a vertex without in-edges (its added self loop).
GCN_DEGREE_EMPTY = 1.0

#: statistic name (layers/stats.py) -> (SQL aggregate over its in-edges (src, dst, w) grouped by
#: dst with `{w}` for an edge's weight, the value of a vertex without in-edges).
STAT_TEMPLATES: dict[str, tuple[str, float]] = {
    "in_degree": ("cast(count(1) as double)", 0.0),
    "weighted_in_degree": ("sum({w})", 0.0),
    "gcn_degree": (GCN_DEGREE_TEMPLATE, GCN_DEGREE_EMPTY),
}
#: statistic name -> (SQL aggregate over its OUT-edges (src, dst, w) grouped by src, the value of a
#: vertex without out-edges): get_laplacian's degree (ChebConv), the weights of the edges that
#: are not self loops.
OUT_STAT_TEMPLATES: dict[str, tuple[str, float]] = {
    "laplacian_degree": ("coalesce(sum(case when src != dst then {w} end), 0.0)", 0.0),
}
#: The edge weight a statistic counts when edge weights do not count (stat_key without `_w`).
_UNIT_WEIGHT = "cast(1.0 as double)"

#: The statistic keys (sparkgnn.stat_keys) every prepared vertex layout carries, each computed
#: in the same aggregation by destination: the degrees GCN-style layers read, with and without
#: edge weights.
PREPARED_STATS: tuple[str, ...] = ("gcn_degree", "gcn_degree_w", "weighted_in_degree", "weighted_in_degree_w")
#: The out-edge statistic keys (OUT_STAT_TEMPLATES, with and without edge weights): an aggregation
#: by source that few models read, so prepare computes each only when a run asks for it
#: (engine.prepare.ensure_out_stats), never as part of the base layout.
OUT_STATS: tuple[str, ...] = tuple(f"{name}{suffix}" for name in OUT_STAT_TEMPLATES for suffix in ("", WEIGHTED_SUFFIX))
#: Every statistic key a batch run can read: the prepared ones and the on-demand ones.
STAT_KEYS: tuple[str, ...] = PREPARED_STATS + OUT_STATS


def _known() -> str:
    return ", ".join(sorted([*STAT_TEMPLATES, *OUT_STAT_TEMPLATES]))


def is_out_stat(key: str) -> bool:
    """Whether a statistic key sums a vertex's OUT-edges (grouped by src) rather than its in-edges."""
    return split_key(key)[0] in OUT_STAT_TEMPLATES


def stat_sql(key: str) -> tuple[str, float]:
    """(SQL aggregate over a vertex's in-edges (src, dst, w) grouped by dst, or over its out-edges
    grouped by src where is_out_stat(key), value of a vertex without such edges) of a statistic
    key; an unknown statistic is a ValueError naming the known ones."""
    name, weighted = split_key(key)
    templates = OUT_STAT_TEMPLATES if name in OUT_STAT_TEMPLATES else STAT_TEMPLATES
    if name not in templates:
        raise ValueError(f"unknown node statistic {key!r}; known: {_known()}")
    template, empty = templates[name]
    return template.format(w="w" if weighted else _UNIT_WEIGHT), empty


#: GCN's weighted degree (the statistic key `gcn_degree_w`) as one SQL aggregate.
GCN_DEGREE_SQL = stat_sql("gcn_degree_w")[0]


def destination_positions(ids: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Each destination's position in the sorted vertex ids `ids`; a destination that is not in
    `ids` is a ValueError. The statistics of a slice share one (prepared_stat_values). Found
    through a hash table (pandas), not a binary search: millions of random probes into a
    partition's ids, where numpy's searchsorted cost about 5x more."""
    import pandas as pd

    index = pd.Index(ids)
    if index.is_unique:
        at = index.get_indexer(dst)
        bad = at < 0
    else:  # repeated ids (a graph being validated): the first of a run, as the binary search gives
        at = np.minimum(np.searchsorted(ids, dst), max(len(ids) - 1, 0))
        bad = ids[at] != dst if len(ids) else np.ones(len(dst), bool)
    if len(dst) and bool(bad.any()):
        raise ValueError(f"edges name destination ids that are not vertices, e.g. {dst[bad][:5].tolist()}")
    return at


def gcn_degree(
    ids: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray, *, at: np.ndarray | None = None
) -> np.ndarray:
    """GCN_DEGREE_SQL over arrays: float32[len(ids)] for the sorted vertex ids `ids`, from every
    in-edge (src, dst, w) of those vertices. A destination that is not in `ids` is a ValueError.
    `at`: the destinations' positions in `ids` (destination_positions), when the caller has them."""
    at = destination_positions(ids, dst) if at is None else at
    loop = src == dst
    # float64 sums like Spark's sum(float); bincount of nothing comes back as int64
    degree = np.bincount(at[~loop], weights=w[~loop].astype(np.float64), minlength=len(ids)).astype(np.float64)
    self_weight = np.full(len(ids), -np.inf)
    np.maximum.at(self_weight, at[loop], w[loop].astype(np.float64))
    degree += np.where(np.isfinite(self_weight), self_weight, GCN_DEGREE_EMPTY)
    return degree.astype(np.float32)


def out_stat_sums(key: str, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct sources, float64 sums) of an out-edge statistic (is_out_stat) over some edges:
    partial sums that add up, over any split of the edges, to stat_sql(key) per source."""
    name, weighted = split_key(key)
    if name not in OUT_STAT_TEMPLATES:
        raise ValueError(f"{key!r} is not an out-edge statistic; known: {', '.join(sorted(OUT_STAT_TEMPLATES))}")
    keep = src != dst
    ids, at = np.unique(src[keep], return_inverse=True)
    weights = w[keep].astype(np.float64) if weighted else np.ones(len(at), np.float64)
    return ids, np.bincount(at, weights=weights, minlength=len(ids)).astype(np.float64)


def stat_values(
    key: str, ids: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray, *, at: np.ndarray | None = None
) -> np.ndarray:
    """stat_sql(key) over arrays: float32[len(ids)] for the sorted vertex ids `ids`, from every
    in-edge (src, dst, w) of those vertices, or every out-edge where is_out_stat(key) (w ignored
    where the key's edge weights do not count). `at`: the in-edges' destination positions in
    `ids` (destination_positions), found here when not given."""
    name, weighted = split_key(key)
    if name in OUT_STAT_TEMPLATES:
        sources, sums = out_stat_sums(key, src, dst, w)
        return aligned_sums(ids, sources, sums, OUT_STAT_TEMPLATES[name][1])
    w = w if weighted else np.ones(len(src), np.float32)
    if name == "gcn_degree":
        return gcn_degree(ids, src, dst, w, at=at)
    if name in ("weighted_in_degree", "in_degree"):
        w = w if name == "weighted_in_degree" else np.ones(len(src), np.float32)
        at = np.searchsorted(ids, dst) if at is None else at
        return np.bincount(at, weights=w.astype(np.float64), minlength=len(ids)).astype(np.float32)
    raise ValueError(f"unknown node statistic {key!r}; known: {_known()}")


def prepared_stat_values(ids: np.ndarray, src: np.ndarray, dst: np.ndarray, w: np.ndarray) -> dict[str, np.ndarray]:
    """{key: stat_values(key, ...)} for every key of PREPARED_STATS, over one slice's in-edges.
    WHY one function: the destinations' positions among the ids are found once for all the keys
    (a binary search per edge was most of prepare's second pass when each key searched again)."""
    at = destination_positions(ids, dst)
    return {key: stat_values(key, ids, src, dst, w, at=at) for key in PREPARED_STATS}


def aligned_sums(ids: np.ndarray, keys: np.ndarray, sums: np.ndarray, empty: float) -> np.ndarray:
    """float32[len(ids)] for the sorted vertex ids `ids`: the sum of `sums` over each id's entries
    in `keys` (any order, repeats added), `empty` where it has none (keys outside ids ignored)."""
    out = np.full(len(ids), empty, np.float64)
    if len(ids) and len(keys):
        at = np.minimum(np.searchsorted(ids, keys), len(ids) - 1)
        hit = ids[at] == keys
        total = np.bincount(at[hit], weights=sums[hit], minlength=len(ids))
        seen = np.bincount(at[hit], minlength=len(ids)) > 0
        out[seen] = total[seen]
    return out.astype(np.float32)


def out_degree_histogram(graph, work_dir: str) -> dict[int, int]:
    """{out-degree k > 0: number of vertices with k out-edges}."""
    path = files.join(work_dir, "prep", str(graph.fingerprint), FILE)
    try:
        return {int(k): int(v) for k, v in files.read_json(path)["out_degrees"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    rows = graph.edges.groupBy("src").count().groupBy("count").count().collect()
    histogram = {int(r[0]): int(r[1]) for r in rows}
    files.write_json_atomic(path, {"fingerprint": str(graph.fingerprint), "out_degrees": histogram})
    log.info(
        f"sparkgnn: out-degree histogram of {sum(histogram.values()):,} source vertices computed for the partition rule"
    )
    return histogram
