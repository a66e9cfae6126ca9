"""Batch inference on typed graphs (engine/typed.py): `sparkgnn.infer` and batch_inference.py
equal PyG's forward of the same to_hetero / HeteroConv model (float32, 1e-5) on a small typed
graph with self loops, parallel edges, isolated vertices, non-dense ids and a type without
features; `types` computes only what the named output types read, typed `ids` only the rows the
requested (type, id) pairs read (each relation pruned, --explain one line per relation run),
relation graphs take fingerprint and counts from the typed graph; a model for other metadata,
and refresh / the homogeneous serving engines on typed inputs, are refused in one line."""

import logging
import os
import shutil
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GATConv, GCNConv, HeteroConv, Linear, SAGEConv, to_hetero

from sparkgnn import infer
from sparkgnn.errors import SparkGNNError, UnsupportedModelError
from sparkgnn.graph import write_typed_graph_dir
from sparkgnn.models.hetero import HeteroModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark_jobs"))
import batch_inference  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pe"))
from typed_testkit import IDS, hgt_module  # noqa: E402
from typed_testkit import Sage as _Sage  # noqa: E402
from typed_testkit import pyg_data as _pyg_data  # noqa: E402
from typed_testkit import typed_graph as _typed  # noqa: E402

PAPER_IDS = IDS["paper"]  # non-dense ids: the rows' ids in the graph directory


class _Mixed(torch.nn.Module):
    """HeteroConv stacks mixing SAGE and GAT (GAT's self loops on the paper-paper relation)."""

    def __init__(self, metadata, aggr):
        super().__init__()
        self.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})

        def conv(i, e):
            return SAGEConv(8, 8) if i % 2 else GATConv(8, 8, heads=2, concat=False, add_self_loops=e[0] == e[2])

        self.convs = torch.nn.ModuleList(
            [HeteroConv({e: conv(i, e) for i, e in enumerate(metadata[1])}, aggr=aggr) for _ in range(2)]
        )
        self.out = Linear(8, 2)

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs:
            x_dict = {t: x.relu() for t, x in conv(x_dict, edge_index_dict).items()}
        return self.out(x_dict["paper"])


def _ready(module, d):
    torch.manual_seed(0)
    module(d.x_dict, d.edge_index_dict)  # materialise lazy parameters
    return module.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def typed_dir(tmp_path_factory):
    d = _pyg_data()
    path = str(tmp_path_factory.mktemp("typed") / "graph")
    write_typed_graph_dir(_typed(d), path)
    return path, d


def _rows(frame, node_type: str) -> np.ndarray:
    rows = sorted((r.id, r.h) for r in frame.collect())
    ids = PAPER_IDS if node_type == "paper" else np.arange(len(rows))
    assert [i for i, _ in rows] == sorted(ids.tolist())
    return np.asarray([h for _, h in rows], np.float32)


def test_to_hetero_sage_equals_pyg_at_three_partitions(spark, typed_dir, tmp_path, caplog):
    path, d = typed_dir
    caplog.set_level(logging.INFO, logger="sparkgnn.engine.prepare")
    module = _ready(to_hetero(_Sage(1), d.metadata(), aggr="mean"), d)  # one round: 5 relation runs
    reference = module(d.x_dict, d.edge_index_dict)
    # the PyG module itself: converted for the graph's metadata
    result = infer(spark, path, module, partitions=3, work_dir=str(tmp_path / "work"))
    assert sorted(result.frames) == sorted(reference)
    for t, ref in reference.items():
        np.testing.assert_allclose(_rows(result.frames[t], t), ref.numpy(), rtol=1e-5, atol=1e-5)
    assert not os.listdir(tmp_path / "work" / "typed_runs")  # the run's intermediate values are removed
    # the round's relation layouts were prepared side by side on driver threads first, once each,
    # and every relation job reused its own (a job may still add the combine layouts its plan reads);
    # the base layouts of all five were written in one pass (prepare.prepare_many: two Spark jobs)
    assert "typed round 0: relation layouts, prepared concurrently" in {p["name"] for p in result.phases["phases"]}
    prepared = [r for r in caplog.records if r.getMessage().startswith("sparkgnn: prepared graph ")]
    assert len(prepared) == 5 and all(r.threadName.startswith("sg-prepare") for r in prepared)
    assert all("one of 5 in one pass" in r.getMessage() for r in prepared)
    reused = [r for r in caplog.records if r.getMessage().startswith("sparkgnn: reusing the graph layout")]
    # then the relation jobs ran side by side on driver threads of their own (engine.typed_jobs),
    # their phases kept as the detail of the round's "relation jobs" phase
    assert {r.threadName.split("_")[0] for r in reused} == {"sg-prepare", "sg-relation"}
    assert sum(r.threadName.startswith("sg-relation") for r in reused) >= 5  # each relation job reused its layout
    inside = {row["name"]: row["calls"] for row in result.phases["inside"]["typed round 0: relation jobs"]}
    assert inside["model store"] == 5  # one per relation job
    fingerprints = {r.getMessage().split()[3] for r in prepared}
    assert {r.getMessage().split("/prep/")[1].split("/")[0] for r in reused} == fingerprints


