"""spark_jobs/refresh_pe.py's outputs go through the batch job's guard (`--engine local`, no
Spark): --out-graph and --report may not be, contain or lie inside an input (the graph, its
parent folder, the store and its root, the model's directory, the update file), --report never
writes over an input file, an existing output is replaced only with --overwrite; every refusal is
one line with exit 2, checked before any work, and nothing is lost (the model still loads, the
update file still reads, the store has no new version)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "serving"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "spark_jobs"))
import refresh_pe  # noqa: E402
from serving_testkit import pyg_model, skewed_graph  # noqa: E402

from sparkgnn.graph import write_graph_dir  # noqa: E402
from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.graph.updates import UPDATE_SCHEMA, GraphUpdate  # noqa: E402
from sparkgnn.models import Model  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("refresh_cli")
    G = skewed_graph()
    model = Model.from_pyg(pyg_model("sage", G.feature_dim, 2, seed=3))
    model.save(str(d / "models" / "sage"))
    write_graph_dir(G, str(d / "data" / "g"))
    precompute_local(G, model, str(d / "store"))
    src, dst = G.ids[[1, 2, 3]], G.ids[[4, 5, 6]]
    rows = {
        "kind": ["edge_insert"] * 3,
        "src": src.tolist(),
        "dst": dst.tolist(),
        "weight": [1.0] * 3,
        "node": [None] * 3,
        "x": [None] * 3,
    }
    updates = str(d / "updates.parquet")
    pq.write_table(pa.table({f.name: pa.array(rows[f.name], f.type) for f in UPDATE_SCHEMA}), updates)
    return {
        "d": d,
        "graph": str(d / "data" / "g"),
        "model": str(d / "models" / "sage"),
        "store": str(d / "store"),
        "updates": updates,
    }


def run(inputs, *extra) -> list[str]:
    return [
        "--engine",
        "local",
        "--graph",
        inputs["graph"],
        "--model",
        inputs["model"],
        "--store",
        inputs["store"],
        "--updates",
        inputs["updates"],
        *extra,
    ]


def store_versions(inputs) -> list[str]:
    return sorted(e for e in os.listdir(inputs["store"]) if not e.startswith("."))


def nothing_lost(inputs, versions: list[str]) -> None:
    Model.load(inputs["model"])
    GraphUpdate.read(inputs["updates"])
    read_graph_dir(inputs["graph"])
    assert store_versions(inputs) == versions  # refused before any work: no version committed


@pytest.mark.parametrize(
    "where, how, name",
    [
        ("data/g/out", "is inside", "--graph"),
        ("data", "contains", "--graph"),  # the graph's parent folder
        ("data/g", "is", "--graph"),
        ("store", "is", "--store"),
        ("store/new", "is inside", "--store"),
        ("models/sage", "is", "--model"),  # would write graph.json beside model.json
        ("models", "contains", "--model"),
        ("updates.parquet", "is", "--updates"),
    ],
)
def test_an_out_graph_overlapping_an_input_is_refused_before_any_work(inputs, capsys, where, how, name):
    versions = store_versions(inputs)
    out = str(inputs["d"] / where)
    assert refresh_pe.main(run(inputs, "--out-graph", out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("refresh_pe: error: --out-graph") and f"{how} the {name}" in err and "\n" not in err
    nothing_lost(inputs, versions)
    assert not os.path.exists(os.path.join(inputs["model"], "graph.json"))


@pytest.mark.parametrize(
    "target, name",
    [
        ("models/sage/model.json", "--model"),
        ("updates.parquet", "--updates"),
        ("data/g/graph.json", "--graph"),
        ("store/report.json", "--store"),
    ],
)
def test_a_report_never_writes_over_an_input_even_with_overwrite(inputs, capsys, target, name):
    versions = store_versions(inputs)
    path = str(inputs["d"] / target)
    before = open(path, "rb").read() if os.path.isfile(path) else None
    for extra in ([], ["--overwrite"]):
        assert refresh_pe.main(run(inputs, "--report", path, *extra)) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("refresh_pe: error: --report") and f"the {name}" in err and "\n" not in err
    if before is not None:
        assert open(path, "rb").read() == before
    nothing_lost(inputs, versions)


def test_outputs_are_written_and_replaced_only_with_overwrite(inputs, capsys, tmp_path):
    out, report = str(tmp_path / "g2"), str(tmp_path / "report.json")
    (tmp_path / "report.json").write_text("keep me")
    assert refresh_pe.main(run(inputs, "--out-graph", out, "--report", report)) == 2
    err = capsys.readouterr().err.strip()
    assert "--report" in err and "pass --overwrite to replace it" in err
    assert (tmp_path / "report.json").read_text() == "keep me" and not os.path.exists(out)

    assert refresh_pe.main(run(inputs, "--out-graph", out, "--report", report, "--overwrite")) == 0
    assert "updated graph at" in capsys.readouterr().out
    written = json.loads((tmp_path / "report.json").read_text())
    G2 = read_graph_dir(out)
    assert written["graph_fingerprint"] and G2.num_edges == skewed_graph().num_edges + 3
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".")]  # no staging left behind

    assert refresh_pe.main(run(inputs, "--out-graph", out)) == 2  # now it holds a graph
    assert "already holds" in capsys.readouterr().err
    assert refresh_pe.main(run(inputs, "--out-graph", out, "--overwrite")) == 0
    np.testing.assert_array_equal(read_graph_dir(out).ids, G2.ids)


def test_out_graph_overwrite_refuses_a_folder_sparkgnn_did_not_write(inputs, capsys, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "photo.jpg").write_bytes(b"jpeg")
    assert refresh_pe.main(run(inputs, "--out-graph", str(mine), "--overwrite")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out-graph" in err and "will not delete it" in err
    assert os.listdir(mine) == ["photo.jpg"]


def test_a_report_that_is_a_directory_is_refused(inputs, capsys, tmp_path):
    (tmp_path / "reports").mkdir()
    assert refresh_pe.main(run(inputs, "--report", str(tmp_path / "reports"), "--overwrite")) == 2
    assert "is a directory" in capsys.readouterr().err


def test_an_update_naming_a_missing_vertex_is_named_and_exits_2(inputs, capsys, tmp_path):
    versions = store_versions(inputs)
    G = read_graph_dir(inputs["graph"])
    rows = {"kind": ["edge_insert"], "src": [int(G.ids[0])], "dst": [10**12], "weight": [1.0], "node": [None],
            "x": [None]}  # fmt: skip
    bad = str(tmp_path / "bad.parquet")
    pq.write_table(pa.table({f.name: pa.array(rows.get(f.name, [None]), f.type) for f in UPDATE_SCHEMA}), bad)
    argv = run(inputs)
    argv[argv.index("--updates") + 1] = bad
    assert refresh_pe.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("refresh_pe: error: update of graph 'skewed' failed validation") and str(10**12) in err
    nothing_lost(inputs, versions)
