"""The typed round's merge fold (engine.typed_merge) without Spark: batches of (t, id, h) rows
sorted by (t, id), split anywhere (a key's rows across batches), folded per key with the
cross-relation aggregation and each type's post ops, against a plain numpy reference."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sparkgnn.engine.typed_merge import AGGREGATIONS, _folder
from sparkgnn.layers.nodeops import NodeOpStack

REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


def _rows(seed: int = 0):
    """Two types (4 and 3 wide), each id given by 1 to 3 relations, sorted by (t, id) as the merge sorts them."""
    rng = np.random.default_rng(seed)
    keys = [(t, i) for t in (0, 1) for i in (-3, 0, 2, 5, 9, 11)]
    rows = [(t, i, rng.standard_normal(4 - t).astype(np.float32)) for t, i in keys for _ in range(rng.integers(1, 4))]
    return pd.DataFrame({"t": [r[0] for r in rows], "id": [r[1] for r in rows], "h": [r[2] for r in rows]})


def _batches(pdf, cuts):
    """Arrow record batches of the rows (t int32, id int64, h list<float32>), cut at `cuts`."""
    table = pa.table(
        {
            "t": pa.array(pdf["t"], pa.int32()),
            "id": pa.array(pdf["id"], pa.int64()),
            "h": pa.array([v.tolist() for v in pdf["h"]], pa.list_(pa.float32())),
        }
    ).to_batches()[0]
    edges = [0, *cuts, len(pdf)]
    return [table.slice(a, b - a) for a, b in zip(edges[:-1], edges[1:], strict=True)]


@pytest.mark.parametrize("aggr", AGGREGATIONS)
@pytest.mark.parametrize("cuts", [[], [1, 2, 3, 4, 5, 6, 7], [5, 5, 13]])  # one batch, tiny ones, an empty one
def test_fold_equals_a_per_key_reduction_then_the_types_post_ops_whatever_the_batches(aggr, cuts):
    pdf = _rows()
    post = NodeOpStack([{"op": "activation", "name": "relu"}])
    batches = list(_folder(aggr, {1: post})(iter(_batches(pdf, cuts))))
    out = pa.Table.from_batches(batches).to_pandas()
    assert list(zip(out["t"], out["id"], strict=True)) == sorted(set(zip(pdf["t"], pdf["id"], strict=True)))
    for (t, i), group in pdf.groupby(["t", "id"]):
        want = REDUCE[aggr](np.stack(group["h"].to_numpy()), axis=0).astype(np.float32)
        if t == 1:
            want = np.maximum(want, 0)
        got = out[(out["t"] == t) & (out["id"] == i)]["h"].iloc[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_node_ops_batches_apply_the_stack_to_each_batch_as_one_matrix_keeping_the_ids():
    from sparkgnn.engine.typed_merge import node_ops_batches

    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    ids = np.array([9, -2, 4, 0, 11, 3, 5], dtype=np.int64)
    table = pa.table({"id": pa.array(ids), "h": pa.array([v.tolist() for v in x], pa.list_(pa.float32()))})
    batches = table.to_batches()[0]
    stack = NodeOpStack([{"op": "linear", "in_dim": 5, "out_dim": 3}, {"op": "activation", "name": "relu"}])
    torch.manual_seed(0)
    for parameter in stack.parameters():  # built with zero weights
        torch.nn.init.normal_(parameter)
    parts = [batches.slice(0, 3), batches.slice(3, 0), batches.slice(3, 4)]  # an empty batch is skipped
    out = list(node_ops_batches(stack)(iter(parts)))
    assert [b.num_rows for b in out] == [3, 4]
    got = pa.Table.from_batches(out)
    assert got.column("id").to_pylist() == ids.tolist()
    with torch.no_grad():
        want = stack(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(np.asarray(got.column("h").to_pylist(), np.float32), want)


@pytest.mark.parametrize("cuts", [[], [1, 2, 3, 4, 5, 6, 7], [5, 5, 13]])
def test_softmax_fold_equals_merging_each_keys_states_then_the_types_post_ops(cuts):
    # HGT's rows are partial softmax states [max (2) | exp sums (2) | weighted sums (4) | carried
    # row (4)]; an empty relation's max is the lowest float32
    torch = pytest.importorskip("torch")
    from sparkgnn.layers.hetero import RelationAggregator

    pdf = _rows(2)
    lowest = np.finfo(np.float32).min
    states = []
    for i, (t, key) in enumerate(zip(pdf["t"], pdf["id"], strict=True)):
        rng = np.random.default_rng(i)
        mx = lowest * np.ones(2, np.float32) if i % 4 == 3 else rng.standard_normal(2).astype(np.float32) * 5
        sums = np.zeros(2, np.float32) if i % 4 == 3 else rng.random(2).astype(np.float32) + 0.5
        values = rng.standard_normal(4).astype(np.float32) * (i % 4 != 3)
        # the carried row is the destination's own: the same in every relation of an id
        carried = np.random.default_rng(1000 * t + int(key) + 100).standard_normal(4).astype(np.float32)
        states.append(np.concatenate([mx, sums, values, carried]).astype(np.float32))
    pdf["h"] = states
    aggr = RelationAggregator("softmax", heads=2, channels=4)
    post = NodeOpStack([{"op": "activation", "name": "relu"}])
    out = pa.Table.from_batches(list(_folder(aggr, {1: post})(iter(_batches(pdf, cuts))))).to_pandas()
    assert list(zip(out["t"], out["id"], strict=True)) == sorted(set(zip(pdf["t"], pdf["id"], strict=True)))
    for (t, i), group in pdf.groupby(["t", "id"]):
        want = aggr.combine([torch.from_numpy(h).view(1, -1) for h in group["h"]])[0].numpy()
        if t == 1:
            want = np.maximum(want, 0)
        got = out[(out["t"] == t) & (out["id"] == i)]["h"].iloc[0]
        assert len(got) == 8
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
