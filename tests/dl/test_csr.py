"""dl.csr: the destination-sorted CSR is reused for the same edge list and rebuilt for any other."""

import torch

from sparkgnn.dl import csr


def _edges(seed: int, n: int = 1000, num_dst: int = 50, num_src: int = 80):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_src, (n,), generator=g), torch.randint(0, num_dst, (n,), generator=g)


def _dense(entry: csr.Csr, num_dst: int, num_src: int) -> torch.Tensor:
    a = torch.zeros(num_dst, num_src)
    rows = torch.repeat_interleave(torch.arange(num_dst), entry.own.crow.diff())
    a.index_put_((rows, entry.own.col), torch.ones(entry.own.num_edges), accumulate=True)
    return a


def test_csr_matches_the_edge_list_and_is_reused_for_equal_edges():
    csr.clear()
    src, dst = _edges(0)
    first = csr.by_destination(src, dst, 50)
    expected = torch.zeros(50, 80).index_put_((dst, src), torch.ones(1000), accumulate=True)
    assert torch.equal(_dense(first, 50, 80), expected)
    assert torch.equal(first.in_degree, torch.bincount(dst, minlength=50))
    assert torch.equal(dst[first.own.order], torch.sort(dst, stable=True).values)
    # Equal content in fresh tensors (a messenger worker receives new buffers each call): a hit.
    assert csr.by_destination(src.clone(), dst.clone(), 50) is first


def test_a_changed_edge_list_of_the_same_size_is_never_served_the_old_order():
    csr.clear()
    src, dst = _edges(1)
    first = csr.by_destination(src, dst, 50)
    changed_dst = dst.clone()
    changed_dst[7] = (changed_dst[7] + 1) % 50
    second = csr.by_destination(src, changed_dst, 50)
    assert second is not first and torch.equal(second.in_degree, torch.bincount(changed_dst, minlength=50))
    changed_src = src.clone()
    changed_src[3] = (changed_src[3] + 1) % 80
    third = csr.by_destination(changed_src, changed_dst, 50)
    assert third is not second and torch.equal(third.own.col, changed_src[third.own.order])


def test_least_recently_used_entries_leave_first():
    csr.clear()
    lists = [_edges(seed, n=100 + seed) for seed in range(csr.MAX_ENTRIES + 1)]
    built = [csr.by_destination(s, d, 50) for s, d in lists]
    assert csr.by_destination(*lists[-1], 50) is built[-1]
    assert csr.by_destination(*lists[0], 50) is not built[0]  # evicted, rebuilt


def _mixed(seed: int, n: int = 2000, num_dst: int = 60, n_own: int = 40, n_mirror: int = 50):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_own + n_mirror, (n,), generator=g), torch.randint(0, num_dst - 5, (n,), generator=g)


def test_the_split_blocks_hold_each_edge_once_by_destination_in_edge_order():
    csr.clear()
    src, dst = _mixed(3)
    entry = csr.by_destination(src, dst, 60, split=40)
    own, mirror = entry.own, entry.mirror
    assert own.num_edges + mirror.num_edges == src.numel()
    assert torch.equal(torch.sort(torch.cat([own.order, mirror.order])).values, torch.arange(src.numel()))
    assert torch.equal(own.col, src[own.order]) and bool((own.col < 40).all())
    assert torch.equal(mirror.col + 40, src[mirror.order]) and bool((mirror.col >= 0).all())
    for block in (own, mirror):
        rows = torch.repeat_interleave(torch.arange(60), block.crow.diff())
        assert torch.equal(rows, dst[block.order])  # each row's edges are that destination's
        # stable: within a destination, edges keep their edge-list order
        assert bool(((rows[1:] > rows[:-1]) | (block.order[1:] > block.order[:-1])).all())
    assert torch.equal(entry.in_degree, torch.bincount(dst, minlength=60))
    assert int(entry.in_degree[-5:].sum()) == 0  # destinations without edges: empty rows
    # the two blocks are views of one col and one order array: the split costs no second copy
    assert own.col.untyped_storage().data_ptr() == mirror.col.untyped_storage().data_ptr()
    assert own.order.untyped_storage().data_ptr() == mirror.order.untyped_storage().data_ptr()


def test_the_split_is_cached_per_edge_list_and_split_point():
    csr.clear()
    src, dst = _mixed(4)
    first = csr.by_destination(src, dst, 60, split=40)
    again = csr.by_destination(src.clone(), dst.clone(), 60, split=40)
    assert again is first and again.own is first.own and again.mirror is first.mirror
    other_split = csr.by_destination(src, dst, 60, split=30)
    assert other_split is not first and bool((other_split.own.col < 30).all())
    changed = src.clone()
    changed[11] = 45 if int(changed[11]) < 40 else 5  # moves one edge to the other block
    fresh = csr.by_destination(changed, dst, 60, split=40)
    assert fresh is not first and fresh.own.num_edges != first.own.num_edges
    assert torch.equal(fresh.mirror.col + 40, changed[fresh.mirror.order])


def test_a_split_past_every_source_leaves_the_mirror_block_empty():
    csr.clear()
    src, dst = _edges(5)
    whole = csr.by_destination(src, dst, 50)
    split = csr.by_destination(src, dst, 50, split=80)  # emit_partials: every source is own
    assert split.mirror.num_edges == 0 and torch.equal(split.mirror.crow, torch.zeros(51, dtype=torch.long))
    assert torch.equal(split.own.col, whole.own.col) and torch.equal(split.own.crow, whole.own.crow)
    assert whole.mirror.num_edges == 0
