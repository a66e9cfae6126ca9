"""A PE store's committed layers are checked against their commit records (pe/integrity.py):
PEStore.open refuses a damaged store naming the layer and file, and a resumed precompute
recomputes the damaged layer instead of trusting the manifest."""

import logging
import os
import shutil

import numpy as np
import pytest

from sparkgnn.errors import DamagedPEStore, StalePEStore
from sparkgnn.pe import PEStore, layout
from sparkgnn.pe.local import precompute_local


def _store(tmp_path, graph_data, model) -> PEStore:
    return precompute_local(graph_data, model, str(tmp_path / "store"))


def _layer_file(store: PEStore, l: int) -> str:
    folder = store.layer_path(l)
    return os.path.join(folder, sorted(f for f in os.listdir(folder) if not f.startswith((".", "_")))[0])


def _open(tmp_path, graph_data, model, **kw) -> PEStore:
    return PEStore.open(str(tmp_path / "store"), model=model, graph=graph_data, **kw)


def test_manifest_records_every_committed_file(tmp_path, graph_data, model):
    store = _store(tmp_path, graph_data, model)
    records = store.manifest["files"]
    assert sorted(records) == [f"layer={l}" for l in store.layers]
    entry = records["layer=1"][0]
    assert entry["bytes"] == os.path.getsize(_layer_file(store, 1)) and len(entry["crc32"]) == 8


def test_deleted_layer_is_refused_by_open(tmp_path, graph_data, model):
    store = _store(tmp_path, graph_data, model)
    shutil.rmtree(store.layer_path(2))
    with pytest.raises(DamagedPEStore, match="layer=2: directory missing.*Rerun the precompute job"):
        _open(tmp_path, graph_data, model)


def test_truncated_file_is_refused_by_open(tmp_path, graph_data, model):
    store = _store(tmp_path, graph_data, model)
    victim = _layer_file(store, 1)
    with open(victim, "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(DamagedPEStore, match=f"layer=1: 1 file\\(s\\) changed size: {os.path.basename(victim)}"):
        _open(tmp_path, graph_data, model)
    assert issubclass(DamagedPEStore, StalePEStore)  # callers catching stale stores catch this too


def test_same_size_corruption_needs_checksums(tmp_path, graph_data, model):
    store = _store(tmp_path, graph_data, model)
    victim = _layer_file(store, 1)
    with open(victim, "r+b") as fh:
        fh.seek(os.path.getsize(victim) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DamagedPEStore, match="changed content \\(CRC-32 differs\\)"):
        _open(tmp_path, graph_data, model)
    _open(tmp_path, graph_data, model, verify="sizes")  # the cheap level cannot see it, by design


def test_added_file_is_refused(tmp_path, graph_data, model):
    store = _store(tmp_path, graph_data, model)
    shutil.copy(_layer_file(store, 3), os.path.join(store.layer_path(3), "part-99999.parquet"))
    with pytest.raises(DamagedPEStore, match="layer=3: 1 file\\(s\\) not written by the commit: part-99999"):
        _open(tmp_path, graph_data, model)


def test_store_without_records_is_checked_at_footer_level(tmp_path, graph_data, model):
    """Stores committed before file records existed: readable Parquet with id and h is required."""
    store = _store(tmp_path, graph_data, model)
    manifest = dict(store.manifest)
    manifest.pop("files")
    layout.write_manifest(store.base, manifest)
    _open(tmp_path, graph_data, model)
    with open(_layer_file(store, 2), "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(DamagedPEStore, match="layer=2: 1 unreadable file"):
        _open(tmp_path, graph_data, model)


def test_resume_recomputes_a_damaged_layer(tmp_path, graph_data, model, caplog):
    store = _store(tmp_path, graph_data, model)
    h2 = store.lookup(graph_data.ids, 2)[0].copy()
    shutil.rmtree(store.layer_path(2))
    caplog.set_level(logging.INFO, logger="sparkgnn")
    repaired = precompute_local(graph_data, model, str(tmp_path / "store"))
    assert any(
        "layer 2 of" in line and "is damaged (directory missing); recomputing it" in line for line in caplog.messages
    )
    np.testing.assert_array_equal(repaired.lookup(graph_data.ids, 2)[0], h2)
    _open(tmp_path, graph_data, model)


def test_spark_precompute_rerun_repairs_a_deleted_layer(spark, spark_graph, graph_data, model, tmp_path, caplog):
    from sparkgnn.engine.precompute import precompute

    root = str(tmp_path / "store")
    caplog.set_level(logging.INFO, logger="sparkgnn")
    store = precompute(spark, spark_graph, model, store=root, metrics=False, work_dir=str(tmp_path / "w")).store
    h1 = store.lookup(graph_data.ids, 1)[0].copy()
    shutil.rmtree(store.layer_path(1))
    caplog.clear()
    repaired = precompute(spark, spark_graph, model, store=root, metrics=False, work_dir=str(tmp_path / "w")).store
    assert any("layer 1 of" in line and "recomputing it" in line for line in caplog.messages)
    assert any("committed layer 1/3" in line for line in caplog.messages)
    np.testing.assert_allclose(repaired.lookup(graph_data.ids, 1)[0], h1, rtol=1e-6, atol=1e-6)


def test_store_written_before_attempts_opens_and_recommits(tmp_path, graph_data, model):
    """Stores committed by the rename protocol hold their files in layer=<l>/ itself and have no
    manifest["paths"]: they still open, and a recommit moves the layer into an attempt folder."""
    from sparkgnn.pe import PEWriter

    store = _store(tmp_path, graph_data, model)
    for l in store.layers:  # rebuild the old shape: files directly in layer=<l>/
        attempt, folder = store.layer_path(l), layout.layer_dir(store.base, l)
        for name in os.listdir(attempt):
            shutil.move(os.path.join(attempt, name), folder)
        os.rmdir(attempt)
    manifest = dict(store.manifest)
    manifest.pop("paths")
    layout.write_manifest(store.base, manifest)
    legacy = _open(tmp_path, graph_data, model)
    assert legacy.layer_path(1) == layout.layer_dir(store.base, 1)
    h1, s1 = legacy.lookup(graph_data.ids, 1, states=True)

    writer = PEWriter(str(tmp_path / "store"), graph_data, model, with_states=True)
    writer.commit_layer_arrays(1, graph_data.ids, h1, s1)
    assert os.listdir(layout.layer_dir(store.base, 1)) == [writer.manifest["paths"]["layer=1"].split("/")[1]]
    reopened = _open(tmp_path, graph_data, model)
    np.testing.assert_array_equal(reopened.lookup(graph_data.ids, 1)[0], h1)
    assert reopened.layer_path(2) == layout.layer_dir(store.base, 2)  # untouched layers stay where they were
