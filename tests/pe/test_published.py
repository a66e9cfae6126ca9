"""Published store versions (pe/published.py): a published graph directory reads back as the
graph it was published from (same fingerprint, ids, features, edges), the pointer names the
latest publication, publishing the latest again changes nothing, only the newest directories are
kept, and a malformed pointer or a non-local store is refused in one line."""

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


def test_a_malformed_pointer_and_a_remote_store_are_refused(graph, tmp_path):  # noqa: F811
    root = str(tmp_path / "store")
    os.makedirs(published.published_dir(root))
    with open(os.path.join(published.published_dir(root), published.LATEST_FILE), "w") as fh:
        fh.write('{"graph": 3}')
    with pytest.raises(published.PublishError, match="is not a publication"):
        published.latest(root)
    with pytest.raises(published.PublishError, match="only for a store on the local filesystem"):
        published.latest("s3://bucket/store")
