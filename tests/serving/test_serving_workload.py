"""The OMEGA 8.1 workload: 25% pool of test vertices, G without it, request edges (with their
attributes when G's edges carry them), determinism."""

import json

import numpy as np
import pytest

from sparkgnn.graph import read_graph_dir, write_graph_dir
from sparkgnn.serving.request import read_requests
from sparkgnn.serving.workload import WorkloadError, main, make_workload, read_labels


def test_pool_is_a_quarter_of_test_and_removed_from_g(cora, cora_workload):
    wl = cora_workload
    test_ids = cora.ids[cora.mask("test")]
    assert len(wl.pool) == round(0.25 * len(test_ids))
    assert np.isin(wl.pool, test_ids).all()
    G = wl.graph_G
    assert not np.isin(G.ids, wl.pool).any()
    assert G.num_nodes == cora.num_nodes - len(wl.pool)
    G.validate()  # no edge names a removed vertex
    assert set(wl.labels) == set(wl.pool.tolist())


def test_requests_are_valid_and_carry_all_their_edges(cora, cora_workload):
    wl = cora_workload
    assert [r.batch_size for r in wl.requests] == [64, 64, 128, 128]
    src, dst = cora.src_ids, cora.dst_ids
    pool = set(wl.pool.tolist())
    for r in wl.requests:
        r.validate(wl.graph_G)  # also: every edge touches a query
        q = set(r.qid.tolist())
        assert q <= pool and len(q) == r.batch_size
        # expected: edges touching the request whose other end is in G or the request
        touch = np.isin(src, r.qid) | np.isin(dst, r.qid)
        other_ok = (np.isin(src, r.qid) | ~np.isin(src, wl.pool)) & (np.isin(dst, r.qid) | ~np.isin(dst, wl.pool))
        want = sorted(zip(src[touch & other_ok].tolist(), dst[touch & other_ok].tolist(), strict=True))
        assert sorted(zip(r.src.tolist(), r.dst.tolist(), strict=True)) == want
        np.testing.assert_array_equal(r.x, cora.x[cora.index_of(r.qid)])
    # both directions appear (Cora is symmetric) and edges among queries are kept somewhere
    r = wl.requests[-1]
    assert np.isin(r.src, r.qid).any() and np.isin(r.dst, r.qid).any()


def test_seeded_determinism(cora):
    a, b = make_workload(cora, (64,), 2, seed=3), make_workload(cora, (64,), 2, seed=3)
    c = make_workload(cora, (64,), 2, seed=4)
    np.testing.assert_array_equal(a.pool, b.pool)
    for ra, rb in zip(a.requests, b.requests, strict=True):
        np.testing.assert_array_equal(ra.qid, rb.qid)
        np.testing.assert_array_equal(ra.src, rb.src)
    assert not np.array_equal(a.pool, c.pool)


def test_batch_larger_than_pool_is_refused(cora):
    with pytest.raises(WorkloadError, match="exceeds the query pool"):
        make_workload(cora, (1024,), 1, seed=0)


def test_cli_writes_graph_requests_labels(tmp_path, skewed):
    write_graph_dir(skewed, str(tmp_path / "src"))
    assert (
        main(
            [
                "--graph",
                str(tmp_path / "src"),
                "--out",
                str(tmp_path / "wl"),
                "--batch-sizes",
                "8,16",
                "--requests",
                "2",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    wl = make_workload(read_graph_dir(str(tmp_path / "src")), (8, 16), 2, seed=1)
    G = read_graph_dir(str(tmp_path / "wl" / "graph"))
    assert G.fingerprint == wl.graph_G.fingerprint
    back = read_requests(str(tmp_path / "wl" / "requests"))
    assert sorted(r.request_id for r in back) == sorted(r.request_id for r in wl.requests)
    assert read_labels(str(tmp_path / "wl" / "labels.parquet")) == wl.labels
    assert json.loads((tmp_path / "wl" / "workload.json").read_text())["pool_size"] == len(wl.pool)


def test_edge_attributes_stay_on_g_and_ride_with_each_requests_edges(tmp_path, skewed):
    import dataclasses

    # attribute column 0 is the edge's position in the source graph: each row names its edge
    attr = np.stack([np.arange(skewed.num_edges), np.ones(skewed.num_edges)], axis=1).astype(np.float32)
    data = dataclasses.replace(skewed, edge_attr=attr)
    wl = make_workload(data, (8,), 2, seed=1)
    G = wl.graph_G
    assert G.edge_attr_dim == 2
    source = G.edge_attr[:, 0].astype(np.int64)
    np.testing.assert_array_equal(G.ids[G.edge_src], data.src_ids[source])
    np.testing.assert_array_equal(G.ids[G.edge_dst], data.dst_ids[source])
    for r in wl.requests:
        r.validate(G)  # also: edge_attr of G's width
        assert r.edge_attr is not None and len(r.edge_attr) == r.num_edges > 0
        source = r.edge_attr[:, 0].astype(np.int64)
        np.testing.assert_array_equal(r.src, data.src_ids[source])
        np.testing.assert_array_equal(r.dst, data.dst_ids[source])
    wl_dir = str(tmp_path / "wl")
    from sparkgnn.serving.workload import write_workload

    write_workload(wl, wl_dir)
    assert read_graph_dir(str(tmp_path / "wl" / "graph")).fingerprint == G.fingerprint
    back = {r.request_id: r for r in read_requests(str(tmp_path / "wl" / "requests"))}
    for r in wl.requests:
        np.testing.assert_array_equal(back[r.request_id].edge_attr, r.edge_attr)