def test_hgt_equals_pyg_at_three_partitions(spark, typed_dir, tmp_path):
    # HGT's softmax spans every relation into a type: each relation job gives partial softmax
    # states, the round's merge folds them per id and applies the per-type output op (one round:
    # 5 relation jobs; its width is kept, so the skip gate reads the carried input rows)
    path, d = typed_dir
    module = hgt_module(d, rounds=1)
    reference = module(d.x_dict, d.edge_index_dict)
    result = infer(spark, path, module, partitions=3, work_dir=str(tmp_path / "work"))
    assert sorted(result.frames) == sorted(reference) == ["author", "field", "paper"]
    for t, ref in reference.items():
        np.testing.assert_allclose(_rows(result.frames[t], t), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_two_round_hetero_conv_sage_gat_via_batch_inference_equals_pyg(spark, typed_dir, tmp_path, capsys):
    path, d = typed_dir
    module = _ready(_Mixed(d.metadata(), "max"), d)
    reference = module(d.x_dict, d.edge_index_dict)
    HeteroModel.from_pyg(module, d.metadata()).save(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["--graph", path, "--model", str(tmp_path / "model"), "--out", str(out), "--partitions", "1"]
    assert batch_inference.main([*argv, "--types", "paper", "--work-dir", str(tmp_path / "work")]) == 0
    assert "wrote 8 rows of node type paper" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["paper"]
    got = _rows(spark.read.parquet(str(out / "paper")), "paper")
    np.testing.assert_allclose(got, reference.numpy(), rtol=1e-5, atol=1e-5)


def test_typed_ids_via_batch_inference_equal_pyg_rows_on_the_driver_in_a_few_spark_jobs(
    spark, typed_dir, tmp_path, capsys
):
    path, d = typed_dir
    module = _ready(to_hetero(_Sage(2), d.metadata(), aggr="sum"), d)  # two rounds
    reference = module(d.x_dict, d.edge_index_dict)
    HeteroModel.from_pyg(module, d.metadata()).save(tmp_path / "model")
    out = tmp_path / "out"
    argv = ["--graph", path, "--model", str(tmp_path / "model"), "--out", str(out), "--partitions", "2"]
    argv += ["--ids", "paper:3,paper:8,author:2", "--explain", "--work-dir", str(tmp_path / "work")]
    context = spark.sparkContext
    context.setJobGroup("typed-local-ids", "typed-local-ids")
    try:
        assert batch_inference.main(argv) == 0
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    # the frontier (one job per round), the rows, each type's output written and counted: no
    # relation job (engine.typed_local)
    assert len(context.statusTracker().getJobIdsForGroup("typed-local-ids")) <= 10
    printed = capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["author", "paper"]
    for t, ids, rows in (("paper", [3, 8], [0, 1]), ("author", [2], [2])):
        got = sorted((r.id, r.h) for r in spark.read.parquet(str(out / t)).collect())
        assert [i for i, _ in got] == ids
        np.testing.assert_allclose([h for _, h in got], reference[t][rows].numpy(), rtol=1e-5, atol=1e-5)
    # the explain lines: round 1 gives no field row (none requested), round 0 gives field 0
    # (topic_of's source of papers 3 and 8 in round 1); rows per round are what round i reads
    assert "== sparkgnn typed plan: local rounds on the driver ==" in printed
    assert "in 3 Spark job(s); rows read per round: round 0: author 3, field 2, paper 4; " in printed
    assert "round 1: author 3, field 1, paper 4; round 2: author 1, paper 2;" in printed


class _GcnCites(torch.nn.Module):
    """One HeteroConv round: GCN on cites (a degree statistic: the driver's typed rounds refuse
    it, engine.typed_local), SAGE on the other relations."""

    def __init__(self, metadata):
        super().__init__()
        self.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})
        convs = {e: GCNConv(8, 8) if e[0] == e[2] else SAGEConv(8, 8) for e in metadata[1]}
        self.conv = HeteroConv(convs, aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        return self.conv({t: self.lin[t](x) for t, x in x_dict.items()}, edge_index_dict)


def test_typed_ids_of_a_model_reading_node_statistics_run_through_the_relation_jobs(spark, typed_dir, tmp_path):
    # each relation job prunes its relation graph cut to the rows (engine.pruned); author rows
    # only: one relation job, the one into author
    path, d = typed_dir
    module = _ready(_GcnCites(d.metadata()), d)
    reference = module(d.x_dict, d.edge_index_dict)
    result = infer(spark, path, module, ids={"author": [2, 5]}, work_dir=str(tmp_path / "work"))
    assert list(result.plans) == ["0:paper__written_by__author"]
    assert result.plans["0:paper__written_by__author"].pruning["mode"] == "local"
    got = sorted((r.id, r.h) for r in result.frames["author"].collect())
    assert [i for i, _ in got] == [2, 5]
    np.testing.assert_allclose([h for _, h in got], reference["author"][[2, 5]].numpy(), rtol=1e-5, atol=1e-5)


class _GcnCitesTwice(_GcnCites):
    """_GcnCites, then a relu and a second such round."""

    def __init__(self, metadata):
        super().__init__(metadata)
        convs = {e: GCNConv(8, 8) if e[0] == e[2] else SAGEConv(8, 8) for e in metadata[1]}
        self.conv2 = HeteroConv(convs, aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: x.relu() for t, x in super().forward(x_dict, edge_index_dict).items()}
        return self.conv2(x_dict, edge_index_dict)


def test_typed_ids_whose_walk_needs_no_row_of_a_type_skip_its_relations_and_equal_pyg(spark, typed_dir, tmp_path):
    # author 5 wrote no paper: round 1 needs no paper row (written_by has no source of it), so
    # round 0 computes no paper (cites, writes and topic_of into paper are skipped) and its
    # written_by job reads no paper row; the rows still equal PyG's forward (its bias and root term)
    path, d = typed_dir
    module = _ready(_GcnCitesTwice(d.metadata()), d)
    reference = module(d.x_dict, d.edge_index_dict)
    result = infer(spark, path, module, ids={"author": [5]}, work_dir=str(tmp_path / "work"))
    assert list(result.plans) == ["0:paper__written_by__author", "1:paper__written_by__author"]
    got = sorted((r.id, r.h) for r in result.frames["author"].collect())
    assert [i for i, _ in got] == [5]
    np.testing.assert_allclose([h for _, h in got], reference["author"][[5]].numpy(), rtol=1e-5, atol=1e-5)
    # the same request on the driver path (a model that recomputes each row from its in-edges
    # alone): the walk's empty paper set gathers no rows instead of an empty IN () predicate
    module = _ready(to_hetero(_Sage(2), d.metadata(), aggr="sum"), d)
    reference = module(d.x_dict, d.edge_index_dict)
    result = infer(spark, path, module, ids={"author": [5]}, work_dir=str(tmp_path / "work2"))
    got = sorted((r.id, r.h) for r in result.frames["author"].collect())
    assert [i for i, _ in got] == [5] and "local" in result.plans
    np.testing.assert_allclose([h for _, h in got], reference["author"][[5]].numpy(), rtol=1e-5, atol=1e-5)


def test_relation_graphs_take_their_fingerprint_and_counts_from_the_typed_graph():
    from types import SimpleNamespace

    from sparkgnn.engine.typed_relations import relation_counts, relation_fingerprint

    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    fp = relation_fingerprint("ab" * 16, writes)
    assert len(fp) == 32 and int(fp, 16) >= 0  # a path part like a content fingerprint
    assert fp != relation_fingerprint("ab" * 16, cites) and fp != relation_fingerprint("cd" * 16, writes)
    types = {"paper": {"num_vertices": 8}, "author": {"num_vertices": 6}}
    relations = {"author__writes__paper": {"num_edges": 7}, "paper__cites__paper": {"num_edges": 8}}
    graph = SimpleNamespace(meta={"types": types, "relations": relations})
    assert relation_counts(graph, writes) == {"num_vertices": 14, "num_edges": 7}
    assert relation_counts(graph, cites) == {"num_vertices": 8, "num_edges": 8}  # one type, counted once
    assert relation_counts(SimpleNamespace(meta={"types": types}), cites) == {}  # not vouched: counted in Spark


def test_first_round_inputs_run_no_spark_job_and_are_the_pre_ops_of_the_features(spark, typed_dir):
    from sparkgnn.engine.typed import _inputs
    from sparkgnn.graph.typed_spark import TypedGraph

    path, d = typed_dir
    module = _ready(_Mixed(d.metadata(), "sum"), d)
    model = HeteroModel.from_pyg(module, d.metadata())
    graph = TypedGraph.load(spark, path)
    group = "typed-inputs-test"
    spark.sparkContext.setJobGroup(group, "typed inputs")
    try:
        values = _inputs(graph, model, set(model.in_dims), None)
        # lazy: the input ops run in the relation jobs' tasks that read the rows (module doc)
        assert list(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == []
    finally:
        spark.sparkContext.setJobGroup("", "")
    with torch.no_grad():
        want = {t: module.lin[t](x).relu() for t, x in d.x_dict.items()}
    for t in ("paper", "author", "field"):  # field: no features, a literal column of ones through its ops
        np.testing.assert_allclose(_rows(values[t], t), want[t].numpy(), rtol=1e-6, atol=1e-6)


def test_needed_types_walk_the_rounds_back_from_the_requested_types():
    from sparkgnn.engine.typed import needed_types

    d = _pyg_data()
    model = HeteroModel.from_pyg(_ready(to_hetero(_Sage(2), d.metadata(), aggr="sum"), d), d.metadata())
    # the last round needs field only for itself; field reads paper (has_topic) and its own root term
    assert needed_types(model, ["paper", "author"]) == [{"paper", "author", "field"}, {"paper", "author"}]
    assert needed_types(model, ["field"]) == [{"paper", "field"}, {"field"}]
    with pytest.raises(Exception, match=r"types \['venue'\] are not outputs of the model"):
        needed_types(model, ["venue"])


def test_mismatched_model_and_homogeneous_jobs_are_refused_in_one_line(spark, typed_dir, tmp_path):
    from sparkgnn import precompute, refresh
    from sparkgnn.serving.engine import serving_model

    path, d = typed_dir
    other = HeteroData()
    for t in ("paper", "author"):
        other[t].x = d[t].x
    other["author", "writes", "paper"].edge_index = d["author", "writes", "paper"].edge_index
    other["paper", "written_by", "author"].edge_index = d["paper", "written_by", "author"].edge_index
    foreign = HeteroModel.from_pyg(_ready(to_hetero(_Sage(1), other.metadata()), other), other.metadata())
    with pytest.raises(UnsupportedModelError) as info:
        infer(spark, path, foreign, out=str(tmp_path / "out"))
    assert "does not match graph 'typed-small'" in str(info.value) and "\n" not in str(info.value)
    assert not os.path.exists(tmp_path / "out")
    model = HeteroModel.from_pyg(_ready(to_hetero(_Sage(1), d.metadata()), d), d.metadata())
    for ids, message in (
        ([3], r"^ids on a typed graph are a non-empty dict \{node type: ids\}"),
        ({"venue": [1]}, r"^ids name node types \['venue'\] that graph 'typed-small' does not have"),
        ({"paper": [3, 4]}, r"^graph typed-small: 1 requested id\(s\) of node type 'paper' are not vertices"),
    ):
        with pytest.raises(SparkGNNError, match=message):
            infer(spark, path, model, ids=ids, out=str(tmp_path / "out"))
    with pytest.raises(SparkGNNError, match=r"^pass ids= or types= on a typed graph, not both"):
        infer(spark, path, model, ids={"paper": [3]}, types=["paper"])
    assert not os.path.exists(tmp_path / "out")
    foreign.save(tmp_path / "model")
    store = str(tmp_path / "store")
    for call in (  # the typed precompute checks the metadata before it writes anything
        lambda: precompute(spark, path, foreign, store=store),
        lambda: precompute(spark, path, str(tmp_path / "model"), store=store),
    ):
        with pytest.raises(UnsupportedModelError, match="metadata does not match graph 'typed-small'"):
            call()
    with pytest.raises(UnsupportedModelError, match="^PE refresh: typed graphs and models are not supported yet"):
        refresh(spark, path, foreign, store=store, updates=str(tmp_path / "updates"))
    with pytest.raises(UnsupportedModelError, match="^the homogeneous serving engines do not serve a typed model"):
        serving_model(str(tmp_path / "model"))
    assert not os.path.exists(store)


def test_missing_relation_folder_other_widths_and_unknown_id_type_are_refused_before_any_data_pass(
    spark, typed_dir, tmp_path, capsys
):
    from sparkgnn.graph import TypedGraph

    path, d = typed_dir
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    shutil.rmtree(broken / "edges" / "paper__cites__paper")
    model = HeteroModel.from_pyg(_ready(to_hetero(_Sage(1), d.metadata()), d), d.metadata())
    model.save(tmp_path / "model")
    wider = d.clone()
    wider["author"].x = torch.randn(6, 5)  # the graph's authors are 4 wide
    wide = HeteroModel.from_pyg(_ready(to_hetero(_Sage(1), wider.metadata()), wider), wider.metadata())
    out = tmp_path / "out"
    argv = ["--model", str(tmp_path / "model"), "--out", str(out), "--work-dir", str(tmp_path / "work")]
    context = spark.sparkContext

    def jobs(group, call) -> int:
        """The Spark jobs `call` runs (it runs in a job group of its own)."""
        context.setJobGroup(group, group)
        try:
            call()
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
        return len(context.statusTracker().getJobIdsForGroup(group))

    opening = jobs("typed-open", lambda: TypedGraph.load(spark, path))  # Parquet schema reads, no data pass
    assert jobs("typed-missing", lambda: batch_inference.main(["--graph", str(broken), *argv])) == 0
    assert "edge type paper__cites__paper: no edges/paper__cites__paper/" in capsys.readouterr().err
    assert jobs("typed-ids", lambda: batch_inference.main(["--graph", path, *argv, "--ids", "venue:1"])) <= opening
    err = capsys.readouterr().err.strip()
    assert "ids name node types ['venue'] that graph 'typed-small' does not have" in err and "\n" not in err
    # an id that is not a vertex of its type: refused by the rows' gather, before any round runs
    assert batch_inference.main(["--graph", path, *argv, "--ids", "paper:4,paper:8,paper:9"]) != 0
    err = capsys.readouterr().err.strip()
    assert "2 requested id(s) of node type 'paper' are not vertices of that type (e.g. 4, 9)" in err and "\n" not in err

    def other_widths():
        with pytest.raises(UnsupportedModelError) as info:
            infer(spark, path, wide, out=str(out), work_dir=str(tmp_path / "work"))
        assert str(info.value) == (
            "the model does not fit graph 'typed-small''s feature widths: "
            "node type 'author': the graph's features are 4 wide but the model expects 5"
        )

    assert jobs("typed-widths", other_widths) <= opening
    assert not os.path.exists(out)
