"""Quiver's workload metrics on Spark DataFrames: degrees, PSGS (section 4.1), FAP (section 5.1).

Everything is a join / groupBy over the edge DataFrame (sparse matrix-vector products expressed
as SQL), iterated once per hop -- never a per-node Python loop -- so it scales with the graph.
No pyspark import at module level: the DataFrames passed in carry their own session.

Sampling model (shared by both metrics, and the paper's):
  * Direction: a node's neighbours are its IN-neighbours (src of edges whose dst is the node),
    because message passing aggregates over in-edges, so a sampler building the computation graph
    of a seed follows in-edges. deg(i) below is therefore the in-degree.
  * Transition matrix A (Quiver's "weighted adjacency matrix"): A[i][j] = (#edges j->i) / deg(i),
    the probability of stepping from i to a uniformly chosen neighbour j -- exactly what the
    paper's worked examples use (node 3 with two neighbours -> 1/2 each). Edge weights are
    ignored: neighbour samplers sample uniformly and GNN weights are not probabilities.
    A node without in-neighbours has an all-zero row (the walk stops there).

PSGS (Quiver eq. in 4.1): Q_K[i] = sum_{k=0..K} q_k[i], q_0 = 1,
    q_k[i] = sum_{j in N_{k-1}(i)} min(deg(j), l_k) * A^{k-1}[i][j]  =  (A^{k-1} c_k)[i],
    c_k[j] = min(deg(j), l_k), l_k = fanouts[k-1]. Computed by Horner's rule
    Q - 1 = c_1 + A (c_2 + A (c_3 + ...)), i.e. K-1 sparse products.
FAP (Quiver eq. in 5.1): P_K[i] = sum_{k=0..K} p_k[i], p_k = (A^T)^k p_0 (p_0 uniform 1/|V| or
    given). Computed as P = p_0 + A^T (p_0 + A^T (...)), K sparse products.
The paper's approximation, kept as is: a hop is ONE random-walk step (fanouts do not enter FAP,
and in PSGS they only cap the size at the last hop of each path), and probabilities of different
paths/hops are ADDED (linearity of expectation, no inclusion-exclusion for overlaps), so FAP is
an expected number of accesses per request and can exceed 1; PSGS is an expected size, not a
count of distinct nodes.
"""

from __future__ import annotations


def _with_zero(vertices, values, column: str):
    """Every vertex id with `column` from `values` (id, v), 0 where absent."""
    return (
        vertices.select("id")
        .join(values.withColumnRenamed("v", column), "id", "left")
        .selectExpr("id", f"CAST(coalesce({column}, 0) AS DOUBLE) AS {column}")
    )


def degrees(graph):
    """DataFrame(id, in_degree, out_degree) for every vertex (isolated ones with 0). Parallel
    edges count once each; a self-loop counts in both."""
    e = graph.edges
    ind = e.groupBy("dst").count().selectExpr("dst AS id", "count AS in_degree")
    outd = e.groupBy("src").count().selectExpr("src AS id", "count AS out_degree")
    return (
        graph.vertices.select("id")
        .join(ind, "id", "left")
        .join(outd, "id", "left")
        .selectExpr(
            "id",
            "CAST(coalesce(in_degree, 0) AS BIGINT) AS in_degree",
            "CAST(coalesce(out_degree, 0) AS BIGINT) AS out_degree",
        )
    )


def _transitions(graph):
    """(src, dst, p) per edge, p = 1/in_degree(dst) = A[dst][src] (parallel edges add up)."""
    ind = graph.edges.groupBy("dst").count().selectExpr("dst", "CAST(count AS DOUBLE) AS d")
    return graph.edges.select("src", "dst").join(ind, "dst").selectExpr("src", "dst", "1.0 / d AS p")


def _apply_a(trans, v):
    """(A v)[i] = sum_{edges j->i} v[j] / deg(i): pull from in-neighbours. v: (id, v)."""
    return (
        trans.join(v.withColumnRenamed("id", "src"), "src")
        .selectExpr("dst AS id", "p * v AS v")
        .groupBy("id")
        .sum("v")
        .withColumnRenamed("sum(v)", "v")
    )


