"""Contract with the models package: real Model.plan_info() output compiles, and the plan's
per-layer fields are what the executor reads. (Needs torch + PyG; the planner itself does not.)"""

import json

import pytest

torch = pytest.importorskip("torch")
gnn = pytest.importorskip("torch_geometric.nn")
models = pytest.importorskip("sparkgnn.models")

from sparkgnn.planner import STRATEGIES, Plan, PlanError, choose_partitions, compile  # noqa: E402

STATS = {
    "num_vertices": 200_000,
    "num_edges": 2_000_000,
    "feature_dim": 128,
    "partitions": 4,
    "mirror_rows": 300_000,
    "combine_rows": 500_000,
    "in_mirror_rows": 300_000,
    "max_partition_edges": 600_000,
}


@pytest.fixture(scope="module")
def infos():
    torch.manual_seed(0)
    pyg = {
        "gcn": gnn.GCN(128, 64, 2, 16),
        "sage": gnn.GraphSAGE(128, 64, 2, 16),
        "gin": gnn.GIN(128, 64, 2, 16),
        "gat": gnn.GAT(128, 16, 2, 16, heads=4),
    }
    return {name: models.Model.from_pyg(m).plan_info() for name, m in pyg.items()}


@pytest.mark.parametrize("name", ["gcn", "sage", "gin", "gat"])
@pytest.mark.parametrize("strategy", ["auto", *STRATEGIES])
def test_plan_info_compiles(infos, name, strategy):
    layers = infos[name]
    json.dumps(layers)  # plain data
    partitions = choose_partitions(layers, STATS["num_vertices"], STATS["num_edges"], 128, 2, 4 << 30)
    assert partitions == 2
    task = {
        "strategy": strategy,
        "partitions": 4,
        "cores": 2,
        "memory_per_task_bytes": 4 << 30,
        "ids": None,
        "fuse": True,
        "native_aggregates": True,  # as if the session had the JVM module (pushdown is costed)
    }
    if name == "gat" and strategy == "pushdown":
        with pytest.raises(PlanError, match="reads the destination"):
            compile(layers, STATS, task)
        return
    plan = compile(layers, STATS, task)
    assert plan.partitions == 4 and len(plan.layers) == len(layers)
    for layer in plan.layers:
        assert layer.strategy in STRATEGIES and isinstance(layer.pre_transform, bool)
        if strategy != "auto":
            assert layer.strategy == strategy
    assert Plan.from_json(plan.to_json()).to_dict() == plan.to_dict()
    if name == "gat" and strategy == "combine":
        assert plan.layers[1].passes == 2
