"""The hot-row cache (serving.online.hotcache): answers of HE and EXACT with a cache equal those
without one bit for bit (every policy, ~20% of rows hot, nothing hot, everything hot); FAP's hot
set serves requests' fetches (hit rate above the "off" baseline); the local precompute writes
Quiver's three metrics tables with the definitions of pe/metrics.py and PEStore.metrics_table
reads them without Spark; bad set-ups fail clearly."""

import numpy as np
import pytest
import torch
from serving_testkit import pyg_model

from sparkgnn.errors import SparkGNNError
from sparkgnn.models import Model
from sparkgnn.pe.local import local_metrics, precompute_local
from sparkgnn.pe.store import MissingMetricsTable
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.online.hotcache import (
    CACHE_POLICIES,
    HotCacheError,
    HotRows,
    attach_hot_cache,
    cache_stats,
    detach_hot_cache,
    hot_rows,
)

MODES = ["he", "exact"]


@pytest.fixture(scope="module")
def metrics_setup(request, tmp_path_factory):
    """(workload, Model, PEStore with states and metrics, PEStore without metrics) per (workload
    fixture name, kind, layers), built once (as conftest's reuse_setup, plus the metrics)."""
    cache = {}

    def get(kind: str, layers: int, which: str = "skewed"):
        key = (which, kind, layers)
        if key not in cache:
            wl = request.getfixturevalue(f"{which}_workload")
            G = wl.graph_G
            model = Model.from_pyg(pyg_model(kind, G.feature_dim, layers, seed=layers))
            store = precompute_local(G, model, str(tmp_path_factory.mktemp("pe")), metrics=True, fanouts=(8, 4))
            bare = precompute_local(G, model, str(tmp_path_factory.mktemp("pe")))
            cache[key] = (wl, model, store, bare)
        return cache[key]

    return get


def _engine(wl, model, store, mode):
    """An engine with its own context, hence its own StoredLayers (a cache attached to it does
    not leak into the reference engine)."""
    engine = QueryEngine(wl.graph_G, model, mode=mode, store=store)
    return engine, engine.mode.stored(engine.context)


def _bytes_per_vertex(stored) -> int:
    return sum(int(np.prod(a.shape[1:])) * a.itemsize for a in stored.arrays().values())


