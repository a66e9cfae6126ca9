"""Incremental PE refresh (pe/refresh.py, single machine): after any update, every layer of the
refreshed store (h and merged state) equals a from-scratch precompute on the updated graph, for
GCN, SAGE-mean, SAGE-max, GIN and GAT with 2 and 3 layers, on a weighted power-law graph with
self-loops and parallel edges, with edge inserts/deletes (self-loops among them), vertex inserts
and deletes and feature updates (edge inserts with attributes for GINE and GAT with edge_dim); the
refresh touches fewer vertices than the graph has; a refresh killed after its first layer and rerun
gives the same store; the old version stays readable."""

import os
import sys

import numpy as np
import pyarrow as pa
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import pyg_model, skewed_graph  # noqa: E402

from sparkgnn.errors import StalePEStore  # noqa: E402
from sparkgnn.graph.updates import UPDATE_SCHEMA, GraphUpdate  # noqa: E402
from sparkgnn.models import Model  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import RefreshError, refresh_local  # noqa: E402
from sparkgnn.pe.writer import PEWriter  # noqa: E402


def random_update(graph, seed: int, edges: int = 40, weighted: bool = True) -> GraphUpdate:
    """A mixed update of `graph`: edge deletes (one a self-loop), edge inserts (a self-loop, a
    parallel copy of an existing edge, edges of new vertices), feature updates, vertex inserts and
    deletes."""
    rng = np.random.default_rng(seed)
    ids, d = graph.ids, graph.feature_dim
    deleted_vertices = rng.choice(ids[200:], 3, replace=False)
    gone = np.isin(ids[graph.edge_src], deleted_vertices) | np.isin(ids[graph.edge_dst], deleted_vertices)
    candidates = np.flatnonzero(~gone)
    loops = candidates[graph.edge_src[candidates] == graph.edge_dst[candidates]]
    delete = np.concatenate([rng.choice(candidates, edges // 2, replace=False), loops[:1]])
    delete = np.unique(delete)
    alive = ids[~np.isin(ids, deleted_vertices)]
    new_ids = ids.max() + 1 + np.arange(4)
    ins_src = np.concatenate([rng.choice(alive, edges), [alive[5]], ids[graph.edge_src[candidates[:1]]], new_ids])
    ins_dst = np.concatenate([rng.choice(alive, edges), [alive[5]], ids[graph.edge_dst[candidates[:1]]], alive[:4]])
    ins_src, ins_dst = np.concatenate([ins_src, alive[10:12]]), np.concatenate([ins_dst, new_ids[:2]])
    updated = rng.choice(alive, 6, replace=False)
    rows = []

    def vec(values):
        return [float(v) for v in values]

    for e in delete:
        w = float(graph.weight[e]) if weighted else None
        rows.append(("edge_delete", int(ids[graph.edge_src[e]]), int(ids[graph.edge_dst[e]]), w, None, None))
    for s, t in zip(ins_src, ins_dst, strict=True):
        w = float(rng.uniform(0.25, 2.0)) if weighted else None
        rows.append(("edge_insert", int(s), int(t), w, None, None))
    for v in new_ids:
        rows.append(("vertex_insert", None, None, None, int(v), vec(rng.standard_normal(d))))
    for v in updated:
        rows.append(("feature_update", None, None, None, int(v), vec(rng.standard_normal(d))))
    for v in deleted_vertices:
        rows.append(("vertex_delete", None, None, None, int(v), None))
    columns = list(zip(*rows, strict=True))
    table = pa.table({f.name: pa.array(list(col), f.type) for f, col in zip(UPDATE_SCHEMA, columns, strict=True)})
    return GraphUpdate.from_table(table)


def model_of(kind: str, in_dim: int, layers: int):
    if kind == "sage_max":
        import torch_geometric.nn as gnn
        from serving_testkit import randomize

        torch.manual_seed(1)
        return Model.from_pyg(randomize(gnn.GraphSAGE(in_dim, 16, layers, out_channels=5, aggr="max"), 1))
    return Model.from_pyg(pyg_model(kind, in_dim, layers, seed=1))


@pytest.fixture(scope="module")
def graph():
    return skewed_graph()


@pytest.fixture(autouse=True)
def _delta_kernel(monkeypatch):
    """This module's tests are about the delta / scratch kernel: on its small graph an update
    reaches over half the vertices, where a refresh would compute the layer whole
    (WHOLE_LAYER_FRACTION); that path has tests of its own (test_refresh_whole.py)."""
    from sparkgnn.pe import refresh

    monkeypatch.setattr(refresh, "WHOLE_LAYER_FRACTION", 2.0)


def assert_same_store(got: PEStore, want: PEStore, ids, layers: int) -> None:
    for l in range(1, layers + 1):
        h, s = got.lookup(ids, l, states=True)
        h0, s0 = want.lookup(ids, l, states=True)
        for name, a, b in (("h", h, h0), ("state", s, s0)):
            finite = np.isfinite(b)  # max/min states of vertices without in-edges are +-inf
            assert np.array_equal(finite, np.isfinite(a)), (l, name)
            scale = max(1.0, float(np.abs(b[finite]).max()))
            assert np.abs(a[finite] - b[finite]).max() <= 1e-5 * scale, (l, name, np.abs(a[finite] - b[finite]).max())


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize(
    "kind",
    [
        "gcn",
        "sage",
        "sage_max",
        "gin",
        "gat",
        "resgated",
        "le",
        "graphconv",
        "sage_project",
        "sgconv",
        "lgconv",
        "tagconv",
        "appnp",
        "edgeconv",
        "transformer",
        "gen",
        "pna",
        "residual",
        "jk_cat",
        "jk_max",
    ],
)
def test_refresh_equals_a_precompute_of_the_updated_graph(graph, tmp_path, kind, layers):
    model = model_of(kind, graph.feature_dim, layers)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root)
    update = random_update(graph, seed=layers)
    refreshed, report = refresh_local(graph, update, model, root, out_graph=str(tmp_path / "graph2"))
    from sparkgnn.graph.reader import read_graph_dir

    new_graph = read_graph_dir(str(tmp_path / "graph2"))
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(refreshed, scratch, new_graph.ids, layers)
    assert refreshed.manifest["refresh"]["previous_graph_fingerprint"] == old.manifest["graph_fingerprint"]
    assert refreshed.manifest["refresh"]["chain"] == [old.manifest["graph_fingerprint"], report.graph_fingerprint]
    assert report.layers[0]["targets"] < new_graph.num_nodes  # layer 1 touches only the change
    if kind in ("gcn", "sage", "gin"):
        assert report.layers[0]["delta"] > 0  # invertible aggregators merge into the stored state
    # the old version is untouched and still opens for the old graph
    again = PEStore.open(root, model=model, graph=graph)
    h_old, _ = again.lookup(graph.ids, layers)
    np.testing.assert_array_equal(h_old, old.lookup(graph.ids, layers)[0])


def test_unweighted_graph_and_a_second_refresh_extends_the_chain(graph, tmp_path):
    from sparkgnn.graph import GraphData

    plain = GraphData(graph.ids, graph.x, graph.edge_src, graph.edge_dst, name="plain")
    model = model_of("gcn", plain.feature_dim, 2)
    root = str(tmp_path / "store")
    first = precompute_local(plain, model, root)
    one = random_update(plain, seed=7, weighted=False)
    from sparkgnn.graph.updates import apply

    mid = apply(one, plain).graph
    _, r1 = refresh_local(plain, one, model, root)
    two = random_update(mid, seed=8, weighted=False)
    final = apply(two, mid).graph
    store, r2 = refresh_local(mid, two, model, root)
    assert store.manifest["refresh"]["chain"] == [
        first.manifest["graph_fingerprint"],
        r1.graph_fingerprint,
        r2.graph_fingerprint,
    ]
    assert_same_store(store, precompute_local(final, model, str(tmp_path / "scratch")), final.ids, 2)


def test_the_refreshed_version_is_checked_without_its_checked_base_again(graph, tmp_path, monkeypatch):
    """The new version lies on the old one's segments, which the refresh checked when it opened the
    old version: its verify checks the new version's own files and trusts exactly those segments
    (a refresh's verify used to re-read every byte of the whole chain)."""
    from sparkgnn.pe import store as store_module

    model = model_of("sage", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root)
    old_segments = store_module._segment_folders(old)
    seen = []
    real = store_module.damaged_parts

    def spy(base, manifest, verify="checksums", trusted=frozenset()):
        seen.append((base, frozenset(trusted)))
        return real(base, manifest, verify, trusted)

    monkeypatch.setattr(store_module, "damaged_parts", spy)
    refreshed, _ = refresh_local(graph, random_update(graph, seed=3), model, root)
    assert [b for b, _ in seen] == [old.base, refreshed.base]  # the old version opened, then the new one
    assert seen[0][1] == frozenset() and seen[1][1] == old_segments and old_segments


def test_a_refreshed_version_keeps_the_workload_metrics_recomputed_on_the_updated_graph(graph, tmp_path):
    """The degrees, PSGS and FAP tables a serving deployment routes and caches by are recomputed
    on the updated graph with the old version's options, so a refreshed version keeps them."""
    from sparkgnn.graph.updates import apply
    from sparkgnn.pe.local import local_metrics

    model = model_of("gcn", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root, metrics=True, fanouts=(5, 3), hops=2)
    update = random_update(graph, seed=3)
    refreshed, _ = refresh_local(graph, update, model, root)
    assert refreshed.metric_tables == old.metric_tables == ["degrees", "fap", "psgs"]
    assert refreshed.manifest["metrics"]["summary"]["fanouts"] == [5, 3]
    want = local_metrics(apply(update, graph).graph, [5, 3], 2)
    for name, column in (("fap", "fap"), ("psgs", "psgs"), ("degrees", "out_degree")):
        got = refreshed.metrics_table(name)
        order, expected = np.argsort(got.column("id").to_numpy()), np.argsort(want[name].column("id").to_numpy())
        np.testing.assert_array_equal(got.column("id").to_numpy()[order], want[name].column("id").to_numpy()[expected])
        np.testing.assert_allclose(
            got.column(column).to_numpy()[order], want[name].column(column).to_numpy()[expected], rtol=1e-12
        )


def test_a_refresh_killed_after_layer_one_resumes_to_the_same_store(graph, tmp_path, monkeypatch):
    model = model_of("sage", graph.feature_dim, 3)
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    update = random_update(graph, seed=11)
    real = PEWriter.commit_layer_arrays

    def crash_on_layer_two(self, l, *args, **kwargs):
        if l == 2:
            raise KeyboardInterrupt("killed")
        return real(self, l, *args, **kwargs)

    monkeypatch.setattr(PEWriter, "commit_layer_arrays", crash_on_layer_two)
    with pytest.raises(KeyboardInterrupt):
        refresh_local(graph, update, model, root)
    monkeypatch.setattr(PEWriter, "commit_layer_arrays", real)
    resumed, _ = refresh_local(graph, update, model, root)
    other = str(tmp_path / "other")
    precompute_local(graph, model, other)
    uninterrupted, _ = refresh_local(graph, update, model, other)
    from sparkgnn.graph.updates import apply

    new_ids = apply(update, graph).graph.ids
    for l in (1, 2, 3):
        a, sa = resumed.lookup(new_ids, l, states=True)
        b, sb = uninterrupted.lookup(new_ids, l, states=True)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(sa, sb)


def test_refusals_name_what_is_wrong(graph, tmp_path):
    model = model_of("gcn", graph.feature_dim, 2)
    root = str(tmp_path / "nostates")
    precompute_local(graph, model, root, states=False)
    with pytest.raises(RefreshError, match="without aggregation states"):
        refresh_local(graph, random_update(graph, seed=1), model, root)
    other = model_of("sage", graph.feature_dim, 2)
    with pytest.raises(StalePEStore, match="model"):
        refresh_local(graph, random_update(graph, seed=1), other, root)


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_a_cold_refresh_reads_only_the_rows_it_needs(graph, tmp_path, monkeypatch, kind):
    """From row files (pe/rowfile.py), never a layer whole: per layer at most the stored states
    of its targets and the stored h of the next layer's targets and message sources."""
    model = model_of(kind, graph.feature_dim, 2)
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    ids = graph.ids
    update = GraphUpdate(
        edge_insert_src=ids[[3]],
        edge_insert_dst=ids[[17]],
        edge_insert_weight=np.ones(1, np.float32),
        feature_update_ids=ids[[40]],
        feature_update_x=np.ones((1, graph.feature_dim), np.float32),
    )

    def whole(self, layer):
        raise AssertionError(f"layer {layer} read whole")

    monkeypatch.setattr(PEStore, "table", whole)
    _, report = refresh_local(graph, update, model, root, verify="sizes")
    monkeypatch.undo()
    one, two = report.layers
    assert [one["read"], two["read"]] == ["rows", "rows"]
    assert 0 < one["rows_read"] <= one["targets"] + two["targets"] + two["new_messages"] + two["old_messages"]
    assert 0 < two["rows_read"] <= two["targets"]
    assert one["rows_read"] + two["rows_read"] < graph.num_nodes // 2  # reading both whole: 2 N rows
    from sparkgnn.graph.updates import apply

    new_graph = apply(update, graph).graph
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(PEStore.open(root, model=model, graph=new_graph), scratch, new_graph.ids, 2)


class _EdgeFeatureNet(torch.nn.Module):
    """GINE (sum: delta refreshes) then GAT with edge_dim (softmax, loops of mean attributes)."""

    def __init__(self, f: int, d: int):
        import torch_geometric.nn as gnn

        super().__init__()
        self.conv1 = gnn.GINEConv(torch.nn.Sequential(torch.nn.Linear(f, 8), torch.nn.ReLU()), edge_dim=d)
        self.conv2 = gnn.GATConv(8, 4, heads=2, edge_dim=d)

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr)


def test_edge_inserts_with_attributes_refresh_gine_and_gat_edge_dim_exactly(graph, tmp_path):
    import dataclasses

    rng = np.random.default_rng(7)
    data = dataclasses.replace(graph, edge_attr=rng.normal(size=(graph.num_edges, 3)).astype(np.float32))
    update = random_update(graph, seed=5)
    update = dataclasses.replace(
        update, edge_insert_attr=rng.normal(size=(len(update.edge_insert_src), 3)).astype(np.float32)
    )
    torch.manual_seed(3)
    model = Model.from_pyg(_EdgeFeatureNet(graph.feature_dim, 3).eval())
    root = str(tmp_path / "store")
    precompute_local(data, model, root)
    refreshed, report = refresh_local(data, update, model, root, out_graph=str(tmp_path / "graph2"))
    from sparkgnn.graph.reader import read_graph_dir

    new_graph = read_graph_dir(str(tmp_path / "graph2"))
    assert new_graph.edge_attr_dim == 3
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(refreshed, scratch, new_graph.ids, 2)
    assert report.layers[0]["delta"] > 0 and report.layers[1]["delta"] == 0
    with pytest.raises(ValueError, match=r"read edge features \(edge_attr, width 3\) but graph .* has none"):
        refresh_local(graph, update, model, str(tmp_path / "other"))


def cheb_update(graph, seed: int) -> GraphUpdate:
    """random_update plus changes to the vertices with the most out-edges (ChebConv normalises by
    the out-degree, so each changes the coefficient of every out-edge of its source): an edge of
    the top source deleted, an edge from the second inserted, a self loop inserted on the top
    source and another vertex's deleted, and a vertex with many out-edges deleted."""
    import dataclasses

    base = random_update(graph, seed=seed)
    ids, src, dst = graph.ids, graph.edge_src, graph.edge_dst
    touched = np.concatenate(
        [base.edge_insert_src, base.edge_insert_dst, base.edge_delete_src, base.edge_delete_dst, base.vertex_delete_ids]
    )
    free = ~np.isin(ids, touched)
    out_degree = np.bincount(src[src != dst], minlength=graph.num_nodes)
    top = np.argsort(-out_degree, kind="stable")
    first, second, gone = (int(r) for r in top[free[top]][:3])
    edge = np.flatnonzero((src == first) & (dst != first) & free[dst] & (dst != gone))[0]
    loops = np.flatnonzero((src == dst) & free[src] & (src != first) & (src != second) & (src != gone))
    deletes = np.array([edge, loops[0]])
    target = int(np.flatnonzero(free & (np.arange(graph.num_nodes) != gone))[-1])
    ins_src, ins_dst = ids[[second, first]], ids[[target, first]]
    return dataclasses.replace(
        base,
        edge_insert_src=np.concatenate([base.edge_insert_src, ins_src]),
        edge_insert_dst=np.concatenate([base.edge_insert_dst, ins_dst]),
        edge_insert_weight=np.concatenate([base.edge_insert_weight, np.float32([1.5, 0.75])]),
        edge_delete_src=np.concatenate([base.edge_delete_src, ids[src[deletes]]]),
        edge_delete_dst=np.concatenate([base.edge_delete_dst, ids[dst[deletes]]]),
        edge_delete_weight=np.concatenate([base.edge_delete_weight, graph.weight[deletes]]),
        vertex_delete_ids=np.concatenate([base.vertex_delete_ids, ids[[gone]]]),
    )


@pytest.mark.parametrize("kind", ["chebconv", "chebconv_rw"])
def test_chebconv_refresh_follows_the_out_degrees_an_update_changes(graph, tmp_path, kind):
    """ChebConv reads its sources' OUT-degree: an edge change at u rescales every out-edge of u, so
    u's out-neighbours (and u, whose own factor 'sym' reads) are recomputed, and the refreshed store
    equals a precompute of the updated graph; layer 1 still touches only part of the graph."""
    model = model_of(kind, graph.feature_dim, 2)  # 'sym' with K=3, 'rw' with K=2
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    update = cheb_update(graph, seed=len(kind))
    refreshed, report = refresh_local(graph, update, model, root, out_graph=str(tmp_path / "graph2"))
    from sparkgnn.graph.reader import read_graph_dir

    new_graph = read_graph_dir(str(tmp_path / "graph2"))
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(refreshed, scratch, new_graph.ids, model.num_rounds)
    assert report.layers[0]["targets"] < new_graph.num_nodes and report.layers[0]["delta"] > 0
