"""dl.csr: the destination-sorted CSR is reused for the same edge list and rebuilt for any other."""

import torch

from sparkgnn.dl import csr


def _edges(seed: int, n: int = 1000, num_dst: int = 50, num_src: int = 80):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, num_src, (n,), generator=g), torch.randint(0, num_dst, (n,), generator=g)


def _dense(entry: csr.Csr, num_dst: int, num_src: int) -> torch.Tensor:
    a = torch.zeros(num_dst, num_src)
    rows = torch.repeat_interleave(torch.arange(num_dst), entry.in_degree)
    a.index_put_((rows, entry.col), torch.ones(entry.col.numel()), accumulate=True)
    return a


def test_csr_matches_the_edge_list_and_is_reused_for_equal_edges():
    csr.clear()
    src, dst = _edges(0)
    first = csr.by_destination(src, dst, 50)
    expected = torch.zeros(50, 80).index_put_((dst, src), torch.ones(1000), accumulate=True)
    assert torch.equal(_dense(first, 50, 80), expected)
    assert torch.equal(first.in_degree, torch.bincount(dst, minlength=50))
    assert torch.equal(dst[first.order], torch.sort(dst, stable=True).values)
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
    assert third is not second and torch.equal(third.col, changed_src[third.order])


def test_least_recently_used_entries_leave_first():
    csr.clear()
    lists = [_edges(seed, n=100 + seed) for seed in range(csr.MAX_ENTRIES + 1)]
    built = [csr.by_destination(s, d, 50) for s, d in lists]
    assert csr.by_destination(*lists[-1], 50) is built[-1]
    assert csr.by_destination(*lists[0], 50) is not built[0]  # evicted, rebuilt
