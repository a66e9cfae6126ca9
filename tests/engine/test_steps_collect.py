"""engine.steps collect: routed rows (as Spark hands them, in several Arrow batches, taken one by
one) become the DL tables in the partition's local order, with one copy and with every id checked."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.arrowvec import pack_binary, to_numpy_matrix
from sparkgnn.engine import static, steps
from sparkgnn.engine.routing import OWN, SRC, make_rows

KEYS = np.array([11, 12])


@pytest.fixture()
def prep_dir(tmp_path):
    # Partition 0 owns vertices 10, 20, 30; its in-edges come from 20 (own) and 5, 7 (mirrors).
    root = str(tmp_path)
    for name, table in {
        "vertices": pa.table(
            {"id": [30, 10, 20], **{key: pa.array([1.0, 2.0, 3.0], pa.float32()) for key in static.STAT_COLUMNS}}
        ),
        "in_edges": pa.table({"src": [20, 5, 7, 7], "dst": [10, 10, 30, 20], "w": pa.array([1.0] * 4, pa.float32())}),
    }.items():
        os.makedirs(os.path.join(root, name, "part=0"))
        pq.write_table(table, os.path.join(root, name, "part=0", "a.parquet"))
    static.owned.cache_clear()
    static.in_edges.cache_clear()
    return root


def _cfg(prep_dir):
    return steps.StepConfig(prep_dir, 2, tuple(KEYS), "m", 0, 2, "edges_static", "mirrors", stats=("gcn_degree",))


def _collect(prep_dir, rows: pa.Table):
    part, tables = steps.collect(_cfg(prep_dir), iter(rows.to_batches()))
    assert part == 0
    return tables


def _rows(own_ids, mirror_ids, width=3):
    # Vector of id i = [i, i + 0.5, ...]: where a row lands is visible in its values.
    def vec(ids):
        return np.array([[i + 0.5 * j for j in range(width)] for i in ids], np.float32).reshape(len(ids), width)

    batches = [
        make_rows(KEYS, np.zeros(len(own_ids[:2])), OWN, own_ids[:2], pack_binary(vec(own_ids[:2]))),
        make_rows(KEYS, np.zeros(len(mirror_ids)), SRC, mirror_ids, pack_binary(vec(mirror_ids))),
        make_rows(KEYS, np.zeros(len(own_ids[2:])), OWN, own_ids[2:], pack_binary(vec(own_ids[2:]))),
    ]
    return pa.Table.from_batches(batches)


def test_own_and_mirror_rows_land_in_local_order_across_batches(prep_dir):
    tables = _collect(prep_dir, _rows(np.array([30, 10, 20]), np.array([7, 5])))
    h = to_numpy_matrix(tables["own"].column("h"))
    assert h[:, 0].tolist() == [10, 20, 30] and h[:, 2].tolist() == [11, 21, 31]
    assert tables["own"].column("gcn_degree").to_pylist() == [2.0, 3.0, 1.0]
    assert tables["own"].column_names == ["h", "gcn_degree"]  # the statistics the step's convs read only
    assert to_numpy_matrix(tables["mirror"].column("p"))[:, 0].tolist() == [5, 7]
    assert h.ctypes.data % 64 == 0  # aligned: the DL side takes it without a copy


@pytest.mark.parametrize(
    "own, mirrors, match",
    [
        ([30, 10], [7, 5], "owns 3 vertices but received 2 own rows"),
        ([30, 10, 10], [7, 5], "duplicate own rows"),
        ([30, 10, 99], [7, 5], r"1 own ids are not known to this partition; first: \[99\]"),
        ([30, 10, 20], [7, 7], "duplicate mirror payload rows"),
        ([30, 10, 20], [7], "expected 2 mirror payload rows, received 1"),
    ],
)
def test_missing_duplicate_or_unknown_rows_are_refused(prep_dir, own, mirrors, match):
    with pytest.raises(ValueError, match=match):
        _collect(prep_dir, _rows(np.array(own), np.array(mirrors)))


def test_a_batch_mixing_kinds_of_different_widths_is_unpacked_per_kind(prep_dir):
    # Own rows carry h (3 floats) while mirror payloads may be narrower (transform-then-propagate).
    own = make_rows(KEYS, np.zeros(3), OWN, np.array([30, 10, 20]), pack_binary(np.ones((3, 3), np.float32)))
    mirrors = make_rows(KEYS, np.zeros(2), SRC, np.array([7, 5]), pack_binary(np.array([[7.0], [5.0]], np.float32)))
    mixed = pa.Table.from_batches(
        [pa.concat_tables([pa.table(own), pa.table(mirrors)]).combine_chunks().to_batches()[0]]
    )
    tables = _collect(prep_dir, mixed)
    assert to_numpy_matrix(tables["own"].column("h")).shape == (3, 3)
    assert to_numpy_matrix(tables["mirror"].column("p"))[:, 0].tolist() == [5.0, 7.0]


def test_batches_are_consumed_one_at_a_time_and_timed(prep_dir):
    # The task never needs all of Spark's batches at once: each is placed and dropped.
    alive = []

    def batches():
        for batch in _rows(np.array([30, 10, 20]), np.array([7, 5])).to_batches():
            alive.append(batch.num_rows)
            yield batch

    spent = {}
    part, tables = steps.collect(_cfg(prep_dir), batches(), spent)
    assert part == 0 and alive == [2, 2, 1] and tables["edges"].num_rows == 4
    assert set(spent) == {"rows_in_s", "collect_s"}


def test_no_rows_means_no_tables_and_rows_of_two_partitions_are_refused(prep_dir):
    assert steps.collect(_cfg(prep_dir), iter([])) is None
    rows = _rows(np.array([30, 10, 20]), np.array([7, 5])).to_batches()
    other = make_rows(KEYS, np.ones(1), OWN, np.array([99]), pack_binary(np.ones((1, 3), np.float32)))
    task = {}
    with pytest.raises(steps.StepFailed, match="rows of partitions 0 and 1 reached one task"):
        steps.collect(_cfg(prep_dir), iter([*rows, other]), task=task)
    assert task == {"partition": 0}


# ---- the files exchange: rows read where they lie (engine.routed_files) ---------------------------


def _vectors(ids, width=3):
    return np.array([[i + 0.5 * j for j in range(width)] for i in ids], np.float32).reshape(len(ids), width)


def _write_files(tmp_path, sources: dict[int, list[tuple[int, list[int]]]], partitions=2):
    """A step directory where source p sent partition 0 the (kind, ids) row groups sources[p]."""
    from sparkgnn.engine import exchange

    step = tmp_path / "exchange" / "step=0"
    for q in range(partitions):
        (step / f"to={q}").mkdir(parents=True, exist_ok=True)
    for source in range(partitions):
        batches = [
            make_rows(KEYS, np.zeros(len(ids)), kind, np.array(ids), pack_binary(_vectors(ids)))
            for kind, ids in sources.get(source, [])
        ]
        list(exchange.write_routed(str(step), source, partitions, iter(batches)))
    return str(step)


def _collect_files(prep_dir, step):
    from sparkgnn.engine import exchange

    cfg = _cfg(prep_dir)
    return steps.collect_files(cfg, 0, exchange.routed_files(step, 0, 2), {}, {})[1]


def _source_vectors(tables):
    """Each in-edge's source vector as the DL step reads it: row src of [own | mirror chunks]."""
    own = to_numpy_matrix(tables["own"].column("h"))
    mirrors = [to_numpy_matrix(chunk) for chunk in tables["mirror"].column("p").chunks]
    rows = np.concatenate([own] + mirrors)
    return rows[tables["edges"].column("src").to_numpy()]