def _apply_at(trans, v):
    """(A^T v)[j] = sum_{edges j->i} v[i] / deg(i): push a node's mass to its in-neighbours."""
    return (
        trans.join(v.withColumnRenamed("id", "dst"), "dst")
        .selectExpr("src AS id", "p * v AS v")
        .groupBy("id")
        .sum("v")
        .withColumnRenamed("sum(v)", "v")
    )


def _add(a, b):
    return a.unionByName(b).groupBy("id").sum("v").withColumnRenamed("sum(v)", "v")


def psgs(graph, fanouts):
    """DataFrame(id, psgs double): expected sampled-subgraph size of each seed (hop 0 included)
    for neighbour sampling with per-hop fanouts [l_1, ..., l_K] (hop 1 first)."""
    fanouts = [int(f) for f in fanouts]
    if not fanouts or min(fanouts) < 0:
        raise ValueError(f"fanouts must be a non-empty list of non-negative ints, got {fanouts}")
    ind = graph.edges.groupBy("dst").count().selectExpr("dst AS id", "count AS d")

    def cap(l):
        return ind.selectExpr("id", f"CAST(least(d, {l}) AS DOUBLE) AS v")

    trans = _transitions(graph)
    r = cap(fanouts[-1])
    for l in reversed(fanouts[:-1]):
        r = _add(cap(l), _apply_a(trans, r))
    return _with_zero(graph.vertices, r, "psgs").selectExpr("id", "psgs + 1.0 AS psgs")


def fap(graph, hops: int, seeds=None):
    """DataFrame(id, fap double): Quiver's access probability within `hops` hops. `seeds`:
    DataFrame(id, p) of seed probabilities (used as given; the paper assumes they sum to 1),
    default uniform 1/|V|."""
    hops = int(hops)
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    if seeds is None:
        n = graph.vertices.count()
        # A double division: Spark SQL reads `1.0` as a DECIMAL literal, and a decimal quotient
        # keeps only 6 fractional digits (1/600 -> 0.001667), which would scale every FAP value.
        p0 = graph.vertices.selectExpr("id", f"CAST(1 AS DOUBLE) / {max(n, 1)} AS v")
    else:
        p0 = seeds.selectExpr("CAST(id AS BIGINT) AS id", "CAST(p AS DOUBLE) AS v")
    trans = _transitions(graph)
    r = p0
    for _ in range(hops):
        r = _add(p0, _apply_at(trans, r))
    return _with_zero(graph.vertices, r, "fap")


def compute_metrics(graph, fanouts, hops: int, seeds=None, top_fractions=(0.01, 0.1)):
    """{"degrees", "psgs", "fap": DataFrames, "summary": JSON-able dict} -- the shape
    PEWriter.commit_metrics takes as is. The summary (for the manifest) has degree and PSGS
    mean/max, the FAP total and the share of FAP mass held by the top 1% / 10% of nodes (how much
    a feature cache of that size would serve). The FAP ranking sorts once per fraction; the
    degree/PSGS/FAP frames are recomputed by each action (persist the graph's edges to avoid
    that on big graphs)."""
    import math

    frames = {"degrees": degrees(graph), "psgs": psgs(graph, fanouts), "fap": fap(graph, hops, seeds)}
    d = (
        frames["degrees"]
        .selectExpr(
            "count(1) AS n",
            "avg(in_degree) AS mean_in",
            "max(in_degree) AS max_in",
            "avg(out_degree) AS mean_out",
            "max(out_degree) AS max_out",
        )
        .first()
    )
    q = frames["psgs"].selectExpr("avg(psgs) AS mean", "max(psgs) AS max").first()
    total = frames["fap"].selectExpr("sum(fap) AS s").first().s or 0.0
    n = int(d.n)
    top = {}
    for frac in top_fractions:
        k = max(1, math.ceil(frac * n)) if n else 0
        mass = (
            (frames["fap"].orderBy("fap", ascending=False).limit(k).selectExpr("sum(fap) AS s").first().s or 0.0)
            if k
            else 0.0
        )
        top[f"top_{frac:g}"] = {"nodes": k, "fap_share": (mass / total) if total else 0.0}
    summary = {
        "fanouts": [int(f) for f in fanouts],
        "hops": int(hops),
        "seeds": "uniform" if seeds is None else "given",
        "num_vertices": n,
        "in_degree": {"mean": float(d.mean_in or 0.0), "max": int(d.max_in or 0)},
        "out_degree": {"mean": float(d.mean_out or 0.0), "max": int(d.max_out or 0)},
        "psgs": {"mean": float(q.mean or 0.0), "max": float(q.max or 0.0)},
        "fap": {"total": float(total), "top_mass": top},
    }
    return {**frames, "summary": summary}


