"""Published store versions (pe/published.py): a published graph directory reads back as the
graph it was published from (same fingerprint, ids, features, edges), the pointer names the
latest publication, publishing the latest again changes nothing, only the newest directories are
kept, and a malformed pointer or a non-local store is refused in one line. Deltas: a chain of them
opened from a held graph or cold equals the graph published whole, a full directory is written
again at compaction (or, written beside, rebases the chain), a held graph outside the chain falls
back to the full publication (logged), and a changed update file or a delta naming paths
outside its publications is refused."""

import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_refresh import graph  # noqa: E402, F401

from sparkgnn.graph.reader import read_graph_dir  # noqa: E402
from sparkgnn.graph.updates import GraphUpdate, apply  # noqa: E402
from sparkgnn.pe import published  # noqa: E402


def versions_of(g, n: int) -> list:
    """`g` and n-1 successors, each with one more edge."""
    out = [g]
    for i in range(n - 1):
        step = GraphUpdate(
            edge_insert_src=g.ids[[i]], edge_insert_dst=g.ids[[i + 1]], edge_insert_weight=np.ones(1, np.float32)
        )
        out.append(apply(step, out[-1]).graph)
    return out


def test_a_published_graph_reads_back_and_the_pointer_names_the_latest(graph, tmp_path):  # noqa: F811
    root = str(tmp_path / "store")
    assert published.latest(root) is None
    first = published.publish(root, graph, store_base="v1")
    assert first["graph"] == published.graph_dir(root, graph.fingerprint) and first["sequence"] == 1
    back = read_graph_dir(first["graph"])
    assert back.fingerprint == graph.fingerprint and np.array_equal(back.ids, graph.ids)
    assert np.array_equal(back.x, graph.x) and np.array_equal(back.src_ids, graph.src_ids)
    assert np.array_equal(back.dst_ids, graph.dst_ids) and np.array_equal(back.weight, graph.weight)
    assert published.publish(root, graph, store_base="v1") == first  # already the latest
    g2 = versions_of(graph, 2)[1]
    second = published.publish(f"file:{root}", g2, store_base="v2")
    assert second["sequence"] == 2 and published.latest(root) == second
    assert read_graph_dir(second["graph"]).fingerprint == g2.fingerprint


def test_only_the_newest_graphs_are_kept(graph, tmp_path):  # noqa: F811
    root = str(tmp_path / "store")
    gs = versions_of(graph, 4)
    for i, g in enumerate(gs):
        published.publish(root, g, store_base=f"v{i}", keep=2)
        folder = published.graph_dir(root, g.fingerprint)
        os.utime(folder, (1000 + i, 1000 + i))  # publication order, whatever the clock's resolution
    left = sorted(os.listdir(os.path.dirname(published.graph_dir(root, "x"))))
    assert left == sorted(g.fingerprint for g in gs[-2:])
    with pytest.raises(ValueError, match="keep must be >= 1"):
        published.publish(root, graph, store_base="v", keep=0)


def test_pruning_keeps_a_live_writers_staging_and_removes_a_dead_ones(graph, tmp_path):  # noqa: F811
    """A hidden folder being written by a running process (the follower's background full
    directory) survives a publication's pruning; one left by a process that is gone does not."""
    import subprocess

    root = str(tmp_path / "store")
    gs = versions_of(graph, 3)
    published.publish(root, gs[0], store_base="v0")
    graphs = os.path.dirname(published.graph_dir(root, "x"))
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = os.path.join(graphs, published._staging_name())  # this process's name
    left = os.path.join(graphs, f"{published._TMP_PREFIX}{gone.pid}-abc")
    older = os.path.join(graphs, f"{published._TMP_PREFIX}0123abcd")  # no pid: an older release's
    for folder in (live, left, older):
        os.makedirs(folder)
    published.publish(root, gs[1], store_base="v1", keep=1)  # a whole publication prunes
    assert os.path.isdir(live) and not os.path.exists(left) and not os.path.exists(older)


