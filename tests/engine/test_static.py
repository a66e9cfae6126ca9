"""engine.static: a partition's edge layout as local indexes, derived once and saved next to the
layout so any later Python worker (Spark does not keep a partition on one worker) loads it."""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.engine import static


def _write(root, name, table, file="a.parquet"):
    os.makedirs(os.path.join(root, name, "part=0"), exist_ok=True)
    pq.write_table(table, os.path.join(root, name, "part=0", file))


@pytest.fixture()
def prep_dir(tmp_path):
    root = str(tmp_path)
    degrees = {key: pa.array([1.0, 2.0, 3.0], pa.float32()) for key in static.STAT_COLUMNS}
    _write(root, "vertices", pa.table({"id": [30, 10, 20], **degrees}))
    _write(
        root,
        "in_edges",
        pa.table({"src": [20, 5, 7, 7], "dst": [10, 10, 30, 20], "w": pa.array([1.0] * 4, pa.float32())}),
    )
    yield root
    static.owned.cache_clear()
    static.in_edges.cache_clear()


def _fresh_process():
    static.owned.cache_clear()
    static.in_edges.cache_clear()


def test_local_indexes_are_saved_once_and_loaded_by_a_later_process(prep_dir, monkeypatch):
    _fresh_process()
    built = static.in_edges(prep_dir, 0)
    assert built.src.tolist() == [1, 3, 4, 4] and built.dst.tolist() == [0, 0, 2, 1]
    assert built.mirror_ids.tolist() == [5, 7]
    assert os.path.exists(os.path.join(prep_dir, "local", "in_edges", "part=0.npz"))
    _fresh_process()
    real_read = static._read_part

    def read_part(prep, table, part, columns):
        assert table != "in_edges", "the edge layout was read again instead of the saved indexes"
        return real_read(prep, table, part, columns)

    monkeypatch.setattr(static, "_read_part", read_part)
    loaded = static.in_edges(prep_dir, 0)
    for name in ("src", "dst", "w", "mirror_ids"):
        assert np.array_equal(getattr(loaded, name), getattr(built, name))


def test_a_saved_file_for_other_layout_files_or_a_damaged_one_is_rebuilt(prep_dir):
    _fresh_process()
    static.in_edges(prep_dir, 0)
    # The layout changes under the same prep dir (another file, another size): the saved indexes
    # describe edges that are gone and must not be served.
    os.remove(os.path.join(prep_dir, "in_edges", "part=0", "a.parquet"))
    _write(prep_dir, "in_edges", pa.table({"src": [9], "dst": [30], "w": pa.array([2.0], pa.float32())}), "b.parquet")
    _fresh_process()
    changed = static.in_edges(prep_dir, 0)
    assert changed.mirror_ids.tolist() == [9] and changed.dst.tolist() == [2] and changed.w.tolist() == [2.0]
    with open(os.path.join(prep_dir, "local", "in_edges", "part=0.npz"), "wb") as fh:
        fh.write(b"not a zip")
    _fresh_process()
    assert static.in_edges(prep_dir, 0).mirror_ids.tolist() == [9]
