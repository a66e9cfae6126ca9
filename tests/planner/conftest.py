"""Factories for planner inputs: plan_info-shaped layer dicts, Spark-shaped graph stats, tasks.

Plain data only (the planner never sees torch or Spark), so these tests need no SparkSession.
"""

import pytest


def layer(
    index,
    in_dim,
    out_dim,
    *,
    kind="sage",
    aggregator="mean",
    src=None,
    pre=None,
    state_extra=1,
    dst_width=0,
    needs_dst=False,
    can_pre=True,
    decomposable=True,
    weight=False,
    required_stats=(),
    range_wise=False,
    message_scaled=True,
):
    """A layer dict as Model.plan_info() writes it. `src` / `pre` are the raw / pre-transformed
    source payload widths (defaults: in_dim / out_dim); states are message width + state_extra
    (mean keeps (sum, count))."""
    src = in_dim if src is None else src
    pre = out_dim if pre is None else pre
    return {
        "index": index,
        "kind": kind,
        "in_dim": in_dim,
        "out_dim": out_dim,
        "aggregator": aggregator,
        "aggregator_options": {},
        "aggregator_linear": True,  # extra keys plan_info may add
        "src_width": {"raw": src, "pre_transform": pre},
        "dst_width": dst_width,
        "msg_width": {"raw": src, "pre_transform": pre},
        "state_width": {"raw": src + state_extra, "pre_transform": pre + state_extra},
        "needs_dst_in_message": needs_dst,
        "can_pre_transform": can_pre,
        "self_loops": "none",
        "uses_edge_weight": weight,
        "required_stats": list(required_stats),
        "decomposable": decomposable,
        "range_wise": range_wise,
        "message_scaled": message_scaled and not needs_dst,
    }


def gat_layer(index, in_dim, out_dim, heads=4):
    """GAT: W·h per head + a_src logits travel with the source; a_dst logits are the dst payload;
    state per head = (max logit, sum exp, weighted sum)."""
    width = heads * out_dim
    d = layer(
        index,
        in_dim,
        width,
        kind="gat",
        aggregator="softmax",
        src=in_dim,
        pre=width + heads,
        dst_width=heads,
        needs_dst=True,
    )
    d["state_width"] = {"raw": in_dim * heads + 2 * heads, "pre_transform": width + 2 * heads}
    return d


def stats(num_vertices=200_000, num_edges=2_000_000, feature_dim=128, partitions=4, **extra):
    base = {
        "num_vertices": num_vertices,
        "num_edges": num_edges,
        "feature_dim": feature_dim,
        "partitions": partitions,
        "mirror_rows": 100_000,
        "combine_rows": 500_000,
        "in_mirror_rows": 100_000,
        "max_partition_edges": num_edges // max(partitions, 1),
    }
    base.update(extra)
    return base


def task(strategy="auto", **extra):
    base = {
        "strategy": strategy,
        "partitions": None,
        "cores": 2,
        "memory_per_task_bytes": 8 << 30,
        "ids": None,
        "fuse": True,
    }
    base.update(extra)
    return base


def sage_model(dims=(128, 64, 16), **kw):
    return [layer(i, a, b, **kw) for i, (a, b) in enumerate(zip(dims, dims[1:], strict=False))]


@pytest.fixture
def make():
    """The factories, as one fixture: make.layer(...), make.stats(...), make.task(...), ..."""

    class Make:
        pass

    m = Make()
    m.layer, m.gat_layer, m.stats, m.task, m.sage_model = layer, gat_layer, stats, task, sage_model
    return m