def test_a_malformed_pointer_and_a_remote_store_are_refused(graph, tmp_path):  # noqa: F811
    root = str(tmp_path / "store")
    os.makedirs(published.published_dir(root))
    with open(os.path.join(published.published_dir(root), published.LATEST_FILE), "w") as fh:
        fh.write('{"graph": 3}')
    with pytest.raises(published.PublishError, match="is not a publication"):
        published.latest(root)
    with pytest.raises(published.PublishError, match="only for a store on the local filesystem"):
        published.latest("s3://bucket/store")


def delta_chain(g0, tmp_path, n: int):
    """`g0` and n successors, each from one logged update file (edge inserts and a delete, a
    feature update, a vertex insert), with the Delta publishing each over the one before."""
    from sparkgnn.pe.follow_state import RunningFingerprint

    rng = np.random.default_rng(5)
    running = RunningFingerprint.of(g0)
    graphs, deltas = [g0], []
    for i in range(n):
        g = running.graph
        update = GraphUpdate(
            edge_insert_src=g.ids[[i, i + 2]],
            edge_insert_dst=g.ids[[i + 1, i + 3]],
            edge_insert_weight=np.ones(2, np.float32) if g.weight is not None else None,
            edge_delete_src=g.src_ids[[i]],  # an edge of the base graph, deleted
            edge_delete_dst=g.dst_ids[[i]],
            feature_update_ids=g.ids[[i + 4]],
            feature_update_x=rng.standard_normal((1, g.feature_dim)).astype(np.float32),
            vertex_insert_ids=np.array([int(g.ids.max()) + 1]),
            vertex_insert_x=rng.standard_normal((1, g.feature_dim)).astype(np.float32),
        )
        path = update.write(str(tmp_path / f"u{i}.parquet"))
        before = (running.vertex_sum, running.edge_sum)
        running = running.advance(apply(update, g))
        deltas.append(published.Delta(g.fingerprint, before, (running.vertex_sum, running.edge_sum), (str(path),)))
        graphs.append(running.graph)
    return graphs, deltas


def same_graph(a, b) -> bool:
    return (
        a.fingerprint == b.fingerprint
        and np.array_equal(a.ids, b.ids)
        and np.array_equal(a.x, b.x)
        and np.array_equal(a.src_ids, b.src_ids)
        and np.array_equal(a.dst_ids, b.dst_ids)
    )


def test_a_delta_chain_applied_equals_the_full_publication_and_compacts(graph, tmp_path):  # noqa: F811
    root = str(tmp_path / "store")
    graphs, deltas = delta_chain(graph, tmp_path, 4)
    first = published.publish(root, graphs[0], store_base="v0", delta=deltas[0])  # nothing to apply it to
    assert first["chain"] == [] and first["graph"] == published.graph_dir(root, graphs[0].fingerprint)
    records = [first]
    for i in (1, 2, 3):
        records.append(published.publish(root, graphs[i], store_base=f"v{i}", delta=deltas[i - 1], compact_every=2))
    assert [len(r["chain"]) for r in records] == [0, 1, 2, 0]  # the 4th: a full directory again (compaction)
    third = records[2]
    assert published.is_delta(third["graph"]) and not published.is_delta(records[3]["graph"])
    assert not os.path.isdir(published.graph_dir(root, graphs[2].fingerprint))  # no graph written for a delta
    cold = published.open_graph(third["graph"])  # the full directory and the chain replayed
    assert same_graph(cold, graphs[2])
    written = str(tmp_path / "written")
    from sparkgnn.graph import write_graph_dir

    write_graph_dir(graphs[2], written)
    assert same_graph(published.open_graph(third["graph"], held=graphs[1]), read_graph_dir(written))
    assert same_graph(published.open_graph(third["graph"], held=graphs[0]), graphs[2])  # a skipped version
    assert same_graph(published.open_graph(records[3]["graph"]), graphs[3])


