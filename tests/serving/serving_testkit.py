"""Graphs and PyG models shared by the serving tests (a uniquely named module: importing from
`conftest` picks whichever test directory's conftest was loaded last)."""

import numpy as np
import torch

from sparkgnn.datasets import synthetic_graph
from sparkgnn.graph import GraphData


def skewed_graph() -> GraphData:
    """Zipf in-degrees, weights, isolated vertices, plus self loops (one duplicated) so GCN's
    remaining-self-loop rule is exercised across the serving path."""
    g = synthetic_graph(600, 6000, 12, num_classes=4, seed=3, weighted=True, zipf_alpha=1.0, isolated_frac=0.03)
    loops = np.array([0, 1, 2, 3, 3, 4, 5, 6, 7, 8])
    w_loops = np.linspace(0.5, 2.0, len(loops)).astype(np.float32)
    return GraphData(
        g.ids,
        g.x,
        np.concatenate([g.edge_src, loops]),
        np.concatenate([g.edge_dst, loops]),
        weight=np.concatenate([g.weight, w_loops]),
        y=g.y,
        split=g.split,
        name="skewed",
    )


def randomize(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, p in list(module.named_parameters()) + list(module.named_buffers()):
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() > 1 else 0.5))
    return module.eval()


def pyg_model(kind: str, in_dim: int, layers: int, out: int = 5, seed: int = 0):
    import torch_geometric.nn as gnn

    hidden = 16
    build = {
        "gcn": lambda: gnn.GCN(in_dim, hidden, layers, out_channels=out),
        "sage": lambda: gnn.GraphSAGE(in_dim, hidden, layers, out_channels=out),
        "gin": lambda: gnn.GIN(in_dim, hidden, layers, out_channels=out),
        "gat": lambda: gnn.GAT(in_dim, hidden, layers, out_channels=out, heads=2),
        "gatv2": lambda: gnn.GAT(in_dim, hidden, layers, out_channels=out, heads=2, v2=True),
        "resgated": lambda: _conv_stack(gnn.ResGatedGraphConv, in_dim, hidden, layers, out),
        "le": lambda: _conv_stack(gnn.LEConv, in_dim, hidden, layers, out),
        "graphconv": lambda: _conv_stack(gnn.GraphConv, in_dim, hidden, layers, out),
        "sage_project": lambda: _conv_stack(lambda a, b: gnn.SAGEConv(a, b, project=True), in_dim, hidden, layers, out),
        "sgconv": lambda: gnn.Sequential("x, edge_index", [(gnn.SGConv(in_dim, out, K=layers), "x, edge_index -> x")]),
        "lgconv": lambda: _lgconv_stack(in_dim, hidden, layers, out),
        "tagconv": lambda: _conv_stack(lambda a, b: gnn.TAGConv(a, b, K=2), in_dim, hidden, layers, out),
        "chebconv": lambda: _conv_stack(lambda a, b: gnn.ChebConv(a, b, K=3), in_dim, hidden, layers, out),
        "chebconv_rw": lambda: _conv_stack(
            lambda a, b: gnn.ChebConv(a, b, K=2, normalization="rw"), in_dim, hidden, layers, out
        ),
        "appnp": lambda: _appnp_stack(in_dim, hidden, layers, out),
        "edgeconv": lambda: _conv_stack(_edgeconv, in_dim, hidden, layers, out),
        "transformer": lambda: _conv_stack(
            lambda a, b: gnn.TransformerConv(a, b, heads=2, concat=False, beta=True), in_dim, hidden, layers, out
        ),
        "gen": lambda: _conv_stack(
            lambda a, b: gnn.GENConv(a, b, learn_t=True, norm="layer"), in_dim, hidden, layers, out
        ),
        "pna": lambda: _conv_stack(_pna, in_dim, hidden, layers, out),
        "residual": lambda: ResidualGNN(in_dim, hidden, layers, out),
        "jk_cat": lambda: JKNet(in_dim, hidden, layers, out, mode="cat"),
        "jk_max": lambda: JKNet(in_dim, hidden, layers, out, mode="max"),
    }[kind]
    torch.manual_seed(seed)
    return randomize(build(), seed)


