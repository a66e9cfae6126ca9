"""Test graphs shared by tests/layers and tests/models (imported by path from both conftests).

The synthetic graph is built to hit every corner that breaks naive decompositions: power-law
in-degrees (a few nodes with hundreds of in-edges split over many partitions), isolated nodes
(identity states, zero degree), nodes with one existing self loop and nodes with duplicated
self loops (each conv's self-loop policy treats them differently), and duplicate edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GraphCase:
    name: str
    x: torch.Tensor  # [N, F] float32
    edge_index: torch.Tensor  # [2, E] int64
    edge_weight: torch.Tensor | None  # [E] float32

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    @property
    def num_features(self) -> int:
        return self.x.shape[1]


def synthetic_graph(
    seed: int = 0, n: int = 400, num_features: int = 24, num_edges: int = 3000, num_isolated: int = 25
) -> GraphCase:
    g = torch.Generator().manual_seed(seed)
    active = n - num_isolated  # the last `num_isolated` nodes touch no edge
    rank = torch.randperm(active, generator=g)
    prob = (rank.to(torch.float64) + 1.0).pow(-1.1)  # Zipf-like popularity
    dst = torch.multinomial(prob, num_edges, replacement=True, generator=g)
    src = torch.multinomial(prob.flip(0), num_edges, replacement=True, generator=g)
    keep = src != dst  # self loops are added deliberately below
    src, dst = src[keep], dst[keep]
    dup = torch.randint(0, src.numel(), (150,), generator=g)
    src, dst = torch.cat([src, src[dup]]), torch.cat([dst, dst[dup]])  # duplicate edges
    loops = torch.arange(0, 12)  # 12 nodes with an existing self loop ...
    loops = torch.cat([loops, torch.tensor([0, 1, 1])])  # ... node 0 twice, node 1 three times
    src, dst = torch.cat([src, loops]), torch.cat([dst, loops])
    perm = torch.randperm(src.numel(), generator=g)
    src, dst = src[perm], dst[perm]
    weight = torch.rand(src.numel(), generator=g) * 1.5 + 0.25
    x = torch.randn(n, num_features, generator=g)
    return GraphCase("synthetic", x, torch.stack([src, dst]), weight.to(torch.float32))


def cora_graph() -> GraphCase:
    """Cora via sparkgnn.datasets.load_cora() (dense ids, float32 features); random positive
    weights for the weighted-GCN checks."""
    from sparkgnn.datasets import load_cora

    data = load_cora()
    x = torch.as_tensor(data.x, dtype=torch.float32)
    src = torch.as_tensor(data.edge_src, dtype=torch.long)
    dst = torch.as_tensor(data.edge_dst, dtype=torch.long)
    g = torch.Generator().manual_seed(7)
    weight = torch.rand(src.numel(), generator=g) + 0.5
    return GraphCase("cora", x, torch.stack([src, dst]), weight)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a-b| / max|b| (the exactness criterion of the issue)."""
    a, b = a.detach().to(torch.float64), b.detach().to(torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = b.abs().max().item()
    return (a - b).abs().max().item() / (scale if scale > 0 else 1.0)


def randomize(module, seed=0):
    """Non-trivial values everywhere (biases, BatchNorm statistics, attention vectors, eps)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if not p.is_floating_point():
                continue
            if name.endswith("running_var"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5))
    return module.eval()
