"""A refresh piece's inputs without Spark (engine/refresh/routing.py, partition.py): the update routed by the
round-0 tasks themselves (edge rows by destination owner, vertex rows to the owner and to every
holder, unroutable rows to piece 0, the sources a piece lacks as extra ids), a worker's cached
update re-read when rewritten at the same path and refused when it changes during a refresh, the
owners' features files (found mask, row order, labels, a rewritten file read again), and a
piece's foreign features left out until a computation reads them (fill_x)."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkgnn.engine.refresh import partition, routing, rundir
from sparkgnn.engine.refresh.partition import build_piece, fill_x
from sparkgnn.engine.refresh.routing import owner_rows, route_update
from sparkgnn.engine.refresh.rundir import RunContext
from sparkgnn.engine.routing import owner_partition
from sparkgnn.errors import GraphUpdateError

P = 2
IDS = np.arange(12, dtype=np.int64)
# src -> dst; with P = 2 piece 0 owns 2, 4, 5, 8 and holds 1, 3, 6, 7 as foreign sources
EDGES = [(1, 2), (3, 2), (6, 4), (4, 5), (7, 8), (2, 8), (2, 0), (5, 1), (0, 3), (8, 6), (9, 7), (10, 9), (11, 10)]
X_TYPE = pa.list_(pa.float32())


def features(i: int) -> list[float]:
    return [float(i), i + 0.5, -float(i), 1.0]


def _held(part: int) -> np.ndarray:
    owned = IDS[owner_partition(IDS, P) == part]
    sources = [s for s, d in EDGES if d in set(owned.tolist())]
    return np.union1d(owned, sources)


def _write_pieces(pieces: str, x_of=features) -> None:
    """The layout pieces.py builds, written with pyarrow: vertices (x null for a foreign one),
    in-edges of the owned vertices, and each part's owners' features file."""
    for part in range(P):
        held = _held(part)
        owned = owner_partition(held, P) == part
        vertices = pa.table(
            {
                "id": pa.array(held),
                "x": pa.array([x_of(int(i)) if o else None for i, o in zip(held, owned, strict=True)], X_TYPE),
                "y": pa.array(held % 3),
                "owned": pa.array(owned),
            }
        )
        edges = [(s, d) for s, d in EDGES if owner_partition(np.array([d]), P)[0] == part]
        edge_table = pa.table(
            {"src": pa.array([s for s, _ in edges], pa.int64()), "dst": pa.array([d for _, d in edges], pa.int64())}
        )
        rundir.write_piece_file(os.path.join(pieces, "vertices", f"part={part}", "piece.parquet"), vertices)
        rundir.write_piece_file(os.path.join(pieces, "edges", f"part={part}", "piece.parquet"), edge_table)
        mine = held[owned]
        table = pa.table(
            {"id": pa.array(mine), "x": pa.array([x_of(int(i)) for i in mine], X_TYPE), "y": pa.array(mine % 3)}
        )
        partition.write_features(pieces, part, table)


def _write_update(path: str, rows: list[dict]) -> None:
    columns = {
        "kind": pa.string(),
        "src": pa.int64(),
        "dst": pa.int64(),
        "weight": pa.float32(),
        "node": pa.int64(),
        "x": X_TYPE,
    }
    pq.write_table(pa.table({name: pa.array([r.get(name) for r in rows], t) for name, t in columns.items()}), path)


def _context(tmp_path, update: str) -> RunContext:
    run_dir, pieces = str(tmp_path / "run"), str(tmp_path / "pieces")
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "run.json"), "w") as out:
        json.dump({"feature_dim": 4, "weighted": False, "vertex_columns": ["y"]}, out)
    if not os.path.exists(pieces):
        _write_pieces(pieces)
    return RunContext(run_dir, pieces, P, "", "", (), update_path=update, update_files=routing.file_marks(update))


NEW = 12  # an inserted vertex (owner_partition(12, 2) == 0) whose edge goes into piece 0
UPDATE = [
    {"kind": "edge_insert", "src": 9, "dst": 4},  # 9: not held by piece 0 -> an extra id there
    {"kind": "edge_insert", "src": NEW, "dst": 5},
    {"kind": "vertex_insert", "node": NEW, "x": features(NEW)},
    {"kind": "edge_delete", "src": 1, "dst": 2},
    {"kind": "feature_update", "node": 3, "x": [-1.0] * 4},  # owned by 1, held by 0 as a source
    {"kind": "feature_update", "node": 10, "x": [-2.0] * 4},  # owned by 1, not held by 0
    {"kind": "vertex_delete", "node": 11},  # owned by 1, not held by 0
]
BAD = [
    {"kind": "bogus", "node": 4},
    {"kind": "feature_update", "x": [0.0] * 4},  # no node
    {"kind": "edge_insert", "src": 4},  # no dst
]


def _rows(table: pa.Table) -> set:
    return {(r["kind"], r["src"], r["dst"], r["node"], r["owned"]) for r in table.to_pylist()}


def test_route_update_sends_edges_to_the_dst_owner_vertex_rows_to_owner_and_holders(tmp_path):
    path = str(tmp_path / "update.parquet")
    _write_update(path, UPDATE + BAD)
    ctx = _context(tmp_path, path)
    routed, extra = route_update(ctx, 0, _held(0))
    assert extra.tolist() == [9, NEW]
    assert _rows(routed) == {
        ("edge_insert", 9, 4, None, False),
        ("edge_insert", NEW, 5, None, False),
        ("vertex_insert", None, None, NEW, True),  # piece 0 owns 12
        ("edge_delete", 1, 2, None, False),
        ("feature_update", None, None, 3, False),  # a holder's copy
        ("bogus", None, None, 4, False),  # the rows no piece can be chosen for: piece 0 names them
        ("feature_update", None, None, None, False),
        ("edge_insert", 4, None, None, False),
    }
    routed, extra = route_update(ctx, 1, _held(1))
    assert extra.tolist() == []
    assert _rows(routed) == {
        ("feature_update", None, None, 3, True),
        ("feature_update", None, None, 10, True),
        ("vertex_delete", None, None, 11, True),
    }


def test_an_update_rewritten_at_the_same_path_is_read_again_and_one_changed_mid_run_refused(tmp_path):
    path = str(tmp_path / "update.parquet")
    _write_update(path, UPDATE[:1])
    first = _context(tmp_path, path)
    assert len(route_update(first, 0, _held(0))[0]) == 1
    _write_update(path, UPDATE)  # the next refresh's update, same path, same Python worker
    second = _context(tmp_path, path)
    assert _rows(route_update(second, 0, _held(0))[0]) >= {("edge_delete", 1, 2, None, False)}
    with pytest.raises(GraphUpdateError, match="changed while the refresh ran"):
        route_update(first, 0, _held(0))  # the first refresh's tasks would see other rows


def test_owner_rows_returns_found_rows_in_the_order_asked_and_reads_a_rewritten_file_again(tmp_path):
    ctx = _context(tmp_path, str(tmp_path / "none"))
    asked = np.array([8, 0, 99, 2, 3, 13], np.int64)  # 99 and 13: no owner holds them
    found, rows = owner_rows(ctx, asked)
    assert found.tolist() == [True, True, False, True, True, False]
    assert rows.column("id").to_pylist() == [8, 0, 2, 3]
    assert rows.column("x").to_pylist() == [features(i) for i in (8, 0, 2, 3)]
    assert rows.column("y").to_pylist() == [8 % 3, 0, 2, 0]
    _write_pieces(ctx.pieces_dir, x_of=lambda i: [float(i) * 2] * 4)  # the layout rebuilt under its name
    partition.write_features(  # with one more row: the file's size differs whatever its mtime
        ctx.pieces_dir,
        0,
        pa.table(
            {
                "id": pa.array([2, 4, 5, 8, 12], pa.int64()),
                "x": pa.array([[1.0] * 4] * 5, X_TYPE),
                "y": pa.array([0] * 5, pa.int64()),
            }
        ),
    )
    found, rows = owner_rows(ctx, np.array([12, 0], np.int64))
    assert found.tolist() == [True, True]
    assert rows.column("x").to_pylist() == [[1.0] * 4, [0.0] * 4]


def test_a_piece_holds_foreign_features_only_once_fill_x_reads_them_from_their_owners(tmp_path):
    path = str(tmp_path / "update.parquet")
    _write_update(path, UPDATE)
    ctx = _context(tmp_path, path)
    piece = build_piece(ctx, 0)
    old, new = piece.old, piece.new
    assert piece.extra.tolist() == [9, NEW]
    assert old.ids.tolist() == list(range(1, 10))  # held 1..8, and 9 fetched from its owner (12 is new)
    known = dict(zip(old.ids.tolist(), piece.known_old.tolist(), strict=True))
    # owned, the extra source and the feature-updated vertex (its old row decides whether it
    # changed) are real; the other foreign sources hold zeros
    assert [i for i, k in known.items() if not k] == [1, 6, 7]
    assert not old.x[[0, 5, 6]].any()
    np.testing.assert_array_equal(old.x[old.ids == 3][0], features(3))
    new_known = dict(zip(new.ids.tolist(), piece.known_new.tolist(), strict=True))
    assert [i for i, k in new_known.items() if not k] == [1, 6, 7]
    fill_x(ctx, piece, np.array([0]), new=False)  # vertex 1 of the old graph only
    np.testing.assert_array_equal(old.x[0], features(1))
    assert piece.known_old[0] and not piece.known_new[new.ids == 1].any()
    fill_x(ctx, piece, np.arange(new.num_nodes), new=True)
    expected = {i: features(i) for i in new.ids.tolist()}
    expected[3] = [-1.0] * 4
    np.testing.assert_array_equal(new.x, np.array([expected[i] for i in new.ids.tolist()], np.float32))
    assert piece.known_new.all() and piece.known_old[[0, 5, 6]].all()  # read through the old rows
    np.testing.assert_array_equal(old.x, np.array([features(i) for i in old.ids.tolist()], np.float32))
