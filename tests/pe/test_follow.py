"""The refresh follower (pe/follow.py): a sequence of update files applied in batches gives the
store a precompute of the updated graph gives (files of a batch composed in order, including an
edge inserted then deleted, a feature set back, a vertex deleted then inserted again); malformed
files and files the graph refuses are dead-lettered and the stream goes on; a follower killed
between batches or between a batch's store commit and its checkpoint resumes with nothing
applied twice or lost."""

import json
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import assert_same_store, cheb_update, graph, model_of  # noqa: E402, F401

from sparkgnn.deadletter import read_dead_letters  # noqa: E402
from sparkgnn.errors import StalePEStore  # noqa: E402
from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.follow import BatchCounts, RefreshFollower  # noqa: E402
from sparkgnn.pe.follow_checkpoint import CHECKPOINT_FILE, JOURNAL_FILE, PENDING_FILE, read_checkpoint  # noqa: E402
from sparkgnn.pe.follow_state import FollowError, RunningFingerprint, compose  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.refresh import refresh_local  # noqa: E402


def updates_in_order(g):
    """Four updates, each valid against the graph the ones before it leave."""
    ids, d = g.ids, g.feature_dim
    one = np.ones(1, np.float32)
    new_id = int(ids.max()) + 1
    victim = int(ids[-1])  # deleted by the second, inserted again by the fourth
    e = 5  # an existing edge, deleted by the third
    return [
        GraphUpdate(  # an edge in, a vertex in, a feature changed
            edge_insert_src=ids[[3, 7]],
            edge_insert_dst=np.array([ids[17], new_id]),
            edge_insert_weight=np.ones(2, np.float32),
            vertex_insert_ids=np.array([new_id]),
            vertex_insert_x=np.full((1, d), 0.5, np.float32),
            feature_update_ids=ids[[40]],
            feature_update_x=np.ones((1, d), np.float32),
        ),
        GraphUpdate(  # the edge out again, the feature set back, a vertex out
            edge_delete_src=ids[[3]],
            edge_delete_dst=ids[[17]],
            edge_delete_weight=one,
            feature_update_ids=ids[[40]],
            feature_update_x=g.x[[40]],
            vertex_delete_ids=np.array([victim]),
        ),
        GraphUpdate(
            edge_delete_src=ids[g.edge_src[[e]]],
            edge_delete_dst=ids[g.edge_dst[[e]]],
            edge_delete_weight=g.weight[[e]],
            edge_insert_src=np.array([new_id]),
            edge_insert_dst=ids[[9]],
            edge_insert_weight=one,
        ),
        GraphUpdate(  # the deleted vertex back under its id, with an edge
            vertex_insert_ids=np.array([victim]),
            vertex_insert_x=np.zeros((1, d), np.float32),
            edge_insert_src=np.array([victim]),
            edge_insert_dst=ids[[11]],
            edge_insert_weight=one,
        ),
    ]


def final_graph(g, updates):
    for u in updates:
        g = apply(u, g).graph
    return g


def test_composed_updates_refresh_to_a_precompute_of_the_last_graph(graph, tmp_path):  # noqa: F811
    model = model_of("sage", graph.feature_dim, 2)
    root = str(tmp_path / "store")
    precompute_local(graph, model, root)
    updates = updates_in_order(graph)
    composed, g = None, graph
    for u in updates:
        step = apply(u, g)
        composed = step if composed is None else compose(composed, step, graph.x)
        g = step.graph
    assert 40 not in composed.feature_changed  # set back to its old value
    # the running fingerprint follows the change alone and agrees with hashing the graph whole
    running = RunningFingerprint.of(graph).advance(composed)
    assert running.graph is g and g.__dict__["fingerprint"] == final_graph(graph, updates).fingerprint
    refreshed, _ = refresh_local(graph, BatchCounts([u.counts() for u in updates]), model, root, applied=composed)
    want = precompute_local(g, model, str(tmp_path / "scratch"))
    assert refreshed.manifest["graph_fingerprint"] == g.fingerprint
    assert_same_store(refreshed, want, g.ids, 2)


