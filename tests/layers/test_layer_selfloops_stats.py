"""Self-loop policies and node statistics against PyG's own utilities, on graphs with existing,
duplicated and missing self loops."""

import numpy as np
import pytest
import torch
from torch_geometric.utils import add_remaining_self_loops, add_self_loops, remove_self_loops

from sparkgnn.layers.selfloops import SELF_LOOP_POLICIES, apply_policy_to_targets, apply_self_loops
from sparkgnn.layers.stats import STATS


def _as_multiset(src, dst, w=None):
    key = (src * 100003 + dst).tolist()
    if w is None:
        return sorted(key)
    return sorted(zip(key, [round(float(v), 6) for v in w], strict=True))


def test_policy_registry():
    assert set(SELF_LOOP_POLICIES) == {"none", "remaining", "remove", "replace", "replace_mean"}
    with pytest.raises(ValueError, match="unknown self-loop policy"):
        apply_self_loops(torch.tensor([0]), torch.tensor([0]), None, 1, "fill")


@pytest.mark.parametrize("weighted", [False, True])
def test_remaining_matches_pyg(synthetic, weighted):
    ei, n = synthetic.edge_index, synthetic.num_nodes
    w = synthetic.edge_weight if weighted else None
    ref_ei, ref_w = add_remaining_self_loops(ei, w, 1.0, n)
    s, d, ww = apply_self_loops(ei[0], ei[1], w, n, "remaining")
    assert (ww is None) == (ref_w is None)
    assert torch.equal(s, ref_ei[0]) and torch.equal(d, ref_ei[1])
    if weighted:
        assert torch.equal(ww, ref_w)
    # exactly one self loop per node afterwards
    loops = s[s == d]
    assert torch.equal(torch.sort(loops).values, torch.arange(n))


def test_remaining_keeps_last_duplicate_weight():
    src = torch.tensor([0, 1, 0, 0])
    dst = torch.tensor([0, 0, 0, 1])
    w = torch.tensor([2.0, 3.0, 5.0, 7.0])
    s, d, ww = apply_self_loops(src, dst, w, 3, "remaining")
    assert s.tolist() == [1, 0, 0, 1, 2] and d.tolist() == [0, 1, 0, 1, 2]
    assert ww.tolist() == [3.0, 7.0, 5.0, 1.0, 1.0]
    ref = add_remaining_self_loops(torch.stack([src, dst]), w, 1.0, 3)
    assert ref[1].tolist() == ww.tolist()


def test_replace_matches_pyg(synthetic):
    ei, n = synthetic.edge_index, synthetic.num_nodes
    ref, _ = add_self_loops(remove_self_loops(ei)[0], num_nodes=n)
    s, d, w = apply_self_loops(ei[0], ei[1], None, n, "replace")
    assert w is None
    assert torch.equal(s, ref[0]) and torch.equal(d, ref[1])
    _, _, w2 = apply_self_loops(ei[0], ei[1], synthetic.edge_weight, n, "replace")
    assert w2.shape == s.shape and torch.all(w2[-n:] == 1)


def test_remove_matches_pyg(synthetic):
    ei, w = synthetic.edge_index, synthetic.edge_weight
    ref_ei, ref_w = remove_self_loops(ei, w)
    s, d, ww = apply_self_loops(ei[0], ei[1], w, synthetic.num_nodes, "remove")
    assert torch.equal(s, ref_ei[0]) and torch.equal(d, ref_ei[1]) and torch.equal(ww, ref_w)


def test_none_is_identity(synthetic):
    ei = synthetic.edge_index
    s, d, w = apply_self_loops(ei[0], ei[1], synthetic.edge_weight, synthetic.num_nodes, "none")
    assert torch.equal(s, ei[0]) and torch.equal(d, ei[1]) and torch.equal(w, synthetic.edge_weight)


