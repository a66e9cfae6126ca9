"""Row-addressable layers (pe/rowfile.py): a row file answers given ids without reading its layer
whole (sparse index over many batches, dense ids, tombstones of a newer segment), a store's row
files read the same rows as its Parquet files, a missing or foreign row file is refused by name,
and a store without row files is read whole as before."""

import os
import shutil
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import assert_same_store, graph, model_of, random_update  # noqa: E402, F401

from sparkgnn import files  # noqa: E402
from sparkgnn.errors import DamagedPEStore  # noqa: E402
from sparkgnn.pe import PEStore, UnknownIds, layout, rowfile, versions  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402

PARQUET = [{"file": "part-00000.parquet", "bytes": 1, "crc32": "00000000"}]


def written(folder, ids, values, alive=None, key="layer=1", version="v") -> rowfile.RowFile:
    os.makedirs(folder, exist_ok=True)
    columns = {"h": values, "state": values * 2}
    record = rowfile.write(str(folder), ids, columns, alive=alive, key=key, version=version, parquet=PARQUET)
    return rowfile.RowFile(str(folder), record, key=key, version=version, parquet=PARQUET)


@pytest.mark.parametrize("dense", [False, True])
def test_a_row_file_fetches_given_ids_across_batches(tmp_path, monkeypatch, dense):
    monkeypatch.setattr(rowfile, "BATCH_ROWS", 4)  # 50 rows -> 13 batches, 13 sparse-index entries
    rng = np.random.default_rng(0)
    ids = np.arange(100, 150) if dense else np.sort(rng.choice(10_000, 50, replace=False))
    shuffled = rng.permutation(len(ids))  # written in any order, stored sorted
    values = rng.standard_normal((50, 3)).astype(np.float32)
    rows = rowfile.LayerRows([written(tmp_path, ids[shuffled], values[shuffled])], "layer 1")
    want = rng.choice(50, 7, replace=False)
    np.testing.assert_array_equal(rows.get(ids[want], "h"), values[want])
    np.testing.assert_array_equal(rows.get(ids[want], "state"), 2 * values[want])
    assert rows.rows_read == 14  # only the rows asked for, twice
    assert rows.get(np.zeros(0, np.int64), "h").shape == (0, 3)
    with pytest.raises(UnknownIds, match="1 unknown id"):
        rows.get([int(ids[0]), 99_999], "h")


def test_a_newer_segment_wins_and_its_tombstones_drop_the_id(tmp_path):
    old = written(tmp_path / "a", np.array([1, 2, 3, 4]), np.arange(8, dtype=np.float32).reshape(4, 2))
    new_values = np.array([[10, 10], [0, 0], [50, 50]], np.float32)
    alive = np.array([True, False, True])
    new = written(tmp_path / "b", np.array([2, 3, 5]), new_values, alive=alive)
    rows = rowfile.LayerRows([old, new], "layer 1")
    np.testing.assert_array_equal(rows.get([5, 2, 1, 4], "h"), [[50, 50], [10, 10], [0, 1], [6, 7]])
    with pytest.raises(UnknownIds, match=r"e\.g\. \[3\]"):
        rows.get([3], "h")


def test_a_row_file_read_for_another_segment_is_refused(tmp_path):
    ids, values = np.arange(5), np.ones((5, 2), np.float32)
    record = rowfile.write(str(tmp_path), ids, {"h": values}, key="layer=1", version="v", parquet=PARQUET)
    for kwargs in ({"key": "layer=2", "version": "v"}, {"key": "layer=1", "version": "w"}):
        with pytest.raises(DamagedPEStore, match="does not belong"):
            rowfile.RowFile(str(tmp_path), record, **kwargs, parquet=PARQUET)
    other = [{**PARQUET[0], "crc32": "ffffffff"}]
    with pytest.raises(DamagedPEStore, match="parquet"):
        rowfile.RowFile(str(tmp_path), record, key="layer=1", version="v", parquet=other)


def test_store_row_files_read_what_its_parquet_holds_and_damage_is_named(graph, tmp_path):  # noqa: F811
    model = model_of("sage", graph.feature_dim, 2)
    store = precompute_local(graph, model, str(tmp_path / "s"))
    ids = graph.ids[::7]
    for l in (1, 2):
        rows = store.rows(l)
        assert rows is not None and not store.loaded(l)
        h, s = store.lookup(ids, l, states=True)
        np.testing.assert_array_equal(rows.get(ids, "h"), h)
        np.testing.assert_array_equal(rows.get(ids, "state"), s)
    folder = store.layer_path(2)
    os.remove(os.path.join(folder, rowfile.ROW_FILE))
    with pytest.raises(DamagedPEStore, match=r"layer=2: .*row file _rows\.arrow missing"):
        PEStore.open(str(tmp_path / "s"), model=model, graph=graph)
    # a foreign row file with a record that vouches for its bytes is still refused when read
    shutil.copy(os.path.join(store.layer_path(1), rowfile.ROW_FILE), os.path.join(folder, rowfile.ROW_FILE))
    manifest = layout.read_manifest(store.base)
    path = files.join(folder, rowfile.ROW_FILE)
    manifest[rowfile.ROW_FILES_KEY]["layer=2"].update(bytes=os.path.getsize(path), crc32=files.crc32(path))
    layout.write_manifest(store.base, manifest)
    reopened = PEStore.open(str(tmp_path / "s"), model=model, graph=graph)
    with pytest.raises(DamagedPEStore, match="does not belong"):
        reopened.rows(2)


def test_a_store_without_row_files_is_read_whole_and_refreshes_the_same(graph, tmp_path):  # noqa: F811
    model = model_of("gcn", graph.feature_dim, 2)
    update = random_update(graph, seed=5)
    with_rows, without = str(tmp_path / "rows"), str(tmp_path / "old")
    precompute_local(graph, model, with_rows)
    store = precompute_local(graph, model, without)
    manifest = layout.read_manifest(store.base)
    for key, _record in manifest.pop(rowfile.ROW_FILES_KEY).items():
        os.remove(files.join(layout.committed_dir(store.base, manifest, key), rowfile.ROW_FILE))
    layout.write_manifest(store.base, manifest)
    old = PEStore.open(without, model=model, graph=graph)
    assert old.rows(1) is None and versions.segments(old.base, old.manifest, "layer=1")[-1].row_file is None
    a, report_a = refresh_local(graph, update, model, with_rows)
    b, report_b = refresh_local(graph, update, model, without)
    assert [s["read"] for s in report_a.layers] == ["rows", "rows"]
    assert [s["read"] for s in report_b.layers] == ["whole", "whole"]
    assert_same_store(b, a, a.table(1).ids, 2)
