"""pe/parts.py: a table written as several Parquet parts on threads reads back whole and in order,
with the CRC-32s a read-back would give; a store whose layers are cut into parts (the cut made
small here) opens checksum-verified and looks up equal to the model and to a store of one part."""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sparkgnn import files
from sparkgnn.arrowvec import parquet_options, to_fixed_list, to_numpy_matrix
from sparkgnn.pe import PEStore, integrity, parts
from sparkgnn.pe.local import precompute_local

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import assert_same_store, model_of  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
from serving_testkit import skewed_graph  # noqa: E402


def test_part_count_follows_rows_and_threads():
    assert parts.part_count(0, threads=4) == 1
    assert parts.part_count(parts.PART_MIN_ROWS * 2 - 1, threads=4) == 1
    assert parts.part_count(parts.PART_MIN_ROWS * 3, threads=2) == 2
    assert parts.part_count(parts.PART_MIN_ROWS * 3, threads=4) == 3
    assert parts.part_count(parts.PART_MIN_ROWS * 100, threads=1) == 1


@pytest.mark.parametrize("rows", [0, 1, 99, 100, 101])
def test_parts_read_back_whole_in_order_with_the_crc_a_read_back_gives(tmp_path, monkeypatch, rows):
    monkeypatch.setattr(parts, "PART_MIN_ROWS", 25)
    rng = np.random.default_rng(rows)
    h = rng.random((rows, 6), dtype=np.float32)
    table = pa.table({"id": pa.array(rng.permutation(rows).astype(np.int64)), "h": to_fixed_list(h)})
    folder = str(tmp_path / "out")
    crc = parts.write_parts(table, folder, parquet_options(table.schema, unique=("id",)), threads=3)
    assert sorted(crc) == [parts.part_name(i) for i in range(parts.part_count(rows, 3))] == sorted(os.listdir(folder))
    back = pa.concat_tables([pq.read_table(os.path.join(folder, name)) for name in sorted(crc)])
    assert back.column("id").to_pylist() == table.column("id").to_pylist()
    np.testing.assert_array_equal(to_numpy_matrix(back.column("h"), 6), h)
    assert crc == {name: files.crc32(os.path.join(folder, name)) for name in crc}
    assert integrity.record(folder, crc) == integrity.record(folder)


def test_a_store_of_many_parts_opens_verified_and_equals_the_model_and_a_store_of_one_part(tmp_path, monkeypatch):
    graph = skewed_graph()
    model = model_of("gcn", graph.feature_dim, 2)
    one = precompute_local(graph, model, str(tmp_path / "one"))
    monkeypatch.setattr(parts, "PART_MIN_ROWS", max(graph.num_nodes // 4, 1))
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    many = precompute_local(graph, model, str(tmp_path / "many"))
    layer = many.layer_path(2)
    assert len([f for f in files.data_files(layer) if f.rel.endswith(".parquet")]) == 4
    many = PEStore.open(str(tmp_path / "many"), model=model, graph=graph, verify="checksums")
    assert_same_store(many, one, graph.ids, 2)
    with torch.no_grad():
        weight = None if graph.weight is None else torch.from_numpy(graph.weight)
        edges = torch.from_numpy(np.stack([graph.edge_src, graph.edge_dst]))
        want = model.forward(torch.from_numpy(graph.x), edges, weight)
    got, _ = many.lookup(graph.ids, 2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
