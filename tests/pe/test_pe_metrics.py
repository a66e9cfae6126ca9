"""Degrees, PSGS and FAP from Spark vs brute force in numpy on a small irregular graph.

Brute force = (a) the paper's formulas with explicit dense matrix powers A^k, and (b) an
enumeration of every random-walk path, which is what the formulas sum over."""

import numpy as np
import pytest
from pe_reference import dense, psgs_matrix

from sparkgnn.pe.metrics import degrees, fap, psgs


def _as_map(df, col):
    return {int(r.id): float(r[col]) for r in df.collect()}


def test_degrees_match_numpy(spark_graph, graph_data):
    ids, ind, outd, _ = dense(graph_data)
    rows = {int(r.id): (r.in_degree, r.out_degree) for r in degrees(spark_graph).collect()}
    assert rows == {int(i): (int(a), int(b)) for i, a, b in zip(ids, ind, outd, strict=True)}
    assert rows[99] == (0, 0) and rows[2][0] == 0


def _psgs_paths(a, ind, fanouts, i):
    """Sum over walks i=v0 -> ... -> v_{k-1} of their probability x min(deg(v_{k-1}), l_k)."""
    total = 1.0
    frontier = {i: 1.0}  # node -> probability of the walk prefix
    for l in fanouts:
        total += sum(p * min(ind[v], l) for v, p in frontier.items())
        nxt = {}
        for v, p in frontier.items():
            for j in np.nonzero(a[v])[0]:
                nxt[j] = nxt.get(j, 0.0) + p * a[v, j]
        frontier = nxt
    return total


@pytest.mark.parametrize("fanouts", [[2], [25, 10], [3, 2, 1]])
def test_psgs_matches_brute_force(spark_graph, graph_data, fanouts):
    ids, ind, _, a = dense(graph_data)
    got = _as_map(psgs(spark_graph, fanouts), "psgs")
    want = psgs_matrix(a, ind, fanouts)
    for k, i in enumerate(ids):
        assert got[int(i)] == pytest.approx(want[k], rel=1e-12, abs=1e-12)
        assert want[k] == pytest.approx(_psgs_paths(a, ind, fanouts, k), rel=1e-12)
    assert got[99] == 1.0  # isolated: only itself


def test_psgs_paper_example():
    """Quiver Fig. 5 semantics on a 3-node toy: seed 3 with neighbours {0, 1}, fanouts (1, 1):
    q_1 = min(2, 1) = 1, q_2 = 1/2 * min(|N(0)|, 1) + 1/2 * min(|N(1)|, 1) = 1/2 (only 0 has a
    neighbour)."""
    a = np.zeros((4, 4))
    a[3, 0] = a[3, 1] = 0.5
    a[0, 2] = 1.0
    ind = np.array([1, 0, 0, 2])
    assert psgs_matrix(a, ind, [1, 1])[3] == pytest.approx(1 + 1 + 0.5)


def _fap_paths(a, p0, hops):
    """Sum over walks of length <= hops of p0(start) x the walk's probability, at the end node."""
    n = len(p0)
    total = np.array(p0, dtype=float)
    cur = {(s,): p0[s] for s in range(n) if p0[s]}
    for _ in range(hops):
        nxt = {}
        for path, p in cur.items():
            for j in np.nonzero(a[path[-1]])[0]:
                nxt[path + (j,)] = p * a[path[-1], j]
        for path, p in nxt.items():
            total[path[-1]] += p
        cur = nxt
    return total


@pytest.mark.parametrize("hops", [0, 3])
def test_fap_uniform_matches_matrix_power(spark_graph, graph_data, hops):
    ids, _, _, a = dense(graph_data)
    p0 = np.full(len(ids), 1.0 / len(ids))
    want = sum(np.linalg.matrix_power(a.T, k) @ p0 for k in range(hops + 1))
    np.testing.assert_allclose(want, _fap_paths(a, p0, hops), rtol=1e-12)
    got = _as_map(fap(spark_graph, hops), "fap")
    np.testing.assert_allclose([got[int(i)] for i in ids], want, rtol=1e-12, atol=1e-15)