# Driver bytes per edge and per vertex of metrics_from_arrays' working set (int32 endpoints, the
# per-edge transition probabilities and one weighted-bincount temporary; per vertex the degrees
# and a few vectors), with the arrays read from the graph's files.
_DRIVER_BYTES_PER_EDGE = 40
_DRIVER_BYTES_PER_VERTEX = 96
# Share of the driver machine's available memory the one-pass metrics may take.
_DRIVER_MEMORY_SHARE = 0.5


def metrics_from_arrays(ids, src, dst, fanouts, hops: int, seeds=None, top_fractions=(0.01, 0.1)) -> dict:
    """Quiver's metrics in numpy from the edge list as dense vertex indices (`src`, `dst` in
    0..len(ids)-1, one entry per edge) under exactly the module's definitions and recurrences
    (Horner's rule; every product one weighted bincount over the edges), so values agree with the
    Spark frames up to float summation order. Returns {"degrees", "psgs", "fap": pyarrow Tables
    (id + columns of the names and types compute_metrics writes), "summary": compute_metrics'
    dict}; PEWriter.commit_metrics takes it as is. `seeds`: FAP's p_0 per vertex (array in ids'
    order, used as given), default uniform 1/|V|."""
    import math

    import numpy as np
    import pyarrow as pa

    fanouts = [int(f) for f in fanouts]
    if not fanouts or min(fanouts) < 0:
        raise ValueError(f"fanouts must be a non-empty list of non-negative ints, got {fanouts}")
    hops = int(hops)
    if hops < 0:
        raise ValueError(f"hops must be >= 0, got {hops}")
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    in_deg = np.bincount(dst, minlength=n).astype(np.int64)
    out_deg = np.bincount(src, minlength=n).astype(np.int64)
    ind = in_deg.astype(np.float64)
    p = 1.0 / ind[dst] if len(dst) else np.zeros(0)  # A[dst][src] per edge (_transitions)

    def apply_a(v):  # (A v)[i] = sum over edges j->i of p * v[j] (_apply_a)
        return np.bincount(dst, weights=p * v[src], minlength=n)

    def apply_at(v):  # (A^T v)[j] = sum over edges j->i of p * v[i] (_apply_at)
        return np.bincount(src, weights=p * v[dst], minlength=n)

    r = np.minimum(ind, fanouts[-1])  # PSGS - 1 = c_1 + A (c_2 + A (...)), c_k = min(deg, l_k)
    for l in reversed(fanouts[:-1]):
        r = np.minimum(ind, l) + apply_a(r)
    q = r + 1.0
    p0 = np.full(n, 1.0 / max(n, 1)) if seeds is None else np.asarray(seeds, dtype=np.float64)
    if p0.shape != (n,):
        raise ValueError(f"seeds must hold one probability per vertex ({n}), got shape {p0.shape}")
    f = p0.copy()  # FAP = p_0 + A^T (p_0 + A^T (...)), `hops` products
    for _ in range(hops):
        f = p0 + apply_at(f)
    total = float(f.sum())
    ranked = np.sort(f)[::-1]
    top = {}
    for frac in top_fractions:
        k = max(1, math.ceil(frac * n)) if n else 0
        mass = float(ranked[:k].sum()) if k else 0.0
        top[f"top_{frac:g}"] = {"nodes": k, "fap_share": (mass / total) if total else 0.0}

    def mean(v) -> float:
        return float(v.mean()) if n else 0.0

    summary = {
        "fanouts": fanouts,
        "hops": hops,
        "seeds": "uniform" if seeds is None else "given",
        "num_vertices": n,
        "in_degree": {"mean": mean(in_deg), "max": int(in_deg.max()) if n else 0},
        "out_degree": {"mean": mean(out_deg), "max": int(out_deg.max()) if n else 0},
        "psgs": {"mean": mean(q), "max": float(q.max()) if n else 0.0},
        "fap": {"total": total, "top_mass": top},
    }
    return {
        "degrees": pa.table({"id": ids, "in_degree": in_deg, "out_degree": out_deg}),
        "psgs": pa.table({"id": ids, "psgs": q}),
        "fap": pa.table({"id": ids, "fap": f}),
        "summary": summary,
    }


