"""spark_jobs/refresh_pe.py's outputs go through the batch job's guard (`--engine local`, no
Spark): --out-graph and --report may not be, contain or lie inside an input (the graph, its
parent folder, the store and its root, the model's directory, the update file), --report never
writes over an input file, an existing output is replaced only with --overwrite; every refusal is
one line with exit 2, checked before any work, and nothing is lost (the model still loads, the
update file still reads, the store has no new version).

A typed graph (--engine local): the command's store equals refresh_typed_local's and a typed
precompute of the updated graph, the updated typed graph lands at --out-graph under the same
output rules; an unknown relation, a model of other metadata, a GCN relation and the Spark engine
are refused in one line with exit 2, nothing written; so is a typed update for a homogeneous graph."""

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
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pe"))
import refresh_pe  # noqa: E402
from serving_testkit import pyg_model, skewed_graph  # noqa: E402
from test_typed_refresh import _assert_equal_stores, _Mixed  # noqa: E402
from typed_testkit import authors_and_papers, pyg_data, ready, to_hetero_sage, typed_graph, typed_update  # noqa: E402

from sparkgnn.graph import write_graph_dir  # noqa: E402
from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.graph.typed_io import read_typed_graph_dir, write_typed_graph_dir  # noqa: E402
from sparkgnn.graph.updates import UPDATE_SCHEMA, GraphUpdate, TypedGraphUpdate, apply_typed  # noqa: E402
from sparkgnn.models import Model  # noqa: E402
from sparkgnn.models.hetero import HeteroModel  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.typed import TypedPEStore  # noqa: E402
from sparkgnn.pe.typed_refresh import refresh_typed_local  # noqa: E402


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


@pytest.fixture(scope="module")
def typed_inputs(tmp_path_factory):
    """A typed graph directory, its to_hetero SAGE model and typed store, and typed_update() as a folder."""
    d = tmp_path_factory.mktemp("typed_refresh_cli")
    data = pyg_data()
    graph, model = typed_graph(data), to_hetero_sage(data, layers=2)[1]
    write_typed_graph_dir(graph, str(d / "data" / "g"))
    model.save(str(d / "models" / "sage"))
    precompute_local(graph, model, str(d / "store"))
    typed_update().write(str(d / "updates"))
    return {"d": d, "graph": str(d / "data" / "g"), "model": str(d / "models" / "sage"), "store": str(d / "store"),
            "updates": str(d / "updates")}  # fmt: skip


def _listing(root) -> list[str]:
    return sorted(os.path.join(path, n) for path, _, names in os.walk(root) for n in names)


def test_a_typed_refresh_equals_refresh_typed_local_and_a_precompute_of_the_updated_graph(typed_inputs, capsys,
                                                                                          tmp_path):  # fmt: skip
    graph, model = read_typed_graph_dir(typed_inputs["graph"]), HeteroModel.load(typed_inputs["model"])
    precompute_local(graph, model, str(tmp_path / "store"))
    inputs = {**typed_inputs, "store": str(tmp_path / "store")}
    out, report = str(tmp_path / "g2"), str(tmp_path / "report.json")
    assert refresh_pe.main(run(inputs, "--out-graph", out, "--report", report)) == 0
    printed = capsys.readouterr().out
    updated = apply_typed(typed_update(), graph).graph
    assert f"refresh_pe: store version {updated.fingerprint[:12]}" in printed and "updated graph at" in printed
    assert "L1 {'paper': " in printed  # recomputed rows per round and node type
    written = json.loads((tmp_path / "report.json").read_text())
    assert written["graph_fingerprint"] == updated.fingerprint
    assert written["previous_graph_fingerprint"] == graph.fingerprint
    assert written["updates"] == typed_update().counts()
    assert read_typed_graph_dir(out).fingerprint == updated.fingerprint
    got = TypedPEStore.open(str(tmp_path / "store"), model=model, graph=updated)
    precompute_local(graph, model, str(tmp_path / "direct"))
    direct, _ = refresh_typed_local(graph, typed_update(), model, str(tmp_path / "direct"))
    _assert_equal_stores(got, direct, updated)
    _assert_equal_stores(got, precompute_local(updated, model, str(tmp_path / "fresh")), updated)
    # the output rules are the homogeneous path's: an existing --out-graph is replaced only with --overwrite
    assert refresh_pe.main(run(inputs, "--out-graph", out)) == 2
    assert "already holds" in capsys.readouterr().err
    assert refresh_pe.main(run(inputs, "--out-graph", out, "--overwrite")) == 0
    assert read_typed_graph_dir(out).fingerprint == updated.fingerprint


def _gcn_model(d):
    from torch_geometric.nn import GCNConv

    return HeteroModel.from_pyg(ready(_Mixed(d.metadata(), GCNConv), d), d.metadata())


@pytest.mark.parametrize(
    "case, expected",
    [
        ("relation", "relation paper__likes__author is unknown (relations: author__writes__paper"),
        ("metadata", "the model's metadata does not match graph 'typed-small''s: the model does not know node types"),
        ("gcn", "typed PE refresh: round 1, relation ('paper', 'cites', 'paper')"),
        ("spark", "the Spark refresh job runs homogeneous graphs only; a typed store is refreshed on one machine: "
                  "rerun with --engine local"),
    ],
)  # fmt: skip
def test_a_bad_typed_refresh_is_refused_in_one_line_with_nothing_written(typed_inputs, capsys, tmp_path, case,
                                                                         expected):  # fmt: skip
    argv = run(typed_inputs, "--out-graph", str(tmp_path / "g2"), "--report", str(tmp_path / "report.json"))
    if case == "relation":
        bad = TypedGraphUpdate(
            edges={("paper", "likes", "author"): GraphUpdate(edge_insert_src=[3], edge_insert_dst=[0])}
        )
        argv[argv.index("--updates") + 1] = bad.write(str(tmp_path / "bad"))
    elif case in ("metadata", "gcn"):
        model = to_hetero_sage(authors_and_papers(), layers=2)[1] if case == "metadata" else _gcn_model(pyg_data())
        model.save(str(tmp_path / "model"))
        argv[argv.index("--model") + 1] = str(tmp_path / "model")
    else:
        argv.remove("local")
        argv.remove("--engine")
    before = _listing(typed_inputs["store"])
    assert refresh_pe.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("refresh_pe: error: ") and "\n" not in err and expected in err
    assert _listing(typed_inputs["store"]) == before
    assert not os.path.exists(tmp_path / "g2") and not os.path.exists(tmp_path / "report.json")
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".")]  # no staging left behind


def test_a_typed_update_folder_for_a_homogeneous_graph_is_refused(inputs, capsys, tmp_path):
    versions = store_versions(inputs)
    argv = run(inputs)
    argv[argv.index("--updates") + 1] = typed_update().write(str(tmp_path / "typed"))
    assert refresh_pe.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is a typed update (vertices/<node type>/, edges/<src>__<relation>__<dst>/)" in err
    assert err.endswith(f"but graph {inputs['graph']} has one vertex type")
    nothing_lost(inputs, versions)