def random_inserts(g, rng, count: int) -> GraphUpdate:
    """`count` weighted edge inserts between random vertices of `g`."""
    return GraphUpdate(
        edge_insert_src=rng.choice(g.ids, count),
        edge_insert_dst=rng.choice(g.ids, count),
        edge_insert_weight=np.ones(count, np.float32),
    )


def drop(folder, name: str, update: GraphUpdate | bytes, t: float) -> None:
    path = os.path.join(folder, name)
    if isinstance(update, bytes):
        with open(path, "wb") as fh:
            fh.write(update)
    else:
        update.write(path)
    os.utime(path, (t, t))  # arrival order


def test_batches_dead_letters_and_resumes_apply_every_file_once(graph, tmp_path, monkeypatch):  # noqa: F811
    model = model_of("gcn", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    updates = updates_in_order(graph)
    drop(inbox, "a.parquet", updates[0], 1000)
    drop(inbox, "b.parquet", b"not parquet", 1001)
    drop(inbox, "c.parquet", updates[1], 1002)

    def follower(size=3):
        return RefreshFollower(
            graph=graph, model=model, store=root, updates=inbox, state=state, max_batch_updates=size, max_latency_s=0
        )

    first = follower()
    ran = first.run(max_batches=1)
    assert [(p.batch, p.files, p.dead_letters) for p in ran] == [(1, 1, 0)]  # a.parquet holds 6 rows >= 3
    # killed between the second batch's store commit and its checkpoint: the rerun redoes it from its log
    second = follower()
    real = RefreshFollower._write_checkpoint
    calls = []

    def killed_at_commit(self):
        calls.append(self.checkpoint["pending"])
        if self.checkpoint["pending"] is None:
            raise KeyboardInterrupt("killed")
        real(self)

    monkeypatch.setattr(RefreshFollower, "_write_checkpoint", killed_at_commit)
    with pytest.raises(KeyboardInterrupt):
        second.run(max_batches=1)
    monkeypatch.undo()
    assert calls[0]["files"] == ["b.parquet", "c.parquet"]  # size bound: b counts 1 row, c 4 -> 5 >= 3
    drop(inbox, "d.parquet", updates[2], 1003)
    drop(inbox, "e.parquet", GraphUpdate(vertex_delete_ids=np.array([-7])), 1004)  # unknown vertex
    drop(inbox, "f.parquet", updates[3], 1005)
    third = follower(size=100)  # redoes batch 2 on start
    assert third.batches_done == 2 and third.checkpoint["pending"] is None
    ran = third.run(idle_timeout_s=0)
    assert [(p.batch, p.files, p.dead_letters) for p in ran] == [(3, 2, 1)]  # d and f composed in one batch
    want_graph = final_graph(graph, updates)
    assert third.graph.fingerprint == want_graph.fingerprint
    assert third.checkpoint["dead"] == ["b.parquet", "e.parquet"]
    dead = read_dead_letters(os.path.join(state, "dead"))
    assert [d["file"].rsplit("/", 1)[1] for d in dead] == ["b.parquet", "e.parquet"]
    assert "cannot read" in dead[0]["reason"] and "-7" in dead[1]["reason"]
    store = PEStore.open(root, model=model, graph=want_graph)
    assert store.base == third.store.base
    want = precompute_local(want_graph, model, str(tmp_path / "scratch"))
    assert_same_store(store, want, want_graph.ids, 2)
    applied = [name for b in read_checkpoint(state)["batches"] for name in b["applied"]]
    assert applied == ["a.parquet", "c.parquet", "d.parquet", "f.parquet"]  # each once, in order
    # a fourth start replays the log to the same version and finds nothing to do
    fourth = follower()
    assert fourth.graph.fingerprint == want_graph.fingerprint and fourth.poll(flush=True) is None
    with pytest.raises(FollowError, match="follows from graph"):
        RefreshFollower(graph=want_graph, model=model, store=root, updates=inbox, state=state)


def test_batches_held_in_memory_commit_as_one_version_and_survive_a_kill(graph, tmp_path, monkeypatch):  # noqa: F811
    """Batches between commits are held in memory (no store version per batch); a follower killed
    before the commit resumes by committing them, one killed inside the commit (version written,
    checkpoint not) finishes it; either way the store equals a precompute and no file is
    applied twice."""
    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    updates = updates_in_order(graph)

    def follower():
        return RefreshFollower(
            graph=graph, model=model, store=root, updates=inbox, state=state, max_batch_updates=1, commit_every_s=3600
        )

    first = follower()
    for i, u in enumerate(updates[:2]):
        drop(inbox, f"{i}.parquet", u, 1000 + i)
        progress = first.poll(flush=False)
        assert progress is not None and not progress.committed and progress.line().endswith("(held in memory)")
    assert first.held_rows() > 0 and first.committed_batches == 0
    g2 = final_graph(graph, updates[:2])
    assert first.graph.fingerprint == g2.fingerprint
    with pytest.raises(StalePEStore):  # nothing of the held batches reached the store yet
        PEStore.open(root, model=model, graph=g2)
    del first  # killed: its held rows are lost, its checkpoint names both batches done, none committed
    second = follower()  # commits the two batches on start, from the log
    assert second.committed_batches == 2 and second.held_rows() == 0
    assert_same_store(
        PEStore.open(root, model=model, graph=g2), precompute_local(g2, model, str(tmp_path / "p2")), g2.ids, 2
    )
    for i, u in enumerate(updates[2:], start=2):
        drop(inbox, f"{i}.parquet", u, 1000 + i)
        assert second.poll(flush=False) is not None
    real = RefreshFollower._write_checkpoint

    def killed_in_commit(self):
        if self.checkpoint["committed"] == 4:
            raise KeyboardInterrupt("killed")
        real(self)

    monkeypatch.setattr(RefreshFollower, "_write_checkpoint", killed_in_commit)
    with pytest.raises(KeyboardInterrupt):
        second.commit()
    monkeypatch.undo()
    third = follower()
    want_graph = final_graph(graph, updates)
    assert third.graph.fingerprint == want_graph.fingerprint and third.committed_batches == 4
    assert third.store.base == PEStore.open(root, model=model, graph=want_graph).base
    want = precompute_local(want_graph, model, str(tmp_path / "scratch"))
    assert_same_store(third.store, want, want_graph.ids, 2)
    applied = [name for b in read_checkpoint(state)["batches"] for name in b["applied"]]
    assert applied == ["0.parquet", "1.parquet", "2.parquet", "3.parquet"]


def test_a_commit_checks_the_new_version_without_the_held_one_again(graph, tmp_path, monkeypatch):  # noqa: F811
    """A commit's open trusts exactly the segments of the held version it lies on (checked on open)."""
    from sparkgnn.pe import store as store_module

    model, root, inbox = model_of("sage", graph.feature_dim, 2), str(tmp_path / "store"), str(tmp_path / "in")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    follower = RefreshFollower(graph=graph, model=model, store=root, updates=inbox, state=str(tmp_path / "st"))
    held, trusted, real = follower.store, [], store_module.damaged_parts
    spy = lambda base, manifest, verify, folders: trusted.append(folders) or real(base, manifest, verify, folders)  # noqa: E731
    monkeypatch.setattr(store_module, "damaged_parts", spy)
    drop(inbox, "0.parquet", updates_in_order(graph)[0], 1000)
    assert follower.poll(flush=True) is not None and follower.commit() and follower.store.base != held.base
    assert trusted == [store_module._segment_folders(held)] and trusted[0]


@pytest.mark.parametrize("torn", [PENDING_FILE, JOURNAL_FILE])
def test_a_torn_pending_checkpoint_falls_back_to_the_synced_one(graph, tmp_path, torn):  # noqa: F811
    """The per-batch checkpoint writes are not synced (checkpoint.pending.json and the journal's
    new line): either torn by a machine crash, the synced checkpoint (a commit) holds, the
    journal's lines past it are cut off, and the files named since are applied again from the
    update folder -- each once, the store equal to a precompute. The document a batch writes
    keeps its size (the batches are journal lines, one per batch)."""
    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    updates = updates_in_order(graph)

    def follower():
        return RefreshFollower(
            graph=graph, model=model, store=root, updates=inbox, state=state, max_batch_updates=1, commit_every_s=3600
        )

    def journal_lines():
        with open(os.path.join(state, JOURNAL_FILE), "rb") as fh:
            return fh.read().count(b"\n")

    first = follower()
    sizes = []
    for i, u in enumerate(updates):
        drop(inbox, f"{i}.parquet", u, 1000 + i)
        assert first.poll() is not None
        if i == 1:
            assert first.commit()  # synced: batches 1-2
        else:
            sizes.append(os.path.getsize(os.path.join(state, PENDING_FILE)))
        assert journal_lines() == i + (i == 1)  # batch i+1 is journaled by the next write
    assert abs(sizes[2] - sizes[1]) <= 2  # batches 3 and 4 (after the commit): no list grows
    with open(os.path.join(state, PENDING_FILE)) as fh, open(os.path.join(state, CHECKPOINT_FILE)) as synced:
        pending, synced_seq = json.load(fh), json.load(synced)["seq"]
    assert pending["pending"]["files"] == ["3.parquet"] and pending["seq"] > synced_seq
    assert pending["batches_done"] == 3 and "batches" not in pending
    with open(os.path.join(state, torn), "r+b") as fh:
        fh.truncate(os.path.getsize(os.path.join(state, torn)) - 5)  # torn
    del first
    second = follower()
    assert second.committed_batches == 2 and second.batches_done == 2 and journal_lines() == 2
    second.run(idle_timeout_s=0)
    want_graph = final_graph(graph, updates)
    assert second.graph.fingerprint == want_graph.fingerprint
    applied = [name for b in read_checkpoint(state)["batches"] for name in b["applied"]]
    assert applied == ["0.parquet", "1.parquet", "2.parquet", "3.parquet"]
    want = precompute_local(want_graph, model, str(tmp_path / "scratch"))
    assert_same_store(PEStore.open(root, model=model, graph=want_graph), want, want_graph.ids, 2)


def test_live_layer_holds_rows_by_id_over_the_committed_version(graph, tmp_path):  # noqa: F811
    """Held rows win over the committed ones, a later hold replaces an earlier one, a deleted id
    drops its held row (the committed row shows again: the graph no longer asks for it)."""
    from sparkgnn.pe.follow_state import LiveLayer

    model = model_of("sage", graph.feature_dim, 2)
    store = precompute_local(graph, model, str(tmp_path / "store"))
    live = LiveLayer(store, 1)
    ids = graph.ids[[4, 1, 9]]
    committed = store.lookup(ids, 1, states=True)
    w, sw = committed[0].shape[1], committed[1].shape[1]
    live.hold(graph.ids[[9, 1]], np.full((2, w), 7, np.float32), np.full((2, sw), 8, np.float32), np.zeros(0))
    live.hold(graph.ids[[1]], np.full((1, w), 3, np.float32), np.full((1, sw), 4, np.float32), np.zeros(0))
    h = live.read(ids, "h")
    assert np.array_equal(h[0], committed[0][0]) and np.all(h[1] == 3) and np.all(h[2] == 7)
    assert np.all(live.read(ids, "state")[1:] == [[4], [8]])
    live.hold(np.zeros(0, np.int64), np.zeros((0, w), np.float32), np.zeros((0, sw), np.float32), graph.ids[[9]])
    assert list(live.ids) == [graph.ids[1]] and np.array_equal(live.read(ids[2:], "h"), committed[0][2:])


def test_live_layer_patched_in_place_matches_a_reference_over_many_holds(graph, tmp_path):  # noqa: F811
    """Random holds (new ids, ids held before, the same id twice in a row) and deletes, past the
    buffers' first growth: ids, values_of and read equal a dict of the last row held per id."""
    from sparkgnn.pe.follow_state import LiveLayer

    model = model_of("sage", graph.feature_dim, 2)
    store = precompute_local(graph, model, str(tmp_path / "store"))
    live = LiveLayer(store, 1)
    w, sw = store.width(1), store.state_width(1)
    rng = np.random.default_rng(3)
    want: dict[int, float] = {}
    for step in range(60):
        ids = rng.choice(graph.ids, int(rng.integers(0, 60)), replace=False)
        gone = rng.choice(graph.ids, int(rng.integers(0, 4)), replace=False) if step % 3 == 0 else np.zeros(0)
        gone = np.setdiff1d(gone, ids).astype(np.int64)
        values = step + rng.random(len(ids)).astype(np.float32)
        live.hold(ids, np.repeat(values[:, None], w, 1), np.repeat(-values[:, None], sw, 1), gone)
        for i in gone.tolist():
            want.pop(i, None)
        want.update(zip(ids.tolist(), values.tolist(), strict=True))
    keys = np.array(sorted(want), np.int64)
    assert len(keys) > 256  # more rows held than the buffers' first capacity: they grew on the way
    assert np.array_equal(live.ids, keys)
    expect = np.array([want[i] for i in keys.tolist()], np.float32)
    assert np.array_equal(live.values_of["h"][:, 0], expect) and np.array_equal(live.values_of["state"][:, -1], -expect)
    assert np.array_equal(live.read(keys[::-1], "h")[:, -1], expect[::-1])
    others = np.setdiff1d(graph.ids, keys)[:5]
    assert np.array_equal(live.read(others, "h"), store.lookup(others, 1, states=True)[0])


def test_each_committed_version_is_published_with_its_graph(graph, tmp_path):  # noqa: F811
    """A follower publishes the version it starts from and each version it commits (pe/published.py):
    the published graph (a delta over the version published before it) is the committed graph and
    opens the committed store version; batches held in memory are not published; publish=False
    publishes nothing."""
    from sparkgnn.pe.published import is_delta, latest, open_graph

    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    updates = updates_in_order(graph)

    def follower(publish: bool = True):
        return RefreshFollower(
            graph=graph,
            model=model,
            store=root,
            updates=inbox,
            state=state,
            max_batch_updates=1,
            commit_every_s=3600,
            publish=publish,
        )

    quiet = follower(publish=False)
    drop(inbox, "0.parquet", updates[0], 1000)
    assert quiet.poll(flush=False) is not None and quiet.commit()
    assert latest(root) is None and quiet.published is None
    first = follower()  # publishes the committed version it starts from
    g1 = final_graph(graph, updates[:1])
    start = first.published
    assert latest(root) == start and start["graph_fingerprint"] == g1.fingerprint and not is_delta(start["graph"])
    drop(inbox, "1.parquet", updates[1], 1001)
    assert first.poll(flush=False) is not None and not first.history[-1].committed
    assert latest(root)["graph_fingerprint"] == g1.fingerprint  # held in memory: not published
    assert first.commit()
    record = latest(root)
    g2 = final_graph(graph, updates[:2])
    assert record["graph_fingerprint"] == g2.fingerprint and record["sequence"] == 2
    assert record["store"] == first.store.base
    assert is_delta(record["graph"])
    served = open_graph(record["graph"])
    assert served.fingerprint == g2.fingerprint and np.array_equal(served.ids, g2.ids)
    assert PEStore.open(root, model=model, graph=served).base == record["store"]


def test_a_restart_replays_only_the_batches_after_the_newest_published_full_graph(graph, tmp_path, monkeypatch):  # noqa: F811
    """A restarted follower reads the newest full graph directory it published at or before its
    last commit (here the one a compaction writes after batch 2) instead of replaying the log from
    the base graph: it reads only the later batches' logged files and reaches the same graph; a
    directory that is not the graph it is named for is not used (the log is replayed instead)."""
    from sparkgnn.pe import published

    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    updates = updates_in_order(graph)

    def follower():
        return RefreshFollower(
            graph=graph, model=model, store=root, updates=inbox, state=state, max_batch_updates=1, commit_every_s=3600
        )

    first = follower()
    for i, u in enumerate(updates):
        drop(inbox, f"{i}.parquet", u, 1000 + i)
        assert first.poll(flush=False) is not None
        if i == 1:
            assert first.commit()
            full = published.write_full(root, first.committed_graph)  # what the compaction job writes
    assert first.commit() and first.committed_batches == 4
    read = []
    real_read = GraphUpdate.read
    monkeypatch.setattr(GraphUpdate, "read", staticmethod(lambda path: read.append(path) or real_read(path)))
    second = follower()
    want = final_graph(graph, updates)
    assert second.replayed_from == 2 and second.graph.fingerprint == want.fingerprint
    assert [os.path.basename(p) for p in read] == ["2.parquet", "3.parquet"]
    assert second.poll(flush=True) is None
    g2 = final_graph(graph, updates[:2])
    other = published.graph_dir(root, g2.fingerprint)
    os.rename(full, full + ".moved")
    os.rename(published.graph_dir(root, graph.fingerprint), other)  # the base graph under g2's name
    read.clear()
    third = follower()
    assert third.replayed_from == 0 and third.graph.fingerprint == want.fingerprint and len(read) == 4


def test_chebconv_follower_refreshes_the_out_neighbours_of_changed_sources(graph, tmp_path):  # noqa: F811
    """ChebConv normalises by its sources' OUT-degree, so an edge change at u changes the message
    of every out-edge of u. The follower plans through its EdgeIndex (pe/edge_index.py): a first
    batch that deletes and inserts at the vertices with the most out-edges, with a self loop in and
    one out (the index remapped), then a batch of inserts only out of the new top source, a self
    loop among them (the index's tail): the store equals a precompute of the updated graph."""
    model = model_of("chebconv", graph.feature_dim, 2)  # K=3: 4 rounds
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    first = cheb_update(graph, seed=3)
    g1 = apply(first, graph).graph
    out_degree = np.bincount(g1.edge_src[g1.edge_src != g1.edge_dst], minlength=g1.num_nodes)
    top = int(np.argmax(out_degree))
    ids = g1.ids
    second = GraphUpdate(
        edge_insert_src=ids[[top, top, top]],
        edge_insert_dst=ids[[top, (top + 1) % g1.num_nodes, (top + 2) % g1.num_nodes]],
        edge_insert_weight=np.float32([0.5, 1.25, 2.0]),
    )
    drop(inbox, "0.parquet", first, 1000)
    drop(inbox, "1.parquet", second, 1001)
    follower = RefreshFollower(
        graph=graph, model=model, store=root, updates=inbox, state=state, max_batch_updates=1, max_latency_s=0
    )
    ran = follower.run(idle_timeout_s=0)
    assert [(p.batch, p.files, p.dead_letters) for p in ran] == [(1, 1, 0), (2, 1, 0)]
    want_graph = apply(second, g1).graph
    assert follower.graph.fingerprint == want_graph.fingerprint
    want = precompute_local(want_graph, model, str(tmp_path / "scratch"))
    assert_same_store(follower.store, want, want_graph.ids, model.num_rounds)


def test_chains_are_compacted_in_the_background_and_stay_deltas(graph, tmp_path, monkeypatch):  # noqa: F811
    """With short chain bounds, a follower committing a version per batch never writes a layer
    whole on its commit path: a compacted segment written by its background job is what the later
    deltas lie on (each still a delta over the version before it, as a delta-patching service
    needs), the chains stay bounded, the published chain is rebased on a full directory written
    beside, and the store equals a precompute of the final graph."""
    from sparkgnn.pe import follow_compact, published, versions

    monkeypatch.setattr(versions, "MAX_SEGMENTS", 4)  # background compaction from 2 segments
    monkeypatch.setattr(follow_compact, "MAX_SEGMENTS", 4)  # ... and the synchronous fallback past 4
    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    f = RefreshFollower(graph=graph, model=model, store=root, updates=inbox, state=state, commit_every_s=0)
    rng = np.random.default_rng(3)
    manifests, records = [f.store.manifest], []
    for i in range(10):
        drop(inbox, f"{i}.parquet", random_inserts(graph, rng, 3), 1000 + i)
        assert f.poll(flush=True).committed
        assert f.close(timeout_s=60)  # the background job done before the next commit (deterministic)
        manifests.append(f.store.manifest)
        records.append(f.published)
    for key in ("layer=1", "layer=2"):
        lengths = [len(versions.bases(m, key)) for m in manifests[1:]]
        assert all(0 < n < 4 for n in lengths), lengths  # never whole, never past the bound
        assert all(versions.delta_over(a, b, key) for a, b in zip(manifests[:-1], manifests[1:], strict=True))
        assert any(versions.bases(m, key)[0].get("compacted") for m in manifests[1:])
    assert any(r["full"] != records[0]["full"] for r in records) and all(
        published.is_delta(r["graph"]) for r in records
    )
    assert max(len(r["chain"]) for r in records) < 2 * published.COMPACT_EVERY
    want = precompute_local(f.graph, model, str(tmp_path / "scratch"))
    assert_same_store(PEStore.open(root, model=model, graph=f.graph), want, f.graph.ids, 2)
    assert published.open_graph(records[-1]["graph"]).fingerprint == f.graph.fingerprint


def test_versions_written_in_the_background_while_batches_run_each_equal_a_precompute(graph, tmp_path, monkeypatch):  # noqa: F811
    """With background commits, a version due after a batch is written on another thread while
    the next batches run (slowed here so several do): those batches read the rows they need from
    the held rows and the version being replaced, each version committed equals a precompute of
    its graph, the rows held since a commit's snapshot stay held for the next one, and the last
    store equals a precompute of the final graph with every batch counted once."""
    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    os.makedirs(inbox)
    precompute_local(graph, model, root)
    write_version = RefreshFollower._write_version
    ended = []

    def slow_write(self, pending):
        ended.append(pending.new)
        time.sleep(0.3)
        return write_version(self, pending)

    monkeypatch.setattr(RefreshFollower, "_write_version", slow_write)
    f = RefreshFollower(graph=graph, model=model, store=root, updates=inbox, state=state, commit_every_s=1e-6)
    assert f.background_commit
    rng = np.random.default_rng(7)
    overlapped, graphs = 0, []
    for i in range(8):
        drop(inbox, f"{i}.parquet", random_inserts(graph, rng, 4), 1000 + i)
        in_flight = f._in_flight is not None
        progress = f.poll(flush=True)
        assert progress is not None and not progress.committed
        overlapped += in_flight and f._in_flight is not None  # this batch ran beside a commit
        graphs.append(f.graph)
        time.sleep(0.15)  # about two batches per commit
    assert overlapped >= 2 and len(ended) >= 2
    assert f.commit() and f._in_flight is None and f.committed_batches == f.batches_done == 8
    f.close()
    for k, version_graph in enumerate([*ended, f.graph]):
        store = PEStore.open(root, model=model, graph=version_graph)
        want = precompute_local(version_graph, model, str(tmp_path / f"scratch{k}"))
        assert_same_store(store, want, version_graph.ids, model.num_rounds)
    assert graphs[-1] is f.graph and read_checkpoint(state)["committed"] == 8
