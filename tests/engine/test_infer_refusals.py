"""Batch inference and precompute refuse what would lose data or answer wrongly, with one clear
line and exit code 2, and leave everything they were not told to touch as it was."""

import os
import shutil
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch_geometric.nn as gnn
from engine_helpers import pyg_reference, relative_error, spark_output

from sparkgnn import infer
from sparkgnn.graph import GraphData, write_graph_dir
from sparkgnn.models import Model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))
import batch_inference  # noqa: E402
import precompute_pe  # noqa: E402


def _snapshot(root) -> dict:
    return {
        os.path.relpath(os.path.join(d, f), root): os.path.getsize(os.path.join(d, f))
        for d, _dirs, files in os.walk(root)
        for f in files
    }


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A small graph directory and a 2-layer SAGE saved next to it."""
    root = tmp_path_factory.mktemp("refusals")
    rng = np.random.default_rng(5)
    data = GraphData(
        ids=np.arange(40) * 7 + 1,
        x=rng.normal(size=(40, 6)).astype(np.float32),
        edge_src=rng.integers(0, 40, 160),
        edge_dst=rng.integers(0, 40, 160),
        name="small",
    )
    graph = str(root / "graph")
    write_graph_dir(data, graph)
    torch.manual_seed(0)
    module = gnn.GraphSAGE(6, 8, 2, out_channels=3).eval()
    model = str(root / "model")
    Model.from_pyg(module).save(model)
    return root, graph, model, data, module


def _job(args, capsys):
    code = batch_inference.main(args)
    return code, capsys.readouterr().err.strip()


def test_out_onto_the_graph_is_refused_and_deletes_nothing(small, capsys):
    root, graph, model, _data, _module = small
    before = _snapshot(graph)
    code, err = _job(["--graph", graph, "--model", model, "--out", graph, "--overwrite"], capsys)
    assert code == 2 and err.startswith("batch_inference: error: --out") and "is the graph directory" in err
    assert len(err.splitlines()) == 1
    assert _snapshot(graph) == before
    code, err = _job(["--graph", graph, "--model", model, "--out", os.path.join(graph, "edges")], capsys)
    assert code == 2 and "is inside the graph directory" in err
    assert _snapshot(graph) == before


def test_out_home_or_a_users_folder_is_refused_even_with_overwrite(small, tmp_path, capsys, monkeypatch):
    _root, graph, model, _data, _module = small
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "letter.txt").write_text("mine")
    monkeypatch.setenv("HOME", str(home))  # `--out ~` as a shell expands it; nothing real at risk
    code, err = _job(["--graph", graph, "--model", model, "--out", os.path.expanduser("~"), "--overwrite"], capsys)
    assert code == 2 and "is the home directory" in err and len(err.splitlines()) == 1
    code, err = _job(["--graph", graph, "--model", model, "--out", str(home / "docs"), "--overwrite"], capsys)
    assert code == 2 and "_SPARKGNN_OUTPUT.json" in err and "will not delete it" in err
    assert _snapshot(home) == {os.path.join("docs", "letter.txt"): 4}


def test_earlier_result_is_kept_unless_overwrite(small, tmp_path, capsys):
    _root, graph, model, data, module = small
    out = str(tmp_path / "out")
    work = ["--work-dir", str(tmp_path / "w")]
    assert _job(["--graph", graph, "--model", model, "--out", out, *work], capsys)[0] == 0
    first = _snapshot(out)
    code, err = _job(["--graph", graph, "--model", model, "--out", out, *work], capsys)
    assert code == 2 and "already holds" in err and "--overwrite" in err
    assert _snapshot(out) == first
    assert _job(["--graph", graph, "--model", model, "--out", out, "--overwrite", *work], capsys)[0] == 0
    table = pq.read_table(out)
    assert table.num_rows == data.num_nodes
    assert [n for n in os.listdir(tmp_path) if "sparkgnn-" in n] == []  # no staging left behind


def test_unknown_and_empty_ids_are_refused(small, tmp_path, capsys):
    _root, graph, model, data, _module = small
    ids = tmp_path / "ids.txt"
    ids.write_text(f"{data.ids[0]}\n123456\n-5\n")
    out = str(tmp_path / "out")
    code, err = _job(["--graph", graph, "--model", model, "--out", out, "--ids", str(ids)], capsys)
    assert code == 2 and "2 requested ids are not vertex ids; first: -5, 123456" in err
    assert not os.path.exists(out)
    ids.write_text("# nothing here\n\n")
    code, err = _job(["--graph", graph, "--model", model, "--out", out, "--ids", str(ids)], capsys)
    assert code == 2 and "holds no ids" in err


def test_huge_partition_count_is_refused(small, tmp_path, capsys):
    _root, graph, model, _data, _module = small
    code, err = _job(
        ["--graph", graph, "--model", model, "--out", str(tmp_path / "o"), "--partitions", "100000"], capsys
    )
    assert code == 2 and "100000 partitions requested, over the cap of 1024" in err


def test_precompute_refuses_a_model_of_another_width(small, tmp_path, capsys):
    _root, graph, _model, _data, _module = small
    other = str(tmp_path / "wide")
    Model.from_pyg(gnn.GraphSAGE(9, 8, 2).eval()).save(other)
    code = precompute_pe.main(["--graph", graph, "--model", other, "--store", str(tmp_path / "store")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "the graph's features are 6 wide but the model expects 9" in err
    assert not os.path.exists(tmp_path / "store")


def test_bad_fanouts_are_a_usage_error(small, tmp_path, capsys):
    _root, graph, model, _data, _module = small
    with pytest.raises(SystemExit) as info:
        precompute_pe.main(["--graph", graph, "--model", model, "--store", str(tmp_path / "s"), "--fanouts", "a,b"])
    assert info.value.code == 2 and "argument --fanouts" in capsys.readouterr().err


def test_changed_graph_is_not_served_from_the_prepared_cache(spark, small, tmp_path):
    """Same work dir, same graph.json, new edges: the answer is the new graph's."""
    _root, graph, model, data, module = small
    path = str(tmp_path / "g")
    shutil.copytree(graph, path)
    work = str(tmp_path / "w")
    first = infer(spark, path, model, work_dir=work, partitions=2).frame
    assert relative_error(spark_output(first, data), pyg_reference(module, data)) < 1e-5
    rng = np.random.default_rng(99)
    new = GraphData(ids=data.ids, x=data.x, edge_src=rng.integers(0, 40, 90), edge_dst=rng.integers(0, 40, 90))
    shutil.rmtree(os.path.join(path, "edges"))
    os.makedirs(os.path.join(path, "edges"))
    pq.write_table(pa.table({"src": new.src_ids, "dst": new.dst_ids}), os.path.join(path, "edges", "p.parquet"))
    second = infer(spark, path, model, work_dir=work, partitions=2).frame
    assert relative_error(spark_output(second, new), pyg_reference(module, new)) < 1e-5


