"""A small typed graph and to_hetero models for the typed batch inference, PE store and serving
tests: self loops, parallel edges, isolated vertices (paper 7, author 5 and field 3 have no edges),
non-dense ids and a type without features; and a typed update touching every type and relation."""

import numpy as np
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import HGTConv, Linear, SAGEConv, to_hetero

from sparkgnn.graph import TypedEdges, TypedGraphData
from sparkgnn.graph.typed import node_table
from sparkgnn.graph.updates import GraphUpdate, TypedGraphUpdate
from sparkgnn.models.hetero import HeteroModel

IDS = {"paper": np.arange(8) * 5 + 3, "author": np.arange(6), "field": np.arange(4)}
WRITES, WRITTEN_BY = ("author", "writes", "paper"), ("paper", "written_by", "author")
CITES = ("paper", "cites", "paper")
TOPIC, TOPIC_OF = ("paper", "has_topic", "field"), ("field", "topic_of", "paper")


def pyg_data() -> HeteroData:
    """paper (6 features), author (4), field (no features: PyG is fed a constant column)."""
    g = torch.Generator().manual_seed(7)
    d = HeteroData()
    d["paper"].x = torch.randn(8, 6, generator=g)
    d["author"].x = torch.randn(6, 4, generator=g)
    d["field"].x = torch.ones(4, 1)
    writes = torch.tensor([[0, 0, 1, 2, 3, 4, 4], [0, 0, 1, 2, 3, 4, 5]])
    topic = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 1, 1, 2, 2]])
    d["author", "writes", "paper"].edge_index = writes
    d["paper", "written_by", "author"].edge_index = writes.flip(0)
    d["paper", "cites", "paper"].edge_index = torch.tensor([[0, 1, 1, 2, 3, 3, 5, 6], [1, 2, 2, 2, 4, 4, 5, 0]])
    d["paper", "has_topic", "field"].edge_index = topic
    d["field", "topic_of", "paper"].edge_index = topic.flip(0)
    return d


def authors_and_papers() -> HeteroData:
    """pyg_data's paper and author types and their writes / written_by relations only."""
    d, small = pyg_data(), HeteroData()
    for t in ("paper", "author"):
        small[t].x = d[t].x
    for et in (("author", "writes", "paper"), ("paper", "written_by", "author")):
        small[et].edge_index = d[et].edge_index
    return small


def typed_graph(d: HeteroData) -> TypedGraphData:
    nodes = {  # field: no features
        t: node_table(IDS[t], None if t == "field" else d[t].x.numpy()) for t in d.node_types
    }
    edges = {}
    for s, r, t in d.edge_types:
        ei = d[s, r, t].edge_index.numpy()
        edges[(s, r, t)] = TypedEdges(IDS[s][ei[0]], IDS[t][ei[1]])
    return TypedGraphData(nodes, edges, name="typed-small")


class Sage(torch.nn.Module):
    """A per-type input Linear, then `layers` SAGE convs with relu between them."""

    def __init__(self, layers: int):
        super().__init__()
        self.lin = Linear(-1, 8)
        self.convs = torch.nn.ModuleList([SAGEConv((-1, -1), 8) for _ in range(layers - 1)] + [SAGEConv((-1, -1), 3)])

    def forward(self, x, edge_index):
        x = self.lin(x).relu()
        for conv in self.convs[:-1]:
            x = conv(x, edge_index).relu()
        return self.convs[-1](x, edge_index)


class SagePrefix(Sage):
    """Sage's first `layers` rounds, each followed by its relu: Sage's intermediate output."""

    def __init__(self, full: int, layers: int):
        super().__init__(full)
        self.keep = layers

    def forward(self, x, edge_index):
        x = self.lin(x).relu()
        for i, conv in enumerate(self.convs[: self.keep]):
            x = conv(x, edge_index)
            x = x.relu() if i < len(self.convs) - 1 else x
        return x