def test_files_are_used_where_they_lie_and_give_the_rows_spark_would(prep_dir, tmp_path):
    # own rows from this partition's own file in local order; mirrors 7 then 5 from partition 1
    step = _write_files(tmp_path, {0: [(OWN, [10, 20, 30])], 1: [(SRC, [7, 5])]})
    tables = _collect_files(prep_dir, step)
    spark_tables = _collect(prep_dir, _rows(np.array([30, 10, 20]), np.array([7, 5])))
    h = to_numpy_matrix(tables["own"].column("h"))
    assert not h.flags.writeable and not h.flags.owndata  # a view of the mapped file, not a copy
    assert np.array_equal(h, to_numpy_matrix(spark_tables["own"].column("h")))
    assert tables["mirror"].column("p").num_chunks == 1  # one block per source file
    # the sources are renumbered to the order the mirrors arrived in; each edge reads the same vector
    assert tables["edges"].column("src").to_pylist() == [1, 4, 3, 3]  # 20 (own), 5 (arrived 2nd), 7, 7
    assert np.array_equal(_source_vectors(tables), _source_vectors(spark_tables))
    assert tables["edges"].column("dst").equals(spark_tables["edges"].column("dst"))


def test_rows_from_several_files_or_out_of_order_are_assembled(prep_dir, tmp_path):
    # own rows split over two files (the feature scan's case) and mirrors split over both sources
    step = _write_files(tmp_path, {0: [(OWN, [30, 10]), (SRC, [5])], 1: [(OWN, [20]), (SRC, [7])]})
    tables = _collect_files(prep_dir, step)
    h = to_numpy_matrix(tables["own"].column("h"))
    assert h[:, 0].tolist() == [10, 20, 30] and h.ctypes.data % 64 == 0
    spark_tables = _collect(prep_dir, _rows(np.array([30, 10, 20]), np.array([7, 5])))
    assert np.array_equal(_source_vectors(tables), _source_vectors(spark_tables))


@pytest.mark.parametrize(
    "sources, match",
    [
        ({0: [(OWN, [10, 20, 30])], 1: [(SRC, [7, 7])]}, "duplicate mirror payload rows"),
        ({0: [(OWN, [10, 20, 30])], 1: [(SRC, [7])]}, "expected 2 mirror payload rows, received 1"),
        ({0: [(OWN, [10, 20, 99])], 1: [(SRC, [7, 5])]}, r"own ids are not known to this partition; first: \[99\]"),
    ],
)
def test_files_with_missing_duplicate_or_unknown_rows_are_refused(prep_dir, tmp_path, sources, match):
    with pytest.raises(ValueError, match=match):
        _collect_files(prep_dir, _write_files(tmp_path, sources))


def test_dropping_partition_caches_forgets_every_kept_structure(tmp_path):
    import torch

    from sparkgnn.dl import csr

    steps._arrival_sources(("prep", 0), np.array([0, 1, 2]), 1, [np.array([1, 0])])
    csr.by_destination(torch.tensor([0, 1]), torch.tensor([1, 0]), 2)
    assert steps._ARRIVAL_SOURCES and csr._entries
    steps.drop_partition_caches()
    assert not steps._ARRIVAL_SOURCES and not csr._entries
    assert static.in_edges.cache_info().currsize == 0
