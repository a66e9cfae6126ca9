"""PEWriter / PEStore: round trip, crash + resume, force, and stale-store refusals."""

import copy
import glob
import json
import os

import numpy as np
import pyarrow as pa
import pytest
import torch

from sparkgnn.errors import StalePEStore
from sparkgnn.graph import Graph, GraphData, write_graph_dir
from sparkgnn.pe import PEStore, PEWriter, UnknownIds
from sparkgnn.pe.identity import model_identity
from sparkgnn.pe.lookup import vectors

STATE_W = 5


def _layer(spark, ids, width, seed, states=True):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((len(ids), width)).astype(np.float32)
    s = rng.standard_normal((len(ids), STATE_W)).astype(np.float32)
    cols = {"id": pa.array(ids, pa.int64()), "h": pa.array(list(h), pa.list_(pa.float32()))}
    if states:
        cols["state"] = pa.array(list(s), pa.list_(pa.float32()))
    return spark.createDataFrame(pa.table(cols)), h, s


def _write_all(spark, root, graph, model, ids, layers=None, seed=0, **kw):
    w = PEWriter(root, graph, model, with_states=True, **kw)
    dims = model_identity(model).dims
    written = {}
    for l in layers or range(1, len(dims) + 1):
        df, h, s = _layer(spark, ids, dims[l - 1], seed + l)
        w.commit_layer(l, df, dims[l - 1], STATE_W)
        written[l] = (h, s)
    return w, written


def test_round_trip_lookup_frame_sizes(spark, spark_graph, graph_data, model, tmp_path):
    ids = graph_data.ids
    w, written = _write_all(spark, tmp_path, spark_graph, model, ids)
    w.commit_metrics(
        {
            "summary": {"psgs": {"mean": 2.0}},
            "degrees": spark.createDataFrame([(1, 2, 3)], "id long, in_degree long, out_degree long"),
        }
    )
    manifest = w.finish({"seconds": {"1": 0.1}})
    assert manifest["layers_complete"] == [1, 2, 3] and manifest["dims"] == [6, 6, 3]
    assert manifest["state_dims"] == [STATE_W] * 3 and manifest["with_states"] is True

    store = PEStore.open(tmp_path, model=model, graph=spark_graph)
    assert store.layers == [1, 2, 3]
    order = np.array([ids[3], ids[0], ids[7], ids[3]])
    pos = [3, 0, 7, 3]
    for l, (h, s) in written.items():
        got_h, got_s = store.lookup(order, l, states=True)
        np.testing.assert_array_equal(got_h, h[pos])
        np.testing.assert_array_equal(got_s, s[pos])
        assert store.lookup(order, l)[1] is None
    th, ts = store.lookup_torch(order, 2, states=True)
    assert th.dtype == torch.float32 and torch.equal(th, torch.from_numpy(written[2][0][pos]))

    with pytest.raises(UnknownIds, match=r"2 unknown id\(s\), e.g. \[123456, 123457\]"):
        store.lookup([ids[0], 123456, 123457], 1)
    with pytest.raises(ValueError, match="layer 4 not in this store"):
        store.lookup([ids[0]], 4)

    frame = store.frame(spark, 2)
    assert set(frame.columns) == {"id", "h", "state"} and frame.count() == len(ids)
    assert store.metrics_frame(spark, "degrees").count() == 1
    assert store.manifest["metrics"]["summary"]["psgs"]["mean"] == 2.0

    sizes = store.size_report()
    n = len(ids)
    assert sizes["pe_raw_bytes"] == {"1": n * 6 * 4, "2": n * 6 * 4, "3": n * 3 * 4}
    assert sizes["state_raw_bytes"]["1"] == n * STATE_W * 4
    assert all(sizes["pe_bytes"][k] > 0 and sizes["state_bytes"][k] > 0 for k in "123")
    assert sizes["omega_formula_bytes"] == (6 + 6) * 4 * n  # (L-1) x H x 4 x |V|
    assert sizes["graph_feature_bytes"] == n * 4 * 4
    assert store.manifest["sizes"]["seconds"] == {"1": 0.1}