@pytest.mark.parametrize("policy", ["none", "remaining", "remove", "replace"])
@pytest.mark.parametrize("weighted", [False, True])
def test_policy_on_targets_matches_the_whole_graph(policy, weighted):
    """The in-edges of a few targets (unsorted ids) with the policy applied are exactly the
    targets' in-edges of the whole graph with the policy applied: one loop per target, none for
    sources that are not targets; numpy set operations and caller-given ones agree."""
    from sparkgnn.serving.nodesets import NodeSets

    rng = np.random.default_rng(7)
    n, e = 40, 300
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[:20] = dst[:20]  # existing (and duplicated) loops
    weight = rng.random(e).astype(np.float32) if weighted else None
    targets = rng.choice(n, 12, replace=False).astype(np.int64)
    sel = np.flatnonzero(np.isin(dst, targets))
    dst_pos = np.argsort(targets)[np.searchsorted(np.sort(targets), dst[sel])]
    w = None if weight is None else weight[sel]

    s_all, d_all, w_all = apply_self_loops(torch.from_numpy(src), torch.from_numpy(dst), weight, n, policy)
    into = np.isin(d_all.numpy(), targets)
    expected = _as_multiset(s_all.numpy()[into], d_all.numpy()[into], None if w_all is None else w_all.numpy()[into])

    sets = NodeSets(n)
    for kwargs in ({}, {"positions": sets.positions, "unique_inverse": sets.unique_inverse}):
        s, d, ww = apply_policy_to_targets(src[sel], dst_pos, w, targets, policy, **kwargs)
        assert (ww is None) == (weight is None)
        assert _as_multiset(s, targets[d], ww) == expected


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_degree_matches_pyg_gcn_norm(synthetic, weighted):
    ei, n = synthetic.edge_index, synthetic.num_nodes
    w = synthetic.edge_weight if weighted else None
    ref_ei, ref_w = add_remaining_self_loops(ei, w, 1.0, n)
    ref_w = torch.ones(ref_ei.shape[1]) if ref_w is None else ref_w
    ref_deg = torch.zeros(n).index_add_(0, ref_ei[1], ref_w)
    deg = STATS["gcn_degree"](ei[0], ei[1], w, n)
    assert torch.allclose(deg, ref_deg, rtol=1e-6)
    assert deg.dtype == torch.float32 and deg.shape == (n,)
    # isolated nodes still count their added self loop
    assert torch.all(deg[-5:] == 1)
    if not weighted:  # counted directly (no edge list rebuilt): the very integers PyG's sum of ones gives
        assert torch.equal(deg, ref_deg)


def test_unweighted_gcn_degree_counts_one_loop_however_many_a_vertex_has():
    src = torch.tensor([0, 0, 0, 1, 2, 2, 3])
    dst = torch.tensor([0, 0, 1, 0, 2, 1, 1])  # vertex 0: two loops, 2: one, 1 and 4: none
    ref_ei, _ = add_remaining_self_loops(torch.stack([src, dst]), None, 1.0, 5)
    ref = torch.zeros(5).index_add_(0, ref_ei[1], torch.ones(ref_ei.shape[1]))
    deg = STATS["gcn_degree"](src, dst, None, 5)
    assert torch.equal(deg, ref) and deg.tolist() == [2.0, 4.0, 1.0, 1.0, 1.0]


def test_degree_stats(synthetic):
    ei, n, w = synthetic.edge_index, synthetic.num_nodes, synthetic.edge_weight
    cnt = torch.bincount(ei[1], minlength=n).to(torch.float32)
    assert torch.equal(STATS["in_degree"](ei[0], ei[1], w, n), cnt)
    assert torch.equal(STATS["weighted_in_degree"](ei[0], ei[1], None, n), cnt)
    ref = torch.zeros(n).index_add_(0, ei[1], w)
    assert torch.allclose(STATS["weighted_in_degree"](ei[0], ei[1], w, n), ref)


@pytest.mark.parametrize("weighted", [False, True])
def test_laplacian_degree_matches_pyg_get_laplacian(synthetic, weighted):
    """ChebConv's degree: get_laplacian's scatter over the SOURCE index after remove_self_loops."""
    ei, n = synthetic.edge_index, synthetic.num_nodes
    w = synthetic.edge_weight if weighted else None
    ref_ei, ref_w = remove_self_loops(ei, w)
    ref_w = torch.ones(ref_ei.shape[1]) if ref_w is None else ref_w
    ref = torch.zeros(n).index_add_(0, ref_ei[0], ref_w)
    assert torch.allclose(STATS["laplacian_degree"](ei[0], ei[1], w, n), ref, rtol=1e-6)
