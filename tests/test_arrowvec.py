"""sparkgnn.arrowvec: float vectors in Arrow columns; which columns Parquet dictionary-encodes."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sparkgnn.arrowvec import (
    dictionary_columns,
    is_float_list,
    parquet_options,
    to_fixed_list,
    to_list,
    to_numpy_matrix,
)


def test_vector_columns_are_the_float_lists_and_are_written_without_a_dictionary(tmp_path):
    h = np.arange(12, dtype=np.float32).reshape(4, 3)
    table = pa.table(
        {
            "id": pa.array([4, 1, 3, 2], pa.int64()),
            "h": to_list(h),
            "a": to_fixed_list(h),
            "tags": pa.array([[1], [2], [3], [4]], pa.list_(pa.int32())),
            "pred": pa.array([0, 1, 0, 1], pa.int64()),
        }
    )
    assert [is_float_list(f.type) for f in table.schema] == [False, True, True, False, False]
    assert dictionary_columns(table.schema) == ["id", "tags", "pred"]
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, use_dictionary=dictionary_columns(table.schema))
    back = pq.read_table(path)
    np.testing.assert_array_equal(to_numpy_matrix(back.column("h")), h)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert not any("DICTIONARY" in e for e in encodings["h.list.element"])
    assert any("DICTIONARY" in e for e in encodings["id"])


def test_parquet_options_write_vector_columns_plain_and_keep_the_other_columns_statistics(tmp_path):
    h = np.random.default_rng(0).random((50, 8), dtype=np.float32)
    table = pa.table({"id": pa.array(np.arange(50, 0, -1)), "h": to_fixed_list(h), "y": pa.array([1, 2] * 25)})
    options = parquet_options(table.schema, unique=("id",))
    assert options["use_dictionary"] == ["y"] and options["write_statistics"] == ["id", "y"]
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, **options)
    back = pq.read_table(path)
    np.testing.assert_array_equal(to_numpy_matrix(back.column("h")), h)
    assert back.column("id").to_pylist() == list(range(50, 0, -1))
    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunks = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    vector = chunks["h.list.element"]
    assert vector.compression == "UNCOMPRESSED" and not vector.is_stats_set
    assert not any("DICTIONARY" in e for e in vector.encodings + chunks["id"].encodings)
    ids = chunks["id"]
    assert ids.compression == "SNAPPY" and (ids.statistics.min, ids.statistics.max) == (1, 50)
    assert any("DICTIONARY" in e for e in chunks["y"].encodings)