def _columns(path: str, names: list[str]) -> list:
    """The `names` columns of every Parquet file under `path`, concatenated (numpy, file order)."""
    import numpy as np
    import pyarrow.parquet as pq

    from sparkgnn.files import data_files, filesystem, join

    parts: list[list] = [[] for _ in names]
    for entry in data_files(path):
        fs, inner = filesystem(join(path, entry.rel))
        with fs.open_input_file(inner) as handle:
            table = pq.read_table(handle, columns=names)
        for slot, name in zip(parts, names, strict=True):
            slot.append(table.column(name).to_numpy())
    return [np.concatenate(slot) if slot else np.zeros(0, np.int64) for slot in parts]


def _read_edge_arrays(graph):
    """(ids, dense src, dense dst) of a graph: read from a graph directory's files (no Spark job),
    or collected through Arrow for a graph given as DataFrames; None when an edge names an id
    that is not a vertex (the Spark frames' joins decide what such an edge counts for)."""
    import numpy as np

    from sparkgnn.graph.layout import EDGES_DIR, VERTICES_DIR

    path = getattr(graph, "path", None)
    if path:
        from sparkgnn.files import join

        (ids,) = _columns(join(path, VERTICES_DIR), ["id"])
        src, dst = _columns(join(path, EDGES_DIR), ["src", "dst"])
    else:
        ids = graph.vertices.select("id").toArrow().column("id").to_numpy()
        edges = graph.edges.select("src", "dst").toArrow()
        src, dst = (edges.column(c).to_numpy() for c in ("src", "dst"))
    ids = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    index_type = np.int32 if len(ids) < 2**31 else np.int64
    dense = []
    for ends in (src, dst):
        at = np.minimum(np.searchsorted(ordered, ends), max(len(ordered) - 1, 0))
        if len(ends) and (not len(ordered) or not np.array_equal(ordered[at], ends)):
            return None
        dense.append(order[at].astype(index_type))
    return ids, dense[0], dense[1]


def _driver_memory_fits(num_vertices: int, num_edges: int) -> tuple[bool, int]:
    """Whether the one-pass metrics' arrays fit in the driver machine's share of available memory,
    and the bytes they need."""
    import os

    need = num_edges * _DRIVER_BYTES_PER_EDGE + num_vertices * _DRIVER_BYTES_PER_VERTEX
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return True, need
    return need <= _DRIVER_MEMORY_SHARE * available, need


def one_pass_metrics(graph, fanouts, hops: int, top_fractions=(0.01, 0.1)) -> dict:
    """compute_metrics' result (uniform seeds) from one read of the graph's vertex ids and edge
    endpoints on the driver and numpy products (metrics_from_arrays), instead of a Spark job of
    joins and group-bys per product; falls back to compute_metrics when the arrays would not fit
    in the driver's memory or an edge names an id that is not a vertex. The tables are pyarrow
    Tables (PEWriter.commit_metrics writes them with pyarrow)."""
    import logging

    stats = graph.stats()
    fits, need = _driver_memory_fits(int(stats["num_vertices"]), int(stats["num_edges"]))
    if not fits:
        logging.getLogger(__name__).info(
            f"sparkgnn metrics: the edge arrays need ~{need / 2**30:.1f} GiB on the driver; "
            "computing the metrics with Spark joins instead"
        )
        return compute_metrics(graph, fanouts, hops, top_fractions=top_fractions)
    arrays = _read_edge_arrays(graph)
    if arrays is None:
        logging.getLogger(__name__).info(
            "sparkgnn metrics: an edge names an id that is not a vertex; computing the metrics with Spark joins"
        )
        return compute_metrics(graph, fanouts, hops, top_fractions=top_fractions)
    ids, src, dst = arrays
    return metrics_from_arrays(ids, src, dst, fanouts, hops, top_fractions=top_fractions)