def _pna(a: int, b: int):
    """PNAConv with every aggregator and degree scaler (a fixed training-degree histogram)."""
    import torch_geometric.nn as gnn

    scalers = ["identity", "amplification", "attenuation", "linear", "inverse_linear"]
    return gnn.PNAConv(a, b, ["mean", "min", "max", "std", "sum"], scalers, torch.tensor([2, 7, 5, 3, 1]))


def _conv_stack(conv, in_dim: int, hidden: int, layers: int, out: int):
    """`layers` convs of one class (in_dim -> hidden ... -> out) with ReLU between, as a PyG
    Sequential over (x, edge_index): for conv classes without a BasicGNN model."""
    import torch_geometric.nn as gnn

    widths = [in_dim] + [hidden] * (layers - 1) + [out]
    children: list = []
    for i in range(layers):
        if i:
            children.append(torch.nn.ReLU())
        children.append((conv(widths[i], widths[i + 1]), "x, edge_index -> x"))
    return gnn.Sequential("x, edge_index", children)


def _lgconv_stack(in_dim: int, hidden: int, layers: int, out: int):
    """Linear(in_dim, hidden), then `layers` LGConvs with ReLU between, then Linear(hidden, out):
    LGConv has no in_channels, the first Linear gives it its width."""
    import torch_geometric.nn as gnn

    children: list = [(torch.nn.Linear(in_dim, hidden), "x -> x")]
    for i in range(layers):
        if i:
            children.append(torch.nn.ReLU())
        children.append((gnn.LGConv(), "x, edge_index -> x"))
    children.append((torch.nn.Linear(hidden, out), "x -> x"))
    return gnn.Sequential("x, edge_index", children)


def _appnp_stack(in_dim: int, hidden: int, layers: int, out: int):
    """Linear(in_dim, hidden), APPNP with K = `layers` hops, Linear(hidden, out)."""
    import torch_geometric.nn as gnn

    children: list = [
        (torch.nn.Linear(in_dim, hidden), "x -> x"),
        (gnn.APPNP(K=layers, alpha=0.2), "x, edge_index -> x"),
    ]
    children.append((torch.nn.Linear(hidden, out), "x -> x"))
    return gnn.Sequential("x, edge_index", children)


def _edgeconv(in_dim: int, out: int):
    """EdgeConv with a 2-layer MLP over [x_i | x_j - x_i], max aggregation."""
    import torch_geometric.nn as gnn

    return gnn.EdgeConv(
        torch.nn.Sequential(torch.nn.Linear(2 * in_dim, out), torch.nn.ReLU(), torch.nn.Linear(out, out))
    )


class ResidualGNN(torch.nn.Module):
    """Skip connections as PyG users write them: an input projection, then `x = x + conv(x)` per
    layer (SAGE first, then GCN: rounds with degree statistics), a Linear head."""

    def __init__(self, in_dim: int, hidden: int, layers: int, out: int):
        import torch_geometric.nn as gnn

        super().__init__()
        self.lin_in = torch.nn.Linear(in_dim, hidden)
        self.convs = torch.nn.ModuleList(
            [gnn.SAGEConv(hidden, hidden) if i == 0 else gnn.GCNConv(hidden, hidden) for i in range(layers)]
        )
        self.lin_out = torch.nn.Linear(hidden, out)

    def forward(self, x, edge_index):
        x = self.lin_in(x).relu()
        for conv in self.convs:
            x = x + conv(x, edge_index).relu()
        return self.lin_out(x)


class JKNet(torch.nn.Module):
    """JumpingKnowledge ('cat' or 'max') over every layer's output (SAGE and GCN alternating),
    then a Linear head: each layer's output is carried in the row until the last round."""

    def __init__(self, in_dim: int, hidden: int, layers: int, out: int, mode: str):
        import torch_geometric.nn as gnn

        super().__init__()
        widths = [in_dim] + [hidden] * layers
        self.convs = torch.nn.ModuleList(
            [(gnn.SAGEConv if i % 2 == 0 else gnn.GCNConv)(widths[i], widths[i + 1]) for i in range(layers)]
        )
        self.jump = gnn.JumpingKnowledge(mode)
        self.lin = torch.nn.Linear(layers * hidden if mode == "cat" else hidden, out)

    def forward(self, x, edge_index):
        xs = []
        for conv in self.convs:
            x = conv(x, edge_index).relu()
            xs.append(x)
        return self.lin(self.jump(xs))
