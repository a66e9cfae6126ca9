"""The three CGP executors (in-process with partitions=P, Spark tasks, messenger workers) run the
same partition kernel (serving/cgp_kernel.py) and so report the same exchanged bytes for the same
request, and those bytes are the cross-partition bytes of the kernel's definition, checked here
against a hand computation on a 4-vertex graph."""

import numpy as np
import pytest
from serving_testkit import pyg_model

from sparkgnn.graph import GraphData, write_graph_dir
from sparkgnn.models import Model
from sparkgnn.pe.local import precompute_local
from sparkgnn.serving import QueryEngine, Request
from sparkgnn.serving.spark_cgp import use_messenger_cgp, use_spark_cgp


def tiny_graph() -> GraphData:
    """Vertices 0..3 (owners with P=2: 0, 1, 0, 1), the cycle 0->1->2->3->0, 3 features."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    return GraphData.from_edge_ids(
        [0, 1, 2, 3], x, [0, 1, 2, 3], [1, 2, 3, 0], y=np.zeros(4, np.int64), split=np.array(["train"] * 4), name="tiny"
    )


# EXACT, GCN (sum of raw messages, self loops added), 2 layers 3 -> 16 -> 5, P = 2, one query q
# (query 0: owner 0) with request edges 1 -> q and q -> 1. Vertex 1 (owner 1) gains an in-edge,
# so its h^(1) changes and layer 1 recomputes it from its stored state:
#   layer 1, targets [q, 1], state width 3:
#     partition 0 owns q -> q, q -> 1 (NEW): rows {q, 1}; row 1 goes to owner 1       1 row
#     partition 1 owns 1 -> q, 1 -> 1 (NEW): rows {q, 1}; row q goes to owner 0       1 row
#                      1 -> 1 (OLD, its GCN degree changed): row 1, owned           0
#     stored state of 1: read by its owner                                          0
#     all-gather: 2 targets x 16 wide x 4 bytes x (P - 1) = 128
#   layer 2, targets [q], state width 16:
#     partition 0 owns q -> q: row q, owned; partition 1 owns 1 -> q: row q crosses   1 row
#     all-gather: 1 target x 5 wide x 4 bytes x (P - 1) = 20
PARTIAL_BYTES = (1 + 1) * 3 * 4 + 1 * 16 * 4  # 88
ALLGATHER_BYTES = 2 * 16 * 4 + 1 * 5 * 4  # 148


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("cgp_bytes")
    G = tiny_graph()
    model = Model.from_pyg(pyg_model("gcn", G.feature_dim, 2, seed=3))
    model.save(str(d / "model.pt"))
    write_graph_dir(G, str(d / "g"))
    store = precompute_local(G, model, str(d / "store"))
    request = Request("r0", [100], np.array([[0.5, -0.2, 0.1]], np.float32), [1, 100], [100, 1])
    return d, G, model, store, request


def _exchanged(answer) -> tuple:
    return answer.breakdown["partial_bytes"], answer.breakdown["allgather_bytes"]


def test_three_executors_report_the_hand_computed_bytes(spark, tiny_setup):
    d, G, model, store, r = tiny_setup
    assert [c.state_width(False) for c in model.convs] == [3, 16]  # the widths used above
    single = QueryEngine(G, model, mode="exact", store=store)
    ref = single.answer(r)
    assert _exchanged(ref) == (0, 0)  # P = 1 exchanges nothing
    in_process = QueryEngine(G, model, mode="exact", store=store, context=single.context, partitions=2)
    answers = {"in-process": in_process.answer(r)}
    on_spark = QueryEngine(G, model, mode="exact", store=store, context=single.context, partitions=2)
    use_spark_cgp(on_spark, spark, str(d / "g"), str(d / "model.pt"))
    answers["spark"] = on_spark.answer(r)
    remote = QueryEngine(G, model, mode="exact", store=store, context=single.context, partitions=2)
    executor = use_messenger_cgp(remote, "inprocess", str(d / "g"), str(d / "model.pt"), str(d / "models"))
    try:
        answers["messenger"] = remote.answer(r)
    finally:
        executor.close()
    for name, a in answers.items():
        assert _exchanged(a) == (PARTIAL_BYTES, ALLGATHER_BYTES), name
        assert a.breakdown["bytes_fetched"] == ref.breakdown["bytes_fetched"], name
        assert np.abs(a.h - ref.h).max() <= 1e-5 * np.abs(ref.h).max(), name