def test_vectors_reads_fixed_size_and_plain_lists():
    flat = pa.array(np.arange(6, dtype=np.float32))
    fixed = pa.FixedSizeListArray.from_arrays(flat, 3)
    plain = pa.array([[0, 1, 2], [3, 4, 5]], pa.list_(pa.float32()))
    for col in (fixed, plain, pa.chunked_array([plain.slice(0, 1), plain.slice(1, 1)])):
        np.testing.assert_array_equal(vectors(col, 3, "t"), np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(ValueError, match="lengths"):
        vectors(pa.array([[0, 1], [2, 3, 4, 5]], pa.list_(pa.float32())), 3, "t")


def test_crash_resume_and_force(spark, spark_graph, graph_data, model, tmp_path):
    ids = graph_data.ids
    w, first = _write_all(spark, tmp_path, spark_graph, model, ids, layers=[1])
    # simulate a crash during layer 2: a half-written tmp dir, manifest still says [1]
    junk = os.path.join(w.base, "layer=2.tmp-deadbeef")
    os.makedirs(junk)
    open(os.path.join(junk, "part-0.parquet"), "wb").write(b"half")
    with pytest.raises(StalePEStore, match="layer 2 of 3 never committed; layer 3 of 3 never committed"):
        PEStore.open(tmp_path, model=model, graph=spark_graph)

    resumed = PEWriter(tmp_path, spark_graph, model, with_states=True)
    assert resumed.completed_layers() == [1] and resumed.next_layer() == 2
    _, later = _write_all(spark, tmp_path, spark_graph, model, ids, layers=[2, 3])
    assert not glob.glob(os.path.join(w.base, "*.tmp-*"))
    store = PEStore.open(tmp_path, model=model, graph=spark_graph)
    np.testing.assert_array_equal(store.lookup(ids, 1)[0], first[1][0])  # layer 1 untouched
    np.testing.assert_array_equal(store.lookup(ids, 3)[0], later[3][0])

    forced = PEWriter(tmp_path, spark_graph, model, with_states=True, force=True)
    assert forced.completed_layers() == [] and forced.next_layer() == 1
    _, again = _write_all(spark, tmp_path, spark_graph, model, ids, seed=100, force=True)
    store = PEStore.open(tmp_path, model=model, graph=spark_graph)
    np.testing.assert_array_equal(store.lookup(ids, 2)[0], again[2][0])
    with open(os.path.join(w.base, "manifest.json")) as fh:
        assert json.load(fh)["layers_complete"] == [1, 2, 3]


def test_writer_refuses_wrong_width_and_missing_states(spark, spark_graph, graph_data, model, tmp_path):
    w = PEWriter(tmp_path, spark_graph, model, with_states=True)
    df, _, _ = _layer(spark, graph_data.ids, 6, 0, states=False)
    with pytest.raises(ValueError, match="h width 5 != model's 6"):
        w.commit_layer(1, df, 5)
    with pytest.raises(ValueError, match="keeps states"):
        w.commit_layer(1, df, 6)
    with pytest.raises(ValueError, match="out of range"):
        w.commit_layer(4, df, 6)
    assert w.completed_layers() == []


def test_stale_store_names_what_differs(spark, spark_graph, graph_data, model, tmp_path):
    _write_all(spark, tmp_path, spark_graph, model, graph_data.ids)

    other = copy.deepcopy(model)
    with torch.no_grad():
        next(other.parameters()).view(-1)[0] += 1.0
    with pytest.raises(StalePEStore, match="model weights differ"):
        PEStore.open(tmp_path, model=other, graph=spark_graph)

    gd = graph_data
    changed = GraphData.from_edge_ids(gd.ids, gd.x + 1.0, gd.src_ids, gd.dst_ids, name="changed")
    with pytest.raises(StalePEStore, match="graph fingerprint differs"):
        PEStore.open(tmp_path, model=model, graph=Graph.from_graph_data(spark, changed))

    # the same checks from paths: a saved model and a graph directory (no Spark needed)
    model.save(tmp_path / "model")
    gdir = tmp_path / "graph"
    write_graph_dir(gd, str(gdir))
    store = PEStore.open(tmp_path, model=str(tmp_path / "model"), graph=str(gdir))
    assert store.layers == [1, 2, 3]

    # opening the <graph>/<model> directory directly still checks the manifest
    base = store.base
    with pytest.raises(StalePEStore, match="graph fingerprint differs: store .* vs graph"):
        PEStore.open(base, model=model, graph=Graph.from_graph_data(spark, changed))
    manifest = json.load(open(os.path.join(base, "manifest.json")))
    manifest["layers_complete"] = [1, 3]
    manifest["dims"] = [6, 7, 3]
    json.dump(manifest, open(os.path.join(base, "manifest.json"), "w"))
    with pytest.raises(StalePEStore, match=r"dims differ: store \[6, 7, 3\].*layer 2 of 3 never committed"):
        PEStore.open(tmp_path, model=model, graph=spark_graph)


def test_other_architecture_names_layer_count(spark, spark_graph, graph_data, model, tmp_path):
    import torch_geometric.nn as gnn

    from sparkgnn.models import Model

    _write_all(spark, tmp_path, spark_graph, model, graph_data.ids)
    two = Model.from_pyg(gnn.GraphSAGE(4, 6, 2, out_channels=3).eval())
    with pytest.raises(
        StalePEStore,
        match=r"model fingerprint differs.*\(2 layers, dims \[6, 3\]\).*"
        r"\(3 layers, dims \[6, 6, 3\]\)",
    ):
        PEStore.open(tmp_path, model=two, graph=spark_graph)
    base = PEWriter(tmp_path, spark_graph, model, with_states=True).base
    with pytest.raises(StalePEStore, match="layer count differs: store has 3 layers, model 2"):
        PEStore.open(base, model=two, graph=spark_graph)


def test_metrics_commit_as_the_driver_does(spark, spark_graph, graph_data, model, tmp_path):
    """compute_metrics -> commit_metrics as is; the manifest's summary equals numpy."""
    from pe_reference import dense, psgs_matrix

    from sparkgnn.pe.metrics import compute_metrics

    w, _ = _write_all(spark, tmp_path, spark_graph, model, graph_data.ids)
    assert not w.has_metrics()
    w.commit_metrics(compute_metrics(spark_graph, [2, 2], 2))
    w.finish()
    assert PEWriter(tmp_path, spark_graph, model, with_states=True).has_metrics()
    store = PEStore.open(tmp_path, model=model, graph=spark_graph)
    assert store.manifest["metric_tables"] == ["degrees", "fap", "psgs"]
    summary = store.manifest["metrics"]["summary"]
    assert summary["hops"] == 2 and summary["fanouts"] == [2, 2]
    ids, ind, _, a = dense(graph_data)
    assert summary["num_vertices"] == len(ids) and summary["in_degree"]["max"] == int(ind.max())
    q = psgs_matrix(a, ind, [2, 2])
    assert summary["psgs"]["mean"] == pytest.approx(q.mean())
    assert summary["psgs"]["max"] == pytest.approx(q.max())
    p = sum(np.linalg.matrix_power(a.T, k) @ np.full(len(ids), 1 / len(ids)) for k in range(3))
    top = summary["fap"]["top_mass"]["top_0.1"]  # ceil(0.1 x 10) = 1 node
    assert top["nodes"] == 1 and top["fap_share"] == pytest.approx(p.max() / p.sum())
    assert store.metrics_frame(spark, "psgs").count() == len(graph_data.ids)
    assert w.layer_frame(spark, 2).count() == len(graph_data.ids)


def test_pe_modules_import_no_pyspark_at_top():
    import pathlib
    import re

    pattern = re.compile(r"^(import|from)\s+pyspark\b", re.M)
    root = pathlib.Path(__file__).resolve().parents[2] / "python" / "sparkgnn" / "pe"
    assert [p.name for p in root.glob("*.py") if pattern.search(p.read_text())] == []


def test_frame_of_a_layer_committed_as_a_delta_merges_its_segments(spark, graph_data, model, tmp_path, monkeypatch):
    """Spark reads a refreshed layer (delta over the previous version) as the same rows as the
    pyarrow reader: replaced rows once, deleted vertices gone, inserted ones present."""
    from sparkgnn.graph.updates import GraphUpdate, apply
    from sparkgnn.pe import layout, versions
    from sparkgnn.pe.local import precompute_local
    from sparkgnn.pe.refresh import refresh_local

    monkeypatch.setattr(versions, "COMPACT_FRACTION", 2.0)  # a 10-vertex graph: keep every layer a delta
    precompute_local(graph_data, model, tmp_path)
    update = GraphUpdate(
        edge_insert_src=[10, 500],
        edge_insert_dst=[5, 10],
        vertex_insert_ids=[500],
        vertex_insert_x=np.ones((1, graph_data.feature_dim), np.float32),
        vertex_delete_ids=[99],
    )
    store, _ = refresh_local(graph_data, update, model, tmp_path)
    assert PEStore.open(tmp_path, model=model, graph=apply(update, graph_data).graph).base == store.base
    for l in store.layers:
        assert versions.bases(store.manifest, layout.layer_key(l))
        rows = {r["id"]: r["h"] for r in store.frame(spark, l).collect()}
        want = versions.read_layer(store.base, l, store.manifest)
        assert sorted(rows) == sorted(want.column("id").to_pylist()) and 99 not in rows and 500 in rows
        for i, h in zip(want.column("id").to_pylist(), want.column("h").to_pylist(), strict=True):
            np.testing.assert_array_equal(np.asarray(rows[i], np.float32), np.asarray(h, np.float32))


def test_one_commit_writes_the_manifest_once_at_finish(graph_data, model, tmp_path, monkeypatch):
    from sparkgnn.pe import layout

    dims = model_identity(model).dims
    ids = graph_data.ids
    rng = np.random.default_rng(4)
    saved = []
    real_write = layout.write_manifest
    monkeypatch.setattr(
        layout, "write_manifest", lambda base, m: saved.append(sorted(m["layers_complete"])) or real_write(base, m)
    )
    w = PEWriter(tmp_path, graph_data, model, with_states=True, one_commit=True)
    values = {}
    for l in range(1, len(dims) + 1):
        h = rng.standard_normal((len(ids), dims[l - 1])).astype(np.float32)
        s = rng.standard_normal((len(ids), STATE_W)).astype(np.float32)
        w.commit_layer_arrays(l, ids, h, s)
        values[l] = h
        assert layout.read_manifest(w.base) is None  # nothing committed before finish
    w.finish()
    assert saved == [list(range(1, len(dims) + 1))]  # one manifest write, every layer in it
    store = PEStore.open(tmp_path, model=model, graph=graph_data)
    for l, h in values.items():
        assert np.array_equal(store.lookup(ids, l)[0], h)


def test_layers_written_by_tasks_commit_and_a_missing_part_is_refused(tmp_path, graph_data, model):
    """The Spark precompute's path without Spark: each 'task' writes its partition's rows into the
    staged attempt (step_outputs.write_pe_part), commit_staged_layer records and commits them; a
    partition's file missing (rows != vertices) is refused and the layer stays uncommitted."""
    from sparkgnn.arrowvec import to_list
    from sparkgnn.engine.step_outputs import write_pe_part

    root = str(tmp_path / "store")
    writer = PEWriter(root, graph_data, model, with_states=True)
    dims = model_identity(model).dims
    rng = np.random.default_rng(5)
    ids = np.asarray(graph_data.ids, dtype=np.int64)
    halves = np.array_split(np.arange(len(ids))[::-1], 2)  # unsorted ids: the part sorts them
    written = {}
    for l, width in enumerate(dims, start=1):
        h = rng.standard_normal((len(ids), width)).astype(np.float32)
        s = rng.standard_normal((len(ids), STATE_W)).astype(np.float32)
        folder = writer.stage_layer(l)
        for part, rows in enumerate(halves):
            result = {"own": pa.table({"h": to_list(h[rows])}), "state": pa.table({"s": to_list(s[rows])})}
            assert write_pe_part(folder, ids[rows], result, part) == len(rows)
        writer.commit_staged_layer(l, width, STATE_W)
        written[l] = (h, s)
    folder = writer.stage_layer(1)  # a recompute of layer 1 that lost its second partition's file
    result = {
        "own": pa.table({"h": to_list(written[1][0][halves[0]])}),
        "state": pa.table({"s": to_list(written[1][1][halves[0]])}),
    }
    write_pe_part(folder, ids[halves[0]], result, 0)
    with pytest.raises(ValueError, match=f"wrote {len(halves[0])} rows, the graph has {len(ids)} vertices"):
        writer.commit_staged_layer(1, dims[0], STATE_W)
    with pytest.raises(ValueError, match="was not staged"):
        writer.commit_staged_layer(2, dims[1], STATE_W)
    writer.finish()
    store = PEStore.open(root, model=model, graph=graph_data)
    for l, (h, s) in written.items():
        got_h, got_s = store.lookup(ids, l, states=True)
        np.testing.assert_array_equal(got_h, h)
        np.testing.assert_array_equal(got_s, s)
