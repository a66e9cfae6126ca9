"""linkpred/pairs.py: an id file (--sources / --candidates) is read as its distinct ids, and a file
with a null id, no rows or no id column is refused in one line naming it."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.linkpred.pairs import PairsError, read_ids


def _write(tmp_path, name: str, table: pa.Table) -> str:
    path = str(tmp_path / name)
    pq.write_table(table, path)
    return path


def test_read_ids_gives_the_distinct_ids_and_refuses_bad_files(spark, tmp_path):
    good = _write(tmp_path, "good.parquet", pa.table({"id": pa.array([3, 1, 3, 2], pa.int32())}))
    frame = read_ids(spark, good, "--sources")
    assert sorted(r.id for r in frame.collect()) == [1, 2, 3]
    assert dict(frame.dtypes)["id"] == "bigint"
    cases = {
        "null.parquet": (pa.table({"id": pa.array([1, None], pa.int64())}), "has a null (or non-integer) id"),
        "empty.parquet": (pa.table({"id": pa.array([], pa.int64())}), "holds no ids"),
        "other.parquet": (pa.table({"node": pa.array([1], pa.int64())}), "lacks an 'id' column (has node)"),
    }
    for name, (table, why) in cases.items():
        path = _write(tmp_path, name, table)
        with pytest.raises(PairsError, match=r"^--sources .*" + why.replace("(", r"\(").replace(")", r"\)")):
            read_ids(spark, path, "--sources")
