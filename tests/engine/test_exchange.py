"""The files exchange (engine.exchange): routed rows written per destination by the task that
computed them and read back by the task that needs them, with the same answers as Spark's shuffle."""

import logging
import os

import numpy as np
import pyarrow as pa
import pytest
import torch
from engine_helpers import pyg_reference, relative_error, spark_output
from torch_geometric.nn import GAT, GCN, GraphSAGE

from sparkgnn import infer
from sparkgnn.arrowvec import pack_binary
from sparkgnn.engine import exchange
from sparkgnn.engine.routing import OWN, ROW_SCHEMA, SRC, make_rows
from sparkgnn.engine.run_dir import RUNS_DIR
from sparkgnn.errors import SparkGNNError
from sparkgnn.models import Model

KEYS = np.array([10, 11, 12], dtype=np.int64)


def _batch(pt, kind=SRC, width=4, start=0):
    n = len(pt)
    ids = np.arange(start, start + n, dtype=np.int64)
    vectors = (ids[:, None] * 10 + np.arange(width)).astype(np.float32)
    return make_rows(KEYS, np.asarray(pt, dtype=np.int32), kind, ids, pack_binary(vectors))


def _step(tmp_path, partitions, name="step=0"):
    """A step directory as the driver makes it (FileExchange.paths): one folder per destination."""
    for q in range(partitions):
        (tmp_path / name / f"to={q}").mkdir(parents=True, exist_ok=True)
    return str(tmp_path / name)


def _read_routed(step_dir, part, partitions):
    """Every batch routed to `part`, as a task reads them (exchange.routed_files)."""
    for routed in exchange.routed_files(step_dir, part, partitions):
        yield from routed.batches()


def _read_ids(step_dir, part, partitions):
    return sorted(int(i) for b in _read_routed(step_dir, part, partitions) for i in b.column("id").to_pylist())


def test_rows_reach_exactly_their_destination_and_every_file_exists(tmp_path):
    step = _step(tmp_path, 3)
    batches = [_batch([0, 2, 2, 0, 1]), _batch([2, 2], kind=OWN, start=5), _batch([], start=7)]
    (summary,) = list(exchange.write_routed(step, 1, 3, iter(batches)))
    assert summary.to_pydict()["pt"] == [1] and summary.to_pydict()["rows"] == [7]
    assert summary.to_pydict()["bytes"][0] == sum(
        os.path.getsize(tmp_path / "step=0" / f"to={q}" / name)
        for q in range(3)
        for name in os.listdir(tmp_path / "step=0" / f"to={q}")
        if name.startswith("from=1.")
    )
    # the other sources report nothing routed (still one file each)
    for source in (0, 2):
        list(exchange.write_routed(step, source, 3, iter([])))
    assert _read_ids(step, 0, 3) == [0, 3]
    assert _read_ids(step, 1, 3) == [4]
    assert _read_ids(step, 2, 3) == [1, 2, 5, 6]
    # vectors travel with their ids, byte for byte
    rows = pa.Table.from_batches(list(_read_routed(step, 2, 3)))
    by_id = dict(zip(rows.column("id").to_pylist(), rows.column("v").to_pylist(), strict=True))
    assert np.frombuffer(by_id[6], np.float32).tolist() == [60.0, 61.0, 62.0, 63.0]
    assert not [name for q in range(3) for name in os.listdir(tmp_path / "step=0" / f"to={q}") if name.startswith(".")]


def test_a_retried_task_replaces_its_files_whole(tmp_path):
    step = _step(tmp_path, 2)
    list(exchange.write_routed(step, 0, 2, iter([_batch([0, 1, 1])])))
    list(exchange.write_routed(step, 0, 2, iter([_batch([1, 1, 1])])))  # the second attempt
    list(exchange.write_routed(step, 1, 2, iter([])))
    assert _read_ids(step, 0, 2) == []
    assert _read_ids(step, 1, 2) == [0, 1, 2]


def test_a_failed_task_leaves_no_files(tmp_path):
    step = _step(tmp_path, 2)

    def failing():
        yield _batch([0, 1])
        raise RuntimeError("the DL step died")

    with pytest.raises(RuntimeError, match="died"):
        list(exchange.write_routed(step, 0, 2, failing()))
    assert [name for q in range(2) for name in os.listdir(tmp_path / "step=0" / f"to={q}")] == []


def test_a_missing_source_is_named(tmp_path):
    step = _step(tmp_path, 3)
    list(exchange.write_routed(step, 0, 3, iter([_batch([1])])))
    list(exchange.write_routed(step, 2, 3, iter([])))
    with pytest.raises(exchange.ExchangeError, match="from partition 1 to partition 1 are missing"):
        list(_read_routed(step, 1, 3))


