"""The follower's update files (pe/follow_files.py): files read once on arrival and applied in
groups give exactly the graph of applying each file on its own in order, with the same files
refused; a file refers to vertices only as of its turn (a group never lets an earlier file use a
later one's vertex); the files a published delta holds are merged to fewer that give the same
graph; and a follower fed many small files in one batch commits a store equal to a precompute."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import assert_same_store, graph, model_of  # noqa: E402, F401

from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.pe import PEStore  # noqa: E402
from sparkgnn.pe.follow import RefreshFollower  # noqa: E402
from sparkgnn.pe.follow_files import apply_files, merged_for_publication, read_arrival  # noqa: E402
from sparkgnn.pe.follow_state import compose  # noqa: E402
from sparkgnn.pe.local import precompute_local  # noqa: E402
from sparkgnn.pe.published import is_delta, latest, open_graph  # noqa: E402


def edges(src, dst, weight=True) -> GraphUpdate:
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    return GraphUpdate(
        edge_insert_src=src, edge_insert_dst=dst, edge_insert_weight=np.ones(len(src), np.float32) if weight else None
    )


def stream(g):
    """(name, update or bytes) in arrival order: runs of edge inserts after mixed files, a bad
    file inside a run, an edge to a vertex only a LATER file inserts, and a file that is not
    Parquet."""
    ids, d = g.ids, g.feature_dim
    new, later = int(ids.max()) + 1, int(ids.max()) + 2
    return [
        (
            "a",
            GraphUpdate(
                vertex_insert_ids=[new],
                vertex_insert_x=np.ones((1, d), np.float32),
                edge_insert_src=ids[[1]],
                edge_insert_dst=[new],
                edge_insert_weight=np.ones(1, np.float32),
            ),
        ),
        ("b", edges(ids[[2, 3]], [new, int(ids[4])])),  # joins a: uses a's vertex
        ("c", edges(ids[[5]], [-99])),  # joins, but unknown endpoint: the group is refused, c alone
        ("d", edges(ids[[6]], ids[[7]])),
        ("e", edges([later], ids[[8]])),  # `later` does not exist yet: refused
        (
            "f",
            GraphUpdate(
                vertex_insert_ids=[later],
                vertex_insert_x=np.zeros((1, d), np.float32),
                edge_delete_src=ids[g.edge_src[[0]]],
                edge_delete_dst=ids[g.edge_dst[[0]]],
                edge_delete_weight=g.weight[[0]],
            ),
        ),
        ("g", edges([later, later], ids[[9, 10]])),  # joins f
        ("h", b"not parquet"),
        ("i", GraphUpdate(feature_update_ids=ids[[11]], feature_update_x=np.full((1, d), 2.0, np.float32))),
        ("j", edges(ids[[12]], ids[[13]])),
    ]


def write(folder, items):
    os.makedirs(folder, exist_ok=True)
    for name, update in items:
        path = os.path.join(folder, name)
        if isinstance(update, bytes):
            with open(path, "wb") as fh:
                fh.write(update)
        else:
            update.write(path)


def one_by_one(g, items):
    """The graph and applied names of applying each file alone, in order (the reference)."""
    applied = []
    for name, update in items:
        if isinstance(update, bytes):
            continue
        try:
            g = apply(update, g).graph
        except Exception:  # noqa: BLE001 - refused: skipped, as the follower dead-letters it
            continue
        applied.append(name)
    return g, applied


def test_grouped_files_give_the_graph_of_each_file_applied_in_order(graph, tmp_path):  # noqa: F811
    items = stream(graph)
    folder = str(tmp_path / "in")
    write(folder, items)
    names = [name for name, _ in items]
    arrivals = {name: read_arrival(os.path.join(folder, name), 0.0) for name in names}
    assert arrivals["h"].table is None and arrivals["b"].inserts_only and not arrivals["a"].inserts_only
    steps, refused = apply_files(graph, names, arrivals, lambda name: os.path.join(folder, name))
    want, applied = one_by_one(graph, items)
    assert [name for name, _ in refused] == ["c", "e", "h"]
    assert "-99" in dict(refused)["c"] and "cannot read" in dict(refused)["h"]
    assert [s.names for s in steps] == [["a"], ["b"], ["d"], ["f", "g"], ["i", "j"]]
    assert [n for s in steps for n in s.names] == applied
    composed = steps[0].applied
    for step in steps[1:]:
        composed = compose(composed, step.applied, graph.x)
    assert composed.graph.fingerprint == want.fingerprint
    assert np.array_equal(composed.graph.ids, want.ids) and np.array_equal(composed.graph.edge_src, want.edge_src)
    # without the tables read on arrival every file is read and applied alone: the same graph
    alone, refused_alone = apply_files(graph, names, {}, lambda name: os.path.join(folder, name))
    assert [s.names for s in alone] == [[n] for n in applied] and refused_alone == refused
    assert alone[-1].applied.graph.fingerprint == want.fingerprint


def test_updates_merged_for_publication_apply_to_the_same_graph(graph):  # noqa: F811
    items = [(n, u) for n, u in stream(graph) if n in ("a", "b", "d", "f", "g", "i", "j")]
    updates = [u for _, u in items]
    merged = merged_for_publication(updates)
    assert len(merged) == 3  # a+b+d, f+g, i+j
    unweighted = merged_for_publication([edges([1], [2], weight=False), updates[1]])
    assert len(unweighted) == 2  # weights on one and not the other: not merged
    want, got = graph, graph
    for u in updates:
        want = apply(u, want).graph
    for u in merged:
        got = apply(u, got).graph
    assert got.fingerprint == want.fingerprint


def test_a_batch_of_many_small_files_commits_a_store_equal_to_a_precompute(graph, tmp_path):  # noqa: F811
    model = model_of("sage", graph.feature_dim, 2)
    root, inbox, state = str(tmp_path / "store"), str(tmp_path / "in"), str(tmp_path / "state")
    precompute_local(graph, model, root)
    rng = np.random.default_rng(0)
    items = [(f"u{k:03d}.parquet", edges(rng.choice(graph.ids, 3), rng.choice(graph.ids, 3))) for k in range(30)]
    items.insert(10, ("u009b.parquet", edges(graph.ids[[0]], [-5])))  # refused inside the run
    write(inbox, items)
    for k, (name, _u) in enumerate(items):
        os.utime(os.path.join(inbox, name), (1000 + k, 1000 + k))
    follower = RefreshFollower(graph=graph, model=model, store=root, updates=inbox, state=state, publish=True)
    progress = follower.poll(flush=True)
    assert progress is not None and (progress.files, progress.dead_letters, progress.updates) == (30, 1, 90)
    assert os.stat(os.path.join(state, "log", "1", "u000.parquet")).st_nlink == 2  # linked, not copied
    assert follower.commit()
    want_graph, _applied = one_by_one(graph, items)
    assert follower.graph.fingerprint == want_graph.fingerprint
    want = precompute_local(want_graph, model, str(tmp_path / "scratch"))
    assert_same_store(PEStore.open(root, model=model, graph=want_graph), want, want_graph.ids, 2)
    published = latest(root)  # a delta holding ONE update file, the 30 merged, that gives the graph
    assert published["graph_fingerprint"] == want_graph.fingerprint and is_delta(published["graph"])
    assert [n for n in os.listdir(published["graph"]) if n.endswith(".parquet")] == ["000000.parquet"]
    assert open_graph(published["graph"]).fingerprint == want_graph.fingerprint
    follower.close()
