"""The Python side of sparkgnn on an S3 endpoint (moto's server, tests/s3_server.py): the files
helpers, the PE store's manifest commit (stray attempts ignored, a second writer detected), the
model store, graph.json and the output swap, all through pyarrow.fs on s3:// URIs. No Spark:
Spark's own s3a:// reads and writes need the hadoop-aws connector, which pyspark does not ship."""

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from s3_server import s3_server

from sparkgnn import files
from sparkgnn.errors import DamagedPEStore, ModelLoadError, OutputError, PEStoreConflict, StalePEStore
from sparkgnn.graph import GraphData


@pytest.fixture(scope="module")
def s3():
    with s3_server() as server:
        server.bucket("work")
        yield server


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(3)
    ids = np.array([10, 3, 77, 5, 1000, 42, 8, 61, 2, 99], dtype=np.int64)
    pairs = rng.integers(0, 9, size=(24, 2))
    x = rng.standard_normal((len(ids), 4)).astype(np.float32)
    return GraphData.from_edge_ids(ids, x, ids[pairs[:, 0]], ids[pairs[:, 1]], name="s3-small")


@pytest.fixture(scope="module")
def model():
    import torch
    import torch_geometric.nn as gnn

    from sparkgnn.models import Model

    torch.manual_seed(0)
    return Model.from_pyg(gnn.GraphSAGE(4, 6, 2, out_channels=3).eval(), output="logits")