def test_a_damaged_file_is_refused(tmp_path):
    step = _step(tmp_path, 2)
    for source in range(2):
        list(exchange.write_routed(step, source, 2, iter([_batch([0, 1])])))
    (tmp_path / "step=0" / "to=0" / "from=1.arrow").write_bytes(b"not arrow")
    with pytest.raises(exchange.ExchangeError, match="from partition 1 to partition 0 are missing or damaged"):
        list(_read_routed(step, 0, 2))


def test_a_vector_file_that_does_not_match_its_rows_is_refused(tmp_path):
    step = _step(tmp_path, 2)
    for source in range(2):
        list(exchange.write_routed(step, source, 2, iter([_batch([0, 1])])))
    (vectors,) = [
        p for p in (tmp_path / "step=0" / "to=0").iterdir() if p.name.startswith("from=1.") and p.suffix == ".vec"
    ]
    vectors.write_bytes(vectors.read_bytes()[:-4])
    with pytest.raises(exchange.ExchangeError, match=r"from partition 1 to partition 0 .*declares 16 bytes of vectors"):
        list(_read_routed(step, 0, 2))
    vectors.unlink()
    with pytest.raises(exchange.ExchangeError, match="from partition 1 to partition 0 are missing or damaged"):
        list(_read_routed(step, 0, 2))


def test_a_file_of_one_width_is_one_mapped_matrix(tmp_path):
    step = _step(tmp_path, 2)
    list(exchange.write_routed(step, 0, 2, iter([_batch([1, 0, 1], start=0), _batch([1, 1], start=3)])))
    list(exchange.write_routed(step, 1, 2, iter([_batch([1], width=2, start=9), _batch([1], width=4, start=8)])))
    uniform, mixed = exchange.routed_files(step, 1, 2)
    assert uniform.column("id").tolist() == [0, 2, 3, 4]
    matrix = uniform.matrix()
    assert matrix.shape == (4, 4) and not matrix.flags.owndata and not matrix.flags.writeable
    assert matrix[:, 0].tolist() == [0.0, 20.0, 30.0, 40.0]
    assert mixed.matrix() is None  # rows of two widths: only batch by batch
    assert [len(b) for b in mixed.batches()] == [1, 1]


def test_unrouted_rows_are_refused(tmp_path):
    step = _step(tmp_path, 2)
    with pytest.raises(exchange.ExchangeError, match="partition -1, outside 0..1"):
        list(exchange.write_routed(step, 0, 2, iter([_batch([0, -1])])))
    with pytest.raises(exchange.ExchangeError, match="partition 2, outside 0..1"):
        list(exchange.write_routed(step, 0, 2, iter([_batch([2])])))


def test_a_task_cannot_write_into_a_closed_exchange(tmp_path):
    # close() removed the run: a task Spark had not killed yet fails instead of recreating it
    run = exchange.FileExchange(str(tmp_path / "work"), 2)
    _, writes = run.paths(0, last=False)
    run.close()
    with pytest.raises(OSError):
        list(exchange.write_routed(writes, 0, 2, iter([_batch([0, 1])])))
    assert os.listdir(tmp_path / "work" / RUNS_DIR) == []


def test_disk_room_counts_two_steps(tmp_path):
    fits, free = exchange.fits_on_disk(str(tmp_path / "not" / "made" / "yet"), 1024)
    assert fits and free > 0
    assert not exchange.fits_on_disk(str(tmp_path), free / 2)[0]


def test_reports_must_name_each_partition_once():
    rows = [{"pt": 0, "rows": 3, "bytes": 10}, {"pt": 1, "rows": 4, "bytes": 20}]
    assert exchange.check_reports(rows, 2) == (7, 30)
    with pytest.raises(exchange.ExchangeError, match=r"partitions \[1\] reported twice"):
        exchange.check_reports(rows + [{"pt": 1, "rows": 0, "bytes": 0}], 2)
    with pytest.raises(exchange.ExchangeError, match=r"partitions \[2\] did not report"):
        exchange.check_reports(rows, 3)


def test_auto_picks_files_only_where_every_executor_shares_the_disk(spark, tmp_path):
    assert exchange.exchange_kind(spark, "auto", str(tmp_path)) == "files"  # local[2] + a local dir
    assert exchange.exchange_kind(spark, "auto", "s3://bucket/work") == "shuffle"
    assert exchange.exchange_kind(spark, "shuffle", str(tmp_path)) == "shuffle"
    with pytest.raises(SparkGNNError, match="unknown exchange 'disk'"):
        exchange.exchange_kind(spark, "disk", str(tmp_path))


MODELS = {"sage_mean": GraphSAGE, "gat": GAT, "gcn": GCN}


