"""Row-level store versions (pe/versions.py): a refreshed layer written as a delta holds only the
recomputed rows and tombstones, reads back merged (newest segment wins, tombstones drop the id,
a later segment can bring an id back), the chain is bounded by compaction, and an older version
deleted under a newer one is reported by name instead of read as a silent mix."""

import os
import shutil
import sys

import numpy as np
import pyarrow as pa
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import assert_same_store, model_of, random_update  # noqa: E402

from sparkgnn.errors import DamagedPEStore  # noqa: E402
from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.pe import PEStore, layout, versions  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402


def segment(ids, values, width=2, fixed=True):
    """A layer table: rows of `values` (None = tombstone) as fixed_size_list or list<float>."""
    typ = pa.list_(pa.float32(), width) if fixed else pa.list_(pa.float32())
    h = pa.array([None if v is None else [float(v)] * width for v in values], typ)
    return pa.table({"id": pa.array(ids, pa.int64()), "h": h})


def as_dict(table) -> dict:
    pairs = zip(table["id"].to_pylist(), table["h"].to_pylist(), strict=True)
    return {int(i): (None if h is None else h[0]) for i, h in pairs}


def test_merge_keeps_the_newest_row_drops_tombstones_and_allows_reinsertion():
    base = segment([1, 2, 3, 4], [1, 2, 3, 4])
    first = segment([2, 3, 9], [20, None, 90], fixed=False)  # update 2, delete 3, insert 9 (Spark's list type)
    second = segment([3, 9, 4], [300, None, 40])  # 3 comes back, 9 goes again, 4 updated
    merged = versions.merge_tables([base, first, second])
    assert as_dict(merged) == {1: 1.0, 2: 20.0, 3: 300.0, 4: 40.0}
    assert as_dict(versions.merge_tables([base, first])) == {1: 1.0, 2: 20.0, 4: 4.0, 9: 90.0}


@pytest.fixture(scope="module")
def graph():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "serving"))
    from serving_testkit import skewed_graph

    return skewed_graph()


def small_update(graph, seed: int) -> GraphUpdate:
    """A few edges inserted and deleted, one vertex deleted: layer 1 of a 2-layer model changes
    far less than half the graph, so it is committed as a delta."""
    rng = np.random.default_rng(seed)
    ids = graph.ids
    keep = np.flatnonzero(graph.edge_src != graph.edge_dst)
    gone = rng.choice(keep, 3, replace=False)
    victim = ids[-1]  # an isolated-or-not vertex at the end; its edges must not be deleted separately
    touches = (ids[graph.edge_src[gone]] == victim) | (ids[graph.edge_dst[gone]] == victim)
    gone = gone[~touches]
    return GraphUpdate(
        edge_insert_src=rng.choice(ids[:-1], 3),
        edge_insert_dst=rng.choice(ids[:-1], 3),
        edge_insert_weight=np.full(3, 0.5, np.float32),
        edge_delete_src=ids[graph.edge_src[gone]],
        edge_delete_dst=ids[graph.edge_dst[gone]],
        edge_delete_weight=graph.weight[gone],
        vertex_delete_ids=[victim],
    )


def test_a_small_refresh_writes_only_the_changed_rows_and_reads_back_whole(graph, tmp_path, monkeypatch):
    model = model_of("sage", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root)
    update = small_update(graph, seed=1)
    store, report = refresh_local(graph, update, model, root)
    key = layout.layer_key(1)
    assert [b["version"] for b in versions.bases(store.manifest, key)] == [old.manifest["graph_fingerprint"]]
    own = layout.read_table(store.base, store.manifest, key)  # the delta attempt alone
    assert own.num_rows == report.layers[0]["targets"] + 1  # recomputed rows + one tombstone
    assert own.column("h").null_count == 1
    # own_rows reads the same delta attempt through the manifest's segments; delta_over holds
    # over the version refreshed from only (not the other way round, not over itself)
    assert versions.own_rows(store.base, store.manifest, key, ()).equals(own.select(["id", "h"]))
    with monkeypatch.context() as patched:  # the dataset reader (large segments) reads the same rows
        patched.setattr(versions, "SMALL_SEGMENT_BYTES", -1)
        assert versions.own_rows(store.base, store.manifest, key, ()).equals(own.select(["id", "h"]))
    assert versions.delta_over(old.manifest, store.manifest, key)
    assert not versions.delta_over(store.manifest, old.manifest, key)
    assert not versions.delta_over(store.manifest, store.manifest, key)
    new_graph = apply(update, graph).graph
    assert store.manifest["rows"]["1"] == new_graph.num_nodes
    reopened = PEStore.open(root, model=model, graph=new_graph)
    scratch = precompute_local(new_graph, model, str(tmp_path / "scratch"))
    assert_same_store(reopened, scratch, new_graph.ids, 2)
    assert sorted(reopened.table(1).ids.tolist()) == sorted(new_graph.ids.tolist())  # the deleted vertex is gone