def test_a_delta_opened_again_over_the_same_graph_is_not_replayed(graph, tmp_path):  # noqa: F811
    """The front end and an in-process worker both open each followed delta: the second open
    returns the graph the first built, without reading its update files again."""
    root = str(tmp_path / "store")
    graphs, deltas = delta_chain(graph, tmp_path, 1)
    published.publish(root, graphs[0], store_base="v0")
    record = published.publish(root, graphs[1], store_base="v1", delta=deltas[0])
    first = published.open_graph(record["graph"], held=graphs[0])
    assert same_graph(first, graphs[1])
    os.remove(os.path.join(record["graph"], "000000.parquet"))  # a replay would fail now
    assert published.open_graph(record["graph"], held=graphs[0]) is first
    with pytest.raises(published.PublishError, match="No such file"):
        published.open_graph(record["graph"])  # cold: the chain replayed from the full directory


def test_a_broken_chain_falls_back_to_the_full_publication_or_is_refused(graph, tmp_path, caplog):  # noqa: F811
    root = str(tmp_path / "store")
    graphs, deltas = delta_chain(graph, tmp_path, 2)
    published.publish(root, graphs[0], store_base="v0")
    record = published.publish(root, graphs[1], store_base="v1", delta=deltas[0])
    stranger = versions_of(graph, 2)[1]  # held but in no chain: a gap
    with caplog.at_level("WARNING", logger="sparkgnn.pe.published"):
        assert same_graph(published.open_graph(record["graph"], held=stranger), graphs[1])
    assert "not in its chain (a gap)" in caplog.text
    # a delta over another base than the latest publication is published whole
    skipped = published.publish(root, graphs[2], store_base="v2", delta=published.Delta("0" * 64, (0, 0), (0, 0), ()))
    assert skipped["chain"] == [] and not published.is_delta(skipped["graph"])
    # a changed update file is refused from the held graph and from the full directory alike
    update_file = os.path.join(record["graph"], "000000.parquet")
    with open(update_file, "ab") as fh:
        fh.write(b"x")
    caplog.clear()
    with caplog.at_level("WARNING", logger="sparkgnn.pe.published"):
        with pytest.raises(published.PublishError, match="is not the file published"):
            published.open_graph(record["graph"], held=graphs[0])
    assert "reading the full publication" in caplog.text
    # a delta naming a graph outside its own publications folder is refused before anything is read
    meta_path = os.path.join(record["graph"], published.DELTA_FILE)
    with open(meta_path) as fh:
        meta = json.load(fh)
    with open(meta_path, "w") as fh:
        json.dump({**meta, "full": str(tmp_path)}, fh)
    with pytest.raises(published.PublishError, match="outside the publications"):
        published.open_graph(record["graph"])


def test_a_full_directory_written_beside_rebases_the_chain(graph, tmp_path):  # noqa: F811
    """A full directory written off the publishing path (write_full) of a graph in the latest
    chain is what the next delta's chain starts from (the links after it), read back equal cold
    and from a held graph; a directory of a graph outside the chain is not used."""
    root = str(tmp_path / "store")
    graphs, deltas = delta_chain(graph, tmp_path, 4)
    records = [published.publish(root, graphs[0], store_base="v0")]
    for i in (1, 2):
        records.append(published.publish(root, graphs[i], store_base=f"v{i}", delta=deltas[i - 1]))
    assert published.compaction_due(records[2], compact_every=4) and not published.compaction_due(records[0])
    full = published.write_full(root, graphs[1])  # written beside, not published
    assert published.latest(root)["graph_fingerprint"] == graphs[2].fingerprint
    third = published.publish(root, graphs[3], store_base="v3", delta=deltas[2], full=full)
    assert third["full"] == full and [link["graph_fingerprint"] for link in third["chain"]] == [
        graphs[2].fingerprint,
        graphs[3].fingerprint,
    ]
    assert published.is_delta(third["graph"])
    assert same_graph(published.open_graph(third["graph"]), graphs[3])
    assert same_graph(published.open_graph(third["graph"], held=graphs[2]), graphs[3])
    outside = published.write_full(root, graphs[0])  # not in the latest chain any more
    _more, extra = delta_chain(graphs[3], tmp_path / "more", 1)
    fourth = published.publish(root, _more[1], store_base="v4", delta=extra[0], full=outside)
    assert fourth["full"] == full and len(fourth["chain"]) == 3