@pytest.mark.parametrize("strategy", ["replicate", "combine"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_both_exchanges_equal_pyg(spark, opened_graphs, work_dir, model_name, strategy, caplog):
    """Spark's shuffle for every (layer type, strategy); the files exchange beside it for GCN (the
    files exchange is what test_infer_exact's runs take in local mode, every layer type and strategy)."""
    opened, data = opened_graphs["skewed"]
    torch.manual_seed(3)
    module = MODELS[model_name](data.feature_dim, 12, 2, out_channels=5).eval()
    expected = pyg_reference(module, data)
    caplog.set_level(logging.INFO, logger="sparkgnn")
    for kind in ("shuffle", "files") if model_name == "gcn" else ("shuffle",):
        caplog.clear()
        job = infer(
            spark,
            opened,
            Model.from_pyg(module),
            strategy=strategy,
            partitions=3,
            work_dir=work_dir,
            exchange=kind,
        )
        result, report = job.frame, job.report
        assert report.exchange == kind
        assert relative_error(spark_output(result, data), expected) <= 1e-5, kind
        routed = [line for line in caplog.messages if "through files" in line]
        assert bool(routed) == (kind == "files")


def test_files_runs_leave_no_scratch_and_edge_join_falls_back(spark, graph_dirs, tmp_path, caplog):
    path, data = graph_dirs["skewed"]
    torch.manual_seed(4)
    module = GraphSAGE(data.feature_dim, 8, 2, out_channels=3).eval()
    work = str(tmp_path / "work")
    out = str(tmp_path / "out")
    infer(spark, path, Model.from_pyg(module), out=out, partitions=3, work_dir=work)
    assert os.listdir(os.path.join(work, RUNS_DIR)) == []
    caplog.set_level(logging.INFO, logger="sparkgnn")

    def edge_join(**options):
        return infer(spark, path, Model.from_pyg(module), strategy="edge_join", partitions=3, work_dir=work, **options)

    job = edge_join()
    result, report = job.frame, job.report
    assert report.exchange == "shuffle"
    assert any("go through Spark's shuffle" in line for line in caplog.messages)
    assert relative_error(spark_output(result, data), pyg_reference(module, data)) <= 1e-5
    with pytest.raises(SparkGNNError, match="exchange 'files' cannot be used: the plan joins payloads onto edges"):
        edge_join(exchange="files")


def test_a_failing_files_run_removes_its_scratch(spark, graph_dirs, tmp_path):
    # Weights that overflow float32 make the first layer's payloads infinite: the step after it
    # refuses them, the job fails with that error, and no exchange files are left behind.
    path, data = graph_dirs["skewed"]
    module = GraphSAGE(data.feature_dim, 8, 2, out_channels=3).eval()
    with torch.no_grad():
        module.convs[0].lin_l.weight.fill_(3e38)
    work = str(tmp_path / "work")
    with pytest.raises(Exception, match="NaN/Inf"):
        infer(spark, path, Model.from_pyg(module), partitions=3, work_dir=work)
    assert os.listdir(os.path.join(work, RUNS_DIR)) == []


def test_the_feature_scan_puts_every_vertex_at_its_owner(spark, graph_dirs, tmp_path):
    from sparkgnn.arrowvec import unpack_binary
    from sparkgnn.engine.executor import _vertex_files
    from sparkgnn.engine.routing import owner_partition, partition_keys
    from sparkgnn.graph import Graph

    path, data = graph_dirs["skewed"]
    files = _vertex_files(Graph.load(spark, path))
    run = exchange.FileExchange(str(tmp_path / "work"), 3)
    rows, _ = run.scan_features(spark, files, partition_keys(spark, 3))
    assert rows == data.num_nodes
    reads, _ = run.paths(0, last=True)
    seen = []
    for part in range(3):
        table = pa.Table.from_batches(list(_read_routed(reads, part, 3)), schema=ROW_SCHEMA)
        ids = table.column("id").to_numpy()
        assert (owner_partition(ids, 3) == part).all() and (table.column("kind").to_numpy() == OWN).all()
        np.testing.assert_array_equal(unpack_binary(table.column("v").combine_chunks()), data.x[data.index_of(ids)])
        seen.extend(ids.tolist())
    assert sorted(seen) == sorted(data.ids.tolist())
    run.close()


def test_the_features_scanned_once_are_kept_beside_the_layout_and_read_by_later_jobs(
    spark, graph_dirs, tmp_path, caplog
):
    # the first job's feature scan is kept in prep/<fingerprint>/P=3/features (its record inside);
    # the next job on the same graph and P reads it there: no feature scan, one Spark job fewer,
    # the same answer; another P scans (and keeps) its own
    from sparkgnn.engine.routing import partition_keys
    from sparkgnn.graph import Graph

    path, data = graph_dirs["skewed"]
    graph = Graph.load(spark, path)
    torch.manual_seed(8)
    module = GCN(data.feature_dim, 8, 2, out_channels=3).eval()
    expected = pyg_reference(module, data)
    work = str(tmp_path / "work")
    caplog.set_level(logging.INFO, logger="sparkgnn")
    labels = []
    for partitions in (3, 3, 2):
        caplog.clear()
        job = infer(spark, graph, Model.from_pyg(module), partitions=partitions, work_dir=work)
        assert relative_error(spark_output(job.frame, data), expected) <= 1e-5, partitions
        labels.append([step.label for step in job.report.steps])
        reused = any("reusing the features scanned" in line for line in caplog.messages)
        assert reused == (len(labels) == 2)
    assert labels[0][0] == labels[2][0] == "feature scan" and "feature scan" not in labels[1]
    assert labels[1] == labels[0][1:]
    for partitions in (2, 3):
        kept = os.path.join(work, "prep", graph.fingerprint, f"P={partitions}", exchange.FEATURES_DIR)
        keys = partition_keys(spark, partitions)
        assert exchange.kept_features(os.path.dirname(kept), partitions, keys) == kept
        assert exchange.kept_features(os.path.dirname(kept), partitions, keys + 1) is None  # other routing keys
        assert sorted(os.listdir(kept)) == [exchange.FEATURES_RECORD] + [f"to={q}" for q in range(partitions)]
    assert os.listdir(os.path.join(work, RUNS_DIR)) == []


def test_a_graph_given_as_dataframes_scans_through_spark_and_exchanges_files(spark, graph_dirs, tmp_path, caplog):
    # No directory to read in the tasks: Spark scans x and writes the layouts; the layers after the
    # first still exchange files
    from types import SimpleNamespace

    from sparkgnn.graph import Graph

    path, data = graph_dirs["skewed"]
    loaded = Graph.load(spark, path)
    frames = SimpleNamespace(vertices=loaded.vertices, edges=loaded.edges)
    torch.manual_seed(6)
    module = GraphSAGE(data.feature_dim, 8, 2, out_channels=4).eval()
    caplog.set_level(logging.INFO, logger="sparkgnn")
    job = infer(
        spark,
        frames,
        Model.from_pyg(module),
        partitions=3,
        work_dir=str(tmp_path / "w"),
    )
    result, report = job.frame, job.report
    assert report.exchange == "files"
    assert not any("feature scan" in line for line in caplog.messages)
    assert any("through files" in line for line in caplog.messages)
    assert relative_error(spark_output(result, data), pyg_reference(module, data)) <= 1e-5


def test_control_rows_spread_partitions_over_fewer_tasks(spark):
    rows = exchange.control_rows(spark, 5, tasks=2)
    assert rows.rdd.getNumPartitions() == 2
    served = rows.rdd.glom().map(lambda part: [row.pt for row in part]).collect()
    assert sorted(p for task in served for p in task) == [0, 1, 2, 3, 4] and all(served)
    assert exchange.control_rows(spark, 3).rdd.getNumPartitions() == 3  # default: one task each


def test_control_partitions_are_distinct_and_present():
    batch = pa.record_batch({"pt": pa.array([2, 3], pa.int32())})
    assert exchange.control_partitions([batch]) == [2, 3]
    with pytest.raises(exchange.ExchangeError, match="expected exactly one partition"):
        exchange.control_partition([batch])
    for bad in ([], [pa.record_batch({"pt": pa.array([1, 1], pa.int32())})]):
        with pytest.raises(exchange.ExchangeError, match="expected distinct partitions"):
            exchange.control_partitions(bad)


def test_tasks_serving_several_partitions_in_turn_equal_pyg(spark, graph_dirs, work_dir, monkeypatch, caplog):
    # A page-cache budget too small for two tasks at once: the plan runs one task that serves the
    # three partitions one after another (with 2 torch threads), and the answer is still exact.
    import sparkgnn.engine.api as api

    monkeypatch.setattr(api, "mapped_memory_budget", lambda spark: 1 << 10)
    path, data = graph_dirs["skewed"]
    torch.manual_seed(3)
    module = GraphSAGE(data.feature_dim, 12, 2, out_channels=5).eval()
    caplog.set_level(logging.INFO, logger="sparkgnn")
    job = infer(
        spark,
        path,
        Model.from_pyg(module),
        strategy="replicate",
        partitions=3,
        work_dir=work_dir,
        exchange="files",
        explain=True,
    )
    result, plan = job.frame, job.plan
    assert plan.concurrent_tasks == 1 and plan.memory["partitions_per_task"] == 3
    assert plan.memory["threads_per_task"] == 2
    assert any(
        line.startswith("tasks: 1 at once, 3 partition(s) each") for line in "\n".join(caplog.messages).splitlines()
    )
    assert relative_error(spark_output(result, data), pyg_reference(module, data)) <= 1e-5
