"""CGP partitions behind the messenger: the JSON + Arrow codec round-trips a partition job, and
the partitions served through the DL handler op (in-process transport) and by two real
`sparkgnn-worker` processes (local[2]) answer exactly what the in-process executor answers; with
edge attributes, EXACT through the messenger equals FULL."""

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine
from sparkgnn.serving.cgp_wire import pack, unpack
from sparkgnn.serving.spark_cgp import use_messenger_cgp


def test_codec_round_trip():
    job = {
        "layer": 2,
        "kind": "partials",
        "weight": None,
        "width": 7,
        "old": np.array([True, False]),
        "tgt": np.arange(3, dtype=np.int64),
        "given": np.arange(12, dtype=np.float32).reshape(3, 4),
        "stats_new": {"gcn_degree": np.array([1.5, 2.0], np.float32)},
        "states": [np.ones((2, 3), np.float32), np.zeros((0, 3), np.float32)],
    }
    manifest, tables = pack(job)
    back = unpack(manifest, tables)
    assert back["layer"] == 2 and back["kind"] == "partials" and back["weight"] is None
    np.testing.assert_array_equal(back["old"], job["old"])
    assert back["old"].dtype == np.bool_
    np.testing.assert_array_equal(back["given"], job["given"])
    np.testing.assert_array_equal(back["stats_new"]["gcn_degree"], job["stats_new"]["gcn_degree"])
    assert [s.shape for s in back["states"]] == [(2, 3), (0, 3)]
    with pytest.raises(TypeError, match="cannot send"):
        pack({"x": object()})


@pytest.mark.parametrize("workers", ["inprocess", "local[2]"])
def test_messenger_partitions_equal_in_process(skewed_workload, tmp_path, workers):
    wl = skewed_workload
    G = wl.graph_G
    model = Model.from_pyg(pyg_model("gcn", G.feature_dim, 3, seed=3))
    model.save(str(tmp_path / "model.pt"))
    write_graph_dir(G, str(tmp_path / "g"))
    store = precompute_local(G, model, str(tmp_path / "store"))
    local = QueryEngine(G, model, mode="exact", store=store)
    remote = QueryEngine(G, model, mode="exact", store=store, context=local.context, partitions=3)
    in_process = QueryEngine(G, model, mode="exact", store=store, context=local.context, partitions=3)
    executor = use_messenger_cgp(
        remote, workers, str(tmp_path / "g"), str(tmp_path / "model.pt"), str(tmp_path / "models")
    )
    try:
        for r in wl.requests:
            a, b = remote.answer(r), local.answer(r)
            assert np.abs(a.h - b.h).max() <= 1e-5 * np.abs(b.h).max()
            np.testing.assert_array_equal(a.pred, b.pred)
            assert a.breakdown["bytes_fetched"] == b.breakdown["bytes_fetched"]
            c = in_process.answer(r)  # same kernel, same P: same cross-partition bytes
            for key in ("partial_bytes", "allgather_bytes"):
                assert a.breakdown[key] == c.breakdown[key], key
    finally:
        executor.close()


def test_messenger_partitions_carry_edge_attributes_and_exact_equals_full(tmp_path):
    """GINE -> GAT(edge_dim) over a graph whose edges carry attributes, requests with attributes:
    the partitions' jobs ship each edge's attribute rows (cgp_wire keeps their shape), and EXACT
    through in-process messenger workers equals FULL."""
    import dataclasses

    from serving_testkit import skewed_graph
    from test_serving_reuse_modes import _attr_requests, _EdgeFeatureNet

    base = skewed_graph()
    rng = np.random.default_rng(1)
    G = dataclasses.replace(base, edge_attr=rng.normal(size=(base.num_edges, 3)).astype(np.float32))
    model = Model.from_pyg(_EdgeFeatureNet.build(G.feature_dim, 3, gat_first=False))
    model.save(str(tmp_path / "model.pt"))
    write_graph_dir(G, str(tmp_path / "g"))
    store = precompute_local(G, model, str(tmp_path / "store"))
    full = QueryEngine(G, model, mode="full")
    remote = QueryEngine(G, model, mode="exact", store=store, context=full.context, partitions=3)
    executor = use_messenger_cgp(
        remote, "inprocess", str(tmp_path / "g"), str(tmp_path / "model.pt"), str(tmp_path / "models")
    )
    try:
        for r in _attr_requests(G, 3, seed=2, into_g=True):
            a, b = remote.answer(r), full.answer(r)
            assert np.abs(a.h - b.h).max() <= 1e-5 * np.abs(b.h).max(), r.request_id
        assert executor.jobs > 0  # the layers ran on the workers
    finally:
        executor.close()