def _assert_same_answers(wl, ref, cached):
    for r in wl.requests:
        a, b = ref.answer(r), cached.answer(r)
        assert a.h.dtype == b.h.dtype and a.h.tobytes() == b.h.tobytes(), r.request_id
        np.testing.assert_array_equal(a.qid, b.qid)
        assert a.breakdown["bytes_fetched"] == b.breakdown["bytes_fetched"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("policy", ["off", "degree", "fap"])
@pytest.mark.parametrize("kind, layers", [("sage", 2), ("gcn", 3)])
def test_answers_with_a_cache_equal_answers_without(kind, layers, policy, mode, metrics_setup):
    wl, model, store, _ = metrics_setup(kind, layers)
    ref, _ = _engine(wl, model, store, mode)
    cached, stored = _engine(wl, model, store, mode)
    n = wl.graph_G.num_nodes
    plan = attach_hot_cache(stored, policy, int(0.2 * n) * _bytes_per_vertex(stored), store, wl.graph_G)
    assert plan["hot_rows"] == (0 if policy == "off" else int(0.2 * n))
    assert plan["hot_bytes"] <= int(0.2 * n) * plan["bytes_per_vertex"]
    _assert_same_answers(wl, ref, cached)
    stats = cache_stats(stored)
    assert stats["policy"] == policy and stats["hits"] + stats["misses"] > 0
    assert (stats["hits"] > 0) == (policy != "off")
    expected_arrays = {"h0", *(f"h{l}" for l in range(1, layers))}
    if mode == "exact":
        expected_arrays |= {f"state{l}" for l in range(1, layers)}
    assert set(stats["arrays"]) == expected_arrays


@pytest.mark.parametrize("mode", MODES)
def test_capacity_zero_and_everything(mode, metrics_setup):
    wl, model, store, _ = metrics_setup("sage", 2)
    n = wl.graph_G.num_nodes
    ref, _ = _engine(wl, model, store, mode)
    cached, stored = _engine(wl, model, store, mode)

    assert attach_hot_cache(stored, "fap", 0, store, wl.graph_G)["hot_rows"] == 0
    _assert_same_answers(wl, ref, cached)
    s = cache_stats(stored)
    assert s["hits"] == 0 and s["misses"] > 0 and s["hot_bytes"] == 0 and s["hit_rate"] == 0.0

    everything = sum(a.nbytes for a in stored.arrays().values())
    plan = attach_hot_cache(stored, "degree", 10 * everything, store, wl.graph_G)
    assert plan["hot_rows"] == n and plan["hot_bytes"] == everything
    _assert_same_answers(wl, ref, cached)
    s = cache_stats(stored)
    assert s["misses"] == 0 and s["hits"] > 0 and s["hit_rate"] == 1.0

    detach_hot_cache(stored)
    assert stored.cache == {} and cache_stats(stored)["hits"] == 0
    _assert_same_answers(wl, ref, cached)


@pytest.mark.parametrize("mode", MODES)
def test_fap_hit_rate_beats_nothing_hot(mode, metrics_setup):
    """Cora (power-law out-degrees): the top 20% of vertices by FAP (or by out-degree) serve well
    over twice the ~20% of fetches a random 20% would (measured: ~0.58 and ~0.60). The skewed
    test graph is NOT used here: its Zipf skew is on in-degrees, its out-degrees are nearly flat,
    so every placement is close to random there."""
    wl, model, store, _ = metrics_setup("sage", 2, "cora")
    n = wl.graph_G.num_nodes
    rates = {}
    for policy in ["off", "fap", "degree"]:
        engine, stored = _engine(wl, model, store, mode)
        attach_hot_cache(stored, policy, int(0.2 * n) * _bytes_per_vertex(stored), store, wl.graph_G)
        for r in wl.requests:
            engine.answer(r)
        rates[policy] = cache_stats(stored)["hit_rate"]
    assert rates["off"] == 0.0
    assert rates["fap"] >= rates["off"] and rates["fap"] > 0.4, rates
    assert rates["degree"] > 0.4, rates


def _dense_reference(G, fanouts, hops):
    """Quiver's formulas with a dense A and explicit powers (pe/metrics.py's module doc)."""
    n = G.num_nodes
    cnt = np.zeros((n, n))
    np.add.at(cnt, (G.edge_dst, G.edge_src), 1.0)  # row = vertex, column = in-neighbour
    ind = cnt.sum(1)
    a = np.divide(cnt, ind[:, None], out=np.zeros_like(cnt), where=ind[:, None] > 0)
    q = np.ones(n)
    for k, l in enumerate(fanouts, start=1):
        q += np.linalg.matrix_power(a, k - 1) @ np.minimum(ind, l)
    p0 = np.full(n, 1.0 / n)
    p = sum(np.linalg.matrix_power(a.T, k) @ p0 for k in range(hops + 1))
    return cnt.sum(1), cnt.sum(0), q, p


def test_metrics_table_reads_the_three_tables(metrics_setup):
    wl, model, store, _ = metrics_setup("gcn", 3)
    G = wl.graph_G
    assert store.metric_tables == ["degrees", "fap", "psgs"]
    ind, outd, q, p = _dense_reference(G, [8, 4], 3)  # hops default: the model's layer count
    t = {name: store.metrics_table(name) for name in store.metric_tables}
    assert t["degrees"].column_names == ["id", "in_degree", "out_degree"]
    assert str(t["degrees"].schema.field("out_degree").type) == "int64"
    assert t["psgs"].column_names == ["id", "psgs"] and t["fap"].column_names == ["id", "fap"]
    assert all(str(x.schema.field("id").type) == "int64" for x in t.values())
    for name, table in t.items():
        pos = G.index_of(table.column("id").to_numpy())
        assert sorted(pos.tolist()) == list(range(G.num_nodes)), name
        cols = {c: np.empty(G.num_nodes) for c in table.column_names[1:]}
        for c in cols:
            cols[c][pos] = table.column(c).to_numpy()
        if name == "degrees":
            np.testing.assert_array_equal(cols["in_degree"], ind)
            np.testing.assert_array_equal(cols["out_degree"], outd)
        elif name == "psgs":
            np.testing.assert_allclose(cols["psgs"], q, rtol=1e-12)
        else:
            np.testing.assert_allclose(cols["fap"], p, rtol=1e-10, atol=1e-15)
    summary = store.manifest["metrics"]["summary"]
    assert summary["fanouts"] == [8, 4] and summary["hops"] == 3 and summary["num_vertices"] == G.num_nodes
    assert summary["fap"]["total"] == pytest.approx(p.sum())
    assert summary["out_degree"]["max"] == int(outd.max())
    top = summary["fap"]["top_mass"]["top_0.1"]
    k = int(np.ceil(0.1 * G.num_nodes))
    assert top["nodes"] == k and top["fap_share"] == pytest.approx(np.sort(p)[::-1][:k].sum() / p.sum())


def test_local_metrics_checks_its_arguments(skewed_workload):
    G = skewed_workload.graph_G
    with pytest.raises(ValueError, match="fanouts"):
        local_metrics(G, [], 2)
    with pytest.raises(ValueError, match="hops"):
        local_metrics(G, [2], -1)
    seeds = np.zeros(G.num_nodes)
    seeds[0] = 1.0
    given = local_metrics(G, [2], 0, seeds=seeds)
    assert given["summary"]["seeds"] == "given"
    np.testing.assert_array_equal(given["fap"].column("fap").to_numpy(), seeds)  # 0 hops: p_0 itself


def test_missing_metrics_tables_are_named(metrics_setup):
    _, _, store, bare = metrics_setup("sage", 2)
    with pytest.raises(MissingMetricsTable, match=r"no metrics table 'bogus' \(it has: degrees, fap, psgs\)"):
        store.metrics_table("bogus")
    with pytest.raises(MissingMetricsTable, match="it has: none: rerun the precompute with workload metrics"):
        bare.metrics_table("fap")
    assert issubclass(MissingMetricsTable, SparkGNNError) and issubclass(MissingMetricsTable, ValueError)


def test_policies_rank_as_documented(metrics_setup):
    wl, _, store, bare = metrics_setup("sage", 2)
    G = wl.graph_G
    assert CACHE_POLICIES.names() == ["degree", "fap", "off"]
    # degree: the store's out-degrees, or G's own when the store has no degrees table: same rows
    with_table, without = hot_rows("degree", store, G, 50), hot_rows("degree", bare, G, 50)
    np.testing.assert_array_equal(with_table, without)
    outd = G.out_degree()
    assert outd[with_table].min() >= np.delete(outd, with_table).max()
    assert list(outd[with_table]) == sorted(outd[with_table], reverse=True)
    # fap: highest first, aligned to G's rows through the ids
    fap = store.metrics_table("fap")
    score = np.empty(G.num_nodes)
    score[G.index_of(fap.column("id").to_numpy())] = fap.column("fap").to_numpy()
    top = hot_rows("fap", store, G, 50)
    assert len(top) == 50 and score[top].min() >= np.delete(score, top).max()
    assert len(hot_rows("off", store, G, 50)) == 0
    assert len(hot_rows("fap", store, G, 10 * G.num_nodes)) == G.num_nodes


def test_bad_set_ups_fail_clearly(metrics_setup):
    wl, model, store, bare = metrics_setup("sage", 2)
    _, stored = _engine(wl, model, bare, "he")
    with pytest.raises(HotCacheError, match="unknown hot cache policy 'lru'; known: degree, fap, off"):
        attach_hot_cache(stored, "lru", 1 << 20, bare, wl.graph_G)
    with pytest.raises(HotCacheError, match="'fap' metrics table.*precompute the store with workload metrics"):
        attach_hot_cache(stored, "fap", 1 << 20, bare, wl.graph_G)
    with pytest.raises(HotCacheError, match="capacity_bytes must be >= 0"):
        attach_hot_cache(stored, "degree", -1, bare, wl.graph_G)
    assert stored.cache == {}  # nothing half-attached
    assert issubclass(HotCacheError, SparkGNNError) and issubclass(HotCacheError, ValueError)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_hot_rows_gather_is_bit_identical(device):
    """Hot, cold, mixed, repeated and empty row lists give array[rows] exactly (NaN and -0.0
    included: compared as bits); hits and misses are counted per row."""
    rng = np.random.default_rng(0)
    array = rng.standard_normal((100, 7)).astype(np.float32)
    array[3, 2], array[5, 0] = np.nan, -0.0
    cache = HotRows(array, np.array([5, 3, 3, 90, 0]), device=device)
    assert cache.device.type == ("cuda" if device == "cuda" and torch.cuda.is_available() else "cpu")
    assert cache.stats()["hot_rows"] == 4 and cache.stats()["hot_bytes"] == 4 * 7 * 4
    hits = misses = 0
    for rows in [np.array([3, 5]), np.array([1, 2]), np.array([3, 1, 3, 99, 0, 90]), np.empty(0, np.int64)]:
        got = cache.gather(rows)
        assert got.device.type == cache.device.type and got.dtype == torch.float32
        assert got.cpu().numpy().view(np.uint32).tobytes() == array[rows].view(np.uint32).tobytes()
        hot = np.isin(rows, [0, 3, 5, 90])
        hits, misses = hits + int(hot.sum()), misses + int((~hot).sum())
    s = cache.stats()
    assert (s["hits"], s["misses"]) == (hits, misses) and s["hit_rate"] == pytest.approx(hits / (hits + misses))
    cache.reset_stats()
    assert cache.stats()["hits"] == 0
    with pytest.raises(HotCacheError, match="hot rows must lie in 0..99"):
        HotRows(array, np.array([100]))


def test_local_precompute_adds_metrics_to_a_store_once(skewed_workload, tmp_path):
    """A store written without metrics gets them on a rerun with metrics=True (its layers are
    kept); a further rerun finds them and commits nothing new."""
    G = skewed_workload.graph_G
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2))
    root = str(tmp_path / "store")
    first = precompute_local(G, model, root)
    assert first.metric_tables == []
    second = precompute_local(G, model, root, metrics=True, fanouts=(3,))
    assert second.metric_tables == ["degrees", "fap", "psgs"]
    assert second.manifest["paths"]["layer=1"] == first.manifest["paths"]["layer=1"]
    assert second.manifest["metrics"]["summary"]["fanouts"] == [3]
    third = precompute_local(G, model, root, metrics=True, fanouts=(9,))
    assert third.manifest["paths"]["metrics/fap"] == second.manifest["paths"]["metrics/fap"]
    assert third.metrics_table("psgs").num_rows == G.num_nodes