def test_fap_given_seeds(spark, spark_graph, graph_data):
    ids, _, _, a = dense(graph_data)
    p0 = np.zeros(len(ids))
    p0[[0, 3]] = [0.7, 0.3]
    seeds = spark.createDataFrame([(int(ids[0]), 0.7), (int(ids[3]), 0.3)], "id long, p double")
    want = sum(np.linalg.matrix_power(a.T, k) @ p0 for k in range(3))
    got = _as_map(fap(spark_graph, 2, seeds=seeds), "fap")
    np.testing.assert_allclose([got[int(i)] for i in ids], want, rtol=1e-12, atol=1e-15)


def _metric_columns(tables) -> dict:
    """{(table, column): {id: value}} of the degrees/psgs/fap tables (Arrow tables or DataFrames)."""
    out = {}
    for name, columns in (("degrees", ("in_degree", "out_degree")), ("psgs", ("psgs",)), ("fap", ("fap",))):
        frame = tables[name]
        rows = frame.to_pylist() if hasattr(frame, "to_pylist") else [r.asDict() for r in frame.collect()]
        for column in columns:
            out[(name, column)] = {int(r["id"]): float(r[column]) for r in rows}
    return out


def test_one_pass_metrics_equal_the_spark_frames(spark, spark_graph, tmp_path):
    """The precompute's one-pass metrics (read once on the driver, numpy products) hold the values
    and summary of the Spark joins' frames, for a graph given as DataFrames and as a directory."""
    from sparkgnn.graph import Graph
    from sparkgnn.pe.metrics import compute_metrics, one_pass_metrics

    want = compute_metrics(spark_graph, [3, 2], 3)
    spark_graph.save(str(tmp_path / "g"))
    for graph in (spark_graph, Graph.load(spark, str(tmp_path / "g"), validate=False)):
        _assert_same_metrics(one_pass_metrics(graph, [3, 2], 3), want)


def test_one_pass_metrics_equal_the_spark_frames_on_a_weighted_graph(spark):
    """The same agreement on a graph with the skewed serving graph's features -- edge weights (which
    neither side uses), self loops (one duplicated), parallel edges, an isolated vertex -- and a
    vertex count whose reciprocal has no short decimal form (uniform p_0 = 1/7 must be a double
    on the Spark side too, or every FAP value is off by the same factor)."""
    from sparkgnn.graph import Graph, GraphData
    from sparkgnn.pe.metrics import compute_metrics, one_pass_metrics

    ids = np.array([4, 11, 2, 30, 7, 19, 25], dtype=np.int64)  # 25 isolated
    src = np.array([4, 4, 11, 2, 30, 7, 19, 11, 11, 7, 7, 2])
    dst = np.array([11, 11, 2, 30, 7, 19, 4, 11, 11, 7, 4, 4])  # 4->11 twice; loops 11 (twice), 7
    weight = np.linspace(0.25, 3.0, len(src)).astype(np.float32)
    x = np.zeros((len(ids), 2), dtype=np.float32)
    graph = Graph.from_graph_data(spark, GraphData.from_edge_ids(ids, x, src, dst, weight=weight, name="weighted"))
    _assert_same_metrics(one_pass_metrics(graph, [2, 3], 3), compute_metrics(graph, [2, 3], 3))


def _assert_same_metrics(got: dict, want: dict) -> None:
    """one_pass_metrics' result `got` holds compute_metrics' `want` values and summary to 1e-12,
    as pyarrow tables (no Spark job)."""
    assert all(hasattr(got[name], "to_pylist") for name in ("degrees", "psgs", "fap"))
    expected, actual = _metric_columns(want), _metric_columns(got)
    assert actual.keys() == expected.keys()
    for key, values in expected.items():
        assert actual[key].keys() == values.keys(), key
        for i, value in values.items():
            assert actual[key][i] == pytest.approx(value, rel=1e-12, abs=1e-15), (key, i)
    assert _close(got["summary"], want["summary"]), (got["summary"], want["summary"])


def _close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-15)
    return a == b


def test_one_pass_metrics_leave_unknown_endpoints_to_spark(spark):
    """An edge naming an id that is not a vertex: the driver arrays are refused (None), so the
    metrics come from the Spark frames, whose joins decide what such an edge counts for."""
    from sparkgnn.graph import Graph
    from sparkgnn.pe.metrics import _read_edge_arrays

    vertices = spark.createDataFrame([(1, [0.0]), (2, [1.0])], "id long, x array<float>")
    edges = spark.createDataFrame([(1, 2), (2, 7)], "src long, dst long")
    assert _read_edge_arrays(Graph(vertices, edges)) is None