def _layer_arrays(graph, width, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((graph.num_nodes, width)).astype(np.float32)


def _write_store(root, graph, model):
    """Both layers committed with commit_layer_arrays (pyarrow, no Spark); returns the writer."""
    from sparkgnn.pe import PEWriter

    writer = PEWriter(root, graph, model, with_states=False)
    for l, width in enumerate(writer.model.dims, start=1):
        writer.commit_layer_arrays(l, graph.ids, _layer_arrays(graph, width, l))
    writer.finish()
    return writer


# -- files helpers -------------------------------------------------------------------------------
def test_bytes_and_json_helpers(s3):
    path = "s3://work/helpers/a/doc.json"
    files.write_json_atomic(path, {"k": 1})
    files.write_json_atomic(path, {"k": 2})  # replaced whole
    assert files.read_json(path) == {"k": 2}
    assert files.kind(path) == "file" and files.kind("s3://work/helpers/a") == "dir"
    assert files.entries("s3://work/helpers") == {"a": "dir"}
    assert files.entries("s3://work/helpers/a") == {"doc.json": "file"}
    assert files.entries("s3://work/nowhere") == {}
    with pytest.raises(FileNotFoundError):
        files.read_bytes("s3://work/helpers/missing.bin")
    files.write_bytes_atomic("s3://work/helpers/b.bin", b"\x00\x01")
    assert [f.rel for f in files.data_files("s3://work/helpers")] == ["a/doc.json", "b.bin"]
    files.delete("s3://work/helpers/a")
    files.delete("s3://work/helpers/a")  # absent: no error
    assert files.entries("s3://work/helpers") == {"b.bin": "file"}
    assert files.is_object_store("s3://work/x") and files.is_object_store("s3a://work/x")
    assert not files.is_object_store("/tmp/x") and not files.is_object_store("hdfs://nn/x")
    assert files.spark_uri("s3://work/x") == "s3a://work/x"  # Spark's Hadoop S3 connector
    assert files.spark_uri("hdfs://nn:8020/x") == "hdfs://nn:8020/x"


def test_plain_uris_configured_from_the_environment(s3, monkeypatch):
    """Without a registered filesystem, s3:// (and Hadoop's s3a://) resolve through pyarrow's
    from_uri, which reads AWS_ENDPOINT_URL and the credentials from the environment."""
    files.write_bytes_atomic("s3://work/env/x.bin", b"abc")
    files.unregister_filesystem("s3://work")
    try:
        for key, value in s3.env.items():
            monkeypatch.setenv(key, value)
        assert files.read_bytes("s3://work/env/x.bin") == b"abc"
        assert files.read_bytes("s3a://work/env/x.bin") == b"abc"
        assert files.filesystem("s3://work/env")[1] == "work/env"
        assert files.filesystem("s3://work/env")[0] is files.filesystem("s3://work/other")[0]  # reused
    finally:
        s3.register("work")


# -- PE store ------------------------------------------------------------------------------------
def test_pe_store_round_trip_on_s3(s3, graph, model, tmp_path):
    from sparkgnn.pe import PEStore, layout

    writer = _write_store("s3://work/pe-round", graph, model)
    assert writer.base.startswith("s3://work/pe-round/")
    store = PEStore.open("s3://work/pe-round", model=model, graph=graph)
    assert store.layers == [1, 2]
    manifest = store.manifest
    for l, width in ((1, 6), (2, 3)):
        rel = manifest["paths"][f"layer={l}"]
        assert rel.startswith(f"layer={l}/attempt=")
        assert store.layer_path(l) == f"{store.base}/{rel}"
        order = graph.ids[[3, 0, 7]]
        np.testing.assert_array_equal(store.lookup(order, l)[0], _layer_arrays(graph, width, l)[[3, 0, 7]])
    assert files.kind(files.join(store.base, layout.MANIFEST_FILE)) == "file"
    assert store.size_report()["pe_bytes"]["1"] > 0
    # the same store written locally holds the same rows
    _write_store(str(tmp_path / "local"), graph, model)
    local = PEStore.open(str(tmp_path / "local"), model=model, graph=graph)
    np.testing.assert_array_equal(local.lookup(graph.ids, 2)[0], store.lookup(graph.ids, 2)[0])
    assert PEStore.open("s3://work/pe-round", model=model, graph=graph, verify="sizes").layers == [1, 2]
    with pytest.raises(StalePEStore, match="model fingerprint differs"):
        import torch_geometric.nn as gnn

        from sparkgnn.models import Model

        PEStore.open("s3://work/pe-round", model=Model.from_pyg(gnn.GCN(4, 5, 2).eval()), graph=graph)


def test_stray_files_of_a_failed_attempt_are_ignored_then_cleaned(s3, graph, model, monkeypatch):
    from sparkgnn.pe import PEStore, PEWriter

    root = "s3://work/pe-stray"
    writer = _write_store(root, graph, model)
    before = PEStore.open(root, model=model, graph=graph).lookup(graph.ids, 1)[0]
    # a crashed attempt of layer 1: garbage in an attempt folder the manifest never named
    stray = f"{writer.base}/layer=1/attempt=deadbeef/part-00000.parquet"
    files.write_bytes_atomic(stray, b"half a parquet file")
    store = PEStore.open(root, model=model, graph=graph)
    np.testing.assert_array_equal(store.lookup(graph.ids, 1)[0], before)

    # a writer that dies writing its data file (the upload still completes: half a file on S3)
    crashing = PEWriter(root, graph, model, with_states=False)

    def half_write(table, sink, **_options):
        sink.write(b"half a parquet file")
        raise RuntimeError("executor lost")

    monkeypatch.setattr(pq, "write_table", half_write)
    with pytest.raises(RuntimeError, match="executor lost"):
        crashing.commit_layer_arrays(1, graph.ids, _layer_arrays(graph, 6, 7))
    monkeypatch.undo()
    crashing = PEWriter(root, graph, model, with_states=False)  # a rerun (takes the lease over)
    store = PEStore.open(root, model=model, graph=graph)
    assert store.manifest["paths"]["layer=1"] == writer.manifest["paths"]["layer=1"]
    np.testing.assert_array_equal(store.lookup(graph.ids, 1)[0], before)
    assert len(files.entries(f"{writer.base}/layer=1")) == 3  # committed + two failed attempts

    # the rerun's own commit of layer 1 removes every other attempt
    fresh = _layer_arrays(graph, 6, 99)
    crashing.commit_layer_arrays(1, graph.ids, fresh)
    committed = crashing.manifest["paths"]["layer=1"].rpartition("/")[2]
    assert list(files.entries(f"{writer.base}/layer=1")) == [committed]
    np.testing.assert_array_equal(PEStore.open(root, model=model, graph=graph).lookup(graph.ids, 1)[0], fresh)


def test_a_file_added_to_a_committed_attempt_is_refused(s3, graph, model):
    from sparkgnn.pe import PEStore

    root = "s3://work/pe-added"
    _write_store(root, graph, model)
    store = PEStore.open(root, model=model, graph=graph)
    files.write_bytes_atomic(files.join(store.layer_path(2), "part-99999.parquet"), b"x")
    with pytest.raises(DamagedPEStore, match="layer=2: 1 file\\(s\\) not written by the commit: part-99999"):
        PEStore.open(root, model=model, graph=graph)
    files.delete(files.join(store.layer_path(2), "part-00000.parquet"))
    with pytest.raises(DamagedPEStore, match="layer=2: 1 file\\(s\\) missing"):
        PEStore.open(root, model=model, graph=graph)


def test_a_second_writer_is_detected(s3, graph, model, caplog):
    from sparkgnn.pe import PEStore, PEWriter, layout

    root = "s3://work/pe-two"
    first = PEWriter(root, graph, model, with_states=False)
    first.commit_layer_arrays(1, graph.ids, _layer_arrays(graph, 6, 1))
    caplog.set_level(logging.INFO, logger="sparkgnn")
    second = PEWriter(root, graph, model, with_states=False)
    assert any("did not finish" in line and "takes it over" in line for line in caplog.messages)
    with pytest.raises(PEStoreConflict, match="another writer took it over.*stops before writing layer=2"):
        first.commit_layer_arrays(2, graph.ids, _layer_arrays(graph, 3, 2))
    second.commit_layer_arrays(2, graph.ids, _layer_arrays(graph, 3, 2))
    second.finish()
    assert PEStore.open(root, model=model, graph=graph).layers == [1, 2]

    # a writer that ignores leases commits a manifest meanwhile: the next commit is refused
    third = PEWriter(root, graph, model, with_states=False, force=True)
    foreign = dict(layout.read_manifest(third.base), commit="someone-else")
    layout.write_manifest(third.base, foreign)
    with pytest.raises(PEStoreConflict, match="manifest was committed by someone else"):
        third.commit_layer_arrays(1, graph.ids, _layer_arrays(graph, 6, 1))


# -- model store, graph.json, outputs --------------------------------------------------------------
def test_model_store_register_and_load(s3, model):
    from sparkgnn.dl.model_store import ModelRegistry, model_dir, register
    from sparkgnn.models import Model

    store = "s3://work/models"
    fingerprint = register(model, store)
    assert register(model, store) == fingerprint  # idempotent: committed entries are not rewritten
    entry = files.entries(model_dir(store, fingerprint))
    weights = [name for name in entry if name.startswith("weights-")]
    assert sorted(entry) == sorted(["model.json", *weights]) and len(weights) == 1
    loaded = ModelRegistry(store).get(fingerprint)
    assert loaded.fingerprint() == fingerprint
    with pytest.raises(ModelLoadError, match="unknown model fingerprint"):
        ModelRegistry(store).get("0" * 64)

    model.save("s3://work/saved/m")
    assert Model.load("s3://work/saved/m").fingerprint() == fingerprint
    assert Model.load("s3://work/saved/m/model.json").fingerprint() == fingerprint
    files.write_bytes_atomic("s3://work/saved/m/weights.pt", b"tampered")
    with pytest.raises(ModelLoadError, match="checksum"):
        Model.load("s3://work/saved/m")
    with pytest.raises(ModelLoadError, match="missing"):
        Model.load("s3://work/saved/nowhere")


def test_graph_meta_on_s3(s3):
    from sparkgnn.graph import layout

    assert layout.read_meta("s3://work/graph") is None
    layout.write_meta("s3://work/graph", {"name": "g", "num_vertices": 3})
    assert layout.read_meta("s3://work/graph") == {"format": layout.FORMAT, "name": "g", "num_vertices": 3}


def test_output_check_and_swap_on_s3(s3):
    from sparkgnn.outputs import check_output, staging_path, swap_into_place

    out = "s3://work/out/result"
    check_output(out, {"--graph": "s3://work/graph"})
    with pytest.raises(OutputError, match="is inside the --graph"):
        check_output("s3://work/graph/out", {"--graph": "s3://work/graph"})
    with pytest.raises(OutputError, match="not the bucket itself"):
        check_output("s3://work", {})

    def stage(rows):
        staged = staging_path(out)
        fs, inner = files.filesystem(staged)
        with fs.open_output_stream(f"{inner}/part-0.parquet") as sink:
            pq.write_table(pa.table({"id": rows}), sink)
        files.write_bytes_atomic(f"{staged}/_SUCCESS", b"")
        return staged

    swap_into_place(stage([1, 2]), out)
    with pytest.raises(OutputError, match="already holds"):
        check_output(out, {})
    check_output(out, {}, overwrite=True)
    swap_into_place(stage([3]), out)
    fs, inner = files.filesystem(out)
    assert pq.read_table(f"{inner}/part-0.parquet", filesystem=fs).column("id").to_pylist() == [3]
    assert sorted(files.entries("s3://work/out")) == ["result"]  # staging and retired copies gone