def test_deleting_the_version_a_delta_lies_on_is_reported_by_name(graph, tmp_path):
    model = model_of("gcn", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root)
    update = small_update(graph, seed=2)
    refresh_local(graph, update, model, root)
    shutil.rmtree(old.base)
    with pytest.raises(DamagedPEStore, match=r"base segment of version " + old.manifest["graph_fingerprint"][:12]):
        PEStore.open(root, model=model, graph=apply(update, graph).graph)
    # a store opened earlier vouches for its own segments (a delta swap's held version): not listed again
    trusted = PEStore.open(root, model=model, graph=apply(update, graph).graph, verify="sizes", trusted_from=old)
    assert trusted.manifest["graph_fingerprint"] == apply(update, graph).graph.fingerprint


def test_a_chain_of_refreshes_is_compacted_before_it_passes_the_bound(graph, tmp_path, monkeypatch):
    monkeypatch.setattr(versions, "MAX_SEGMENTS", 3)
    model = model_of("gin", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    current, lengths = graph, []
    for seed in range(4):
        update = small_update(current, seed=10 + seed)
        store, _ = refresh_local(current, update, model, root)
        current = apply(update, current).graph
        lengths.append(len(versions.bases(store.manifest, layout.layer_key(1))))
    assert max(lengths) <= versions.MAX_SEGMENTS - 1
    assert 0 in lengths[1:]  # a compaction happened
    scratch = precompute_local(current, model, str(tmp_path / "scratch"))
    assert_same_store(store, scratch, current.ids, 2)


def test_a_large_change_writes_the_layer_whole(graph, tmp_path):
    model = model_of("sage", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    store, report = refresh_local(graph, random_update(graph, seed=5, edges=400), model, root)
    large = [s for s in report.layers if s["targets"] >= versions.COMPACT_FRACTION * store.manifest["rows"]["1"]]
    assert large  # the update reaches more than half the graph at some layer
    for stats in large:
        assert not versions.bases(store.manifest, layout.layer_key(stats["layer"]))
        assert stats["committed"].startswith("whole")


def test_a_delta_staged_by_tasks_commits_and_reads_back_merged_and_a_foreign_base_is_refused(graph, tmp_path):
    """The Spark refresh's commit (PEWriter.commit_staged_delta): its tasks write the changed rows
    and a tombstone per deleted vertex into the staged attempt; committed, the layer reads back
    as the old layer with them applied. A base under another root, or a layer nobody staged, is
    refused."""
    import pyarrow.parquet as pq

    from sparkgnn.arrowvec import to_list
    from sparkgnn.pe import PEWriter

    model = model_of("sage", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    old = precompute_local(graph, model, root)
    update = small_update(graph, seed=3)
    new_graph = apply(update, graph).graph
    victim = int(graph.ids[-1])  # small_update deletes it
    changed = new_graph.ids[:5]
    writer = PEWriter(root, new_graph, model, with_states=True)
    elsewhere = precompute_local(graph, model, str(tmp_path / "other"))
    with pytest.raises(ValueError, match="a delta lies on a version under the same root"):
        writer.commit_staged_delta(1, elsewhere, old.width(1), old.state_width(1), rows=new_graph.num_nodes)
    with pytest.raises(ValueError, match="was not staged"):
        writer.commit_staged_delta(1, old, old.width(1), old.state_width(1), rows=new_graph.num_nodes)
    rng = np.random.default_rng(7)
    written = {}
    for l in (1, 2):
        h = rng.standard_normal((len(changed), old.width(l))).astype(np.float32)
        s = rng.standard_normal((len(changed), old.state_width(l))).astype(np.float32)
        folder = writer.stage_layer(l)
        # two tasks' files: the second holds the tombstone (null h and state)
        pq.write_table(
            pa.table({"id": pa.array(changed[:2]), "h": to_list(h[:2]), "state": to_list(s[:2])}),
            os.path.join(folder, "part=0.parquet"),
        )
        h_type = to_list(h[:1]).type
        pq.write_table(
            pa.table(
                {
                    "id": pa.array([*changed[2:], victim], pa.int64()),
                    "h": pa.concat_arrays([to_list(h[2:]), pa.nulls(1, h_type)]),
                    "state": pa.concat_arrays([to_list(s[2:]), pa.nulls(1, h_type)]),
                }
            ),
            os.path.join(folder, "part=1.parquet"),
        )
        writer.commit_staged_delta(l, old, old.width(l), old.state_width(l), rows=new_graph.num_nodes)
        written[l] = (h, s)
    writer.finish()
    store = PEStore.open(root, model=model, graph=new_graph)
    rest = new_graph.ids[5:]
    for l, (h, s) in written.items():
        assert [b["version"] for b in versions.bases(store.manifest, layout.layer_key(l))] == [
            old.manifest["graph_fingerprint"]
        ]
        got_h, got_s = store.lookup(changed, l, states=True)
        np.testing.assert_array_equal(got_h, h)
        np.testing.assert_array_equal(got_s, s)
        np.testing.assert_array_equal(store.lookup(rest, l)[0], old.lookup(rest, l)[0])
        assert sorted(store.table(l).ids.tolist()) == sorted(new_graph.ids.tolist())  # the victim is gone