@pytest.fixture(scope="module")
def edgeless(tmp_path_factory):
    """A graph directory without edges and a work dir its layer-type cases share (the graph is
    validated and prepared by the first case; what each case checks is its layer type's answer)."""
    root = tmp_path_factory.mktemp("no-edges")
    rng = np.random.default_rng(1)
    data = GraphData(
        ids=np.arange(30) * 3,
        x=rng.normal(size=(30, 5)).astype(np.float32),
        edge_src=np.zeros(0, np.int64),
        edge_dst=np.zeros(0, np.int64),
        name="no-edges",
    )
    path = str(root / "g")
    write_graph_dir(data, path)
    return path, data, str(root / "w")


@pytest.mark.parametrize(
    "make",
    [
        lambda: gnn.GCN(5, 8, 2, out_channels=3),
        lambda: gnn.GraphSAGE(5, 8, 2, out_channels=3),
        lambda: gnn.GIN(5, 8, 2, out_channels=3),
        lambda: gnn.GAT(5, 8, 2, out_channels=3, heads=2),
    ],
    ids=["gcn", "sage", "gin", "gat"],
)
def test_graph_without_edges_equals_pyg(spark, edgeless, make):
    path, data, work = edgeless
    torch.manual_seed(0)
    module = make().eval()
    result = infer(spark, path, Model.from_pyg(module), partitions=2, work_dir=work).frame
    assert relative_error(spark_output(result, data), pyg_reference(module, data)) < 1e-5


def test_failed_final_write_keeps_the_earlier_result(spark, tmp_path):
    from sparkgnn.engine.executor import RunReport, finish
    from sparkgnn.engine.metrics import ShuffleMeter

    out = tmp_path / "out"
    out.mkdir()
    (out / "part-0.parquet").write_bytes(b"earlier result")

    def explode(batches):
        for _batch in batches:
            raise RuntimeError("task failed while writing")
        yield from ()

    failing = spark.range(4).mapInArrow(explode, "id long")
    with pytest.raises(Exception, match="task failed while writing"):
        finish(spark, failing, RunReport(), ShuffleMeter(spark), "final", str(out))
    assert os.listdir(out) == ["part-0.parquet"] and (out / "part-0.parquet").read_bytes() == b"earlier result"
    assert sorted(os.listdir(tmp_path)) == ["out"]