class Hgt(torch.nn.Module):
    """PyG's HGT example shape: a per-type input Linear (every type to one width), HGTConv rounds
    with relu between, the last round's whole dict returned. With two rounds the first keeps the
    width (its skip gate applies) and the second narrows it (none); one round keeps the width."""

    def __init__(self, metadata, heads: int = 2, rounds: int = 2):
        super().__init__()
        self.lin = torch.nn.ModuleDict({t: Linear(-1, 8) for t in metadata[0]})
        widths = [8, 4] if rounds == 2 else [8]
        self.convs = torch.nn.ModuleList([HGTConv(8, w, metadata, heads=heads) for w in widths])

    def forward(self, x_dict, edge_index_dict):
        x_dict = {t: self.lin[t](x).relu() for t, x in x_dict.items()}
        for conv in self.convs[:-1]:
            x_dict = {t: x.relu() for t, x in conv(x_dict, edge_index_dict).items()}
        return self.convs[-1](x_dict, edge_index_dict)


def hgt_module(d: HeteroData, heads: int = 2, rounds: int = 2):
    """A ready Hgt on `d` with its skip gates and relation priors drawn at random (PyG starts them
    at 1, which would hide a mixed-up relation or type)."""
    if rounds not in (1, 2):
        raise ValueError(f"Hgt has 1 or 2 rounds, not {rounds}")
    module = ready(Hgt(d.metadata(), heads=heads, rounds=rounds), d)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for conv in module.convs:
            for p in list(conv.skip.values()) + list(conv.p_rel.values()):
                p.copy_(torch.randn(p.shape, generator=g))
    return module


def ready(module, d):
    torch.manual_seed(0)
    module(d.x_dict, d.edge_index_dict)  # materialise lazy parameters
    return module.eval().requires_grad_(False)


def to_hetero_sage(d: HeteroData, layers: int = 2, aggr: str = "mean"):
    """(the PyG to_hetero module, its HeteroModel)."""
    module = ready(to_hetero(Sage(layers), d.metadata(), aggr=aggr), d)
    return module, HeteroModel.from_pyg(module, d.metadata())


def pyg_intermediate(module, d: HeteroData, layers: int, full: int, aggr: str = "mean") -> dict:
    """The to_hetero module's x_dict after `layers` rounds (its weights, PyG's forward)."""
    prefix = to_hetero(SagePrefix(full, layers), d.metadata(), aggr=aggr)
    prefix(d.x_dict, d.edge_index_dict)  # materialise lazy parameters, then take the module's weights
    # the prefix's unused convs stay homogeneous (to_hetero converts what forward calls): only
    # the used ones must all be taken from the module
    missing = prefix.load_state_dict(module.state_dict(), strict=False).missing_keys
    assert all(k.startswith(tuple(f"convs.{i}." for i in range(layers, full))) for k in missing), missing
    with torch.no_grad():
        return prefix.eval()(d.x_dict, d.edge_index_dict)


def typed_update() -> TypedGraphUpdate:
    """Paper 33 and author 3 deleted; paper 100, author 50, field 9 inserted; paper 8's features
    updated; one of the parallel writes 0 -> 3 and cites 8 -> 13 deleted; edges into and out of
    the inserted vertices (ids: typed_testkit.IDS)."""
    rng = np.random.default_rng(5)
    return TypedGraphUpdate(
        nodes={
            "paper": GraphUpdate(
                vertex_insert_ids=[100],
                vertex_insert_x=rng.standard_normal((1, 6)),
                feature_update_ids=[8],
                feature_update_x=rng.standard_normal((1, 6)),
                vertex_delete_ids=[33],
            ),
            "author": GraphUpdate(
                vertex_insert_ids=[50], vertex_insert_x=rng.standard_normal((1, 4)), vertex_delete_ids=[3]
            ),
            "field": GraphUpdate(vertex_insert_ids=[9], vertex_insert_x=np.zeros((1, 0))),
        },
        edges={
            WRITES: GraphUpdate(
                edge_insert_src=[50, 0], edge_insert_dst=[100, 13], edge_delete_src=[0], edge_delete_dst=[3]
            ),
            WRITTEN_BY: GraphUpdate(edge_insert_src=[100], edge_insert_dst=[50]),
            CITES: GraphUpdate(
                edge_insert_src=[100, 23], edge_insert_dst=[13, 100], edge_delete_src=[8], edge_delete_dst=[13]
            ),
            TOPIC: GraphUpdate(edge_insert_src=[100], edge_insert_dst=[9]),
            TOPIC_OF: GraphUpdate(edge_insert_src=[9], edge_insert_dst=[100]),
        },
    )
