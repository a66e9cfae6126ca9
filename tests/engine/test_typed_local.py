"""Typed requested ids on the driver (engine/typed_local.py): which models its local rounds take.
No Spark: the runs, equal to PyG, are in tests/engine/test_infer_typed.py."""

import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GCNConv, GINConv, HeteroConv, SAGEConv

from sparkgnn.engine.typed_local import why_not_local
from sparkgnn.models.hetero import HeteroModel

CITES, WRITES, WRITTEN_BY = (
    ("paper", "cites", "paper"),
    ("author", "writes", "paper"),
    ("paper", "written_by", "author"),
)


def _model(conv) -> HeteroModel:
    d = HeteroData()
    d["paper"].x, d["author"].x = torch.randn(3, 4), torch.randn(2, 4)
    d[CITES].edge_index = torch.tensor([[0, 1], [1, 2]])
    d[WRITES].edge_index = torch.tensor([[0, 1], [0, 2]])
    d[WRITTEN_BY].edge_index = torch.tensor([[0, 2], [0, 1]])

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = HeteroConv({CITES: conv, WRITES: SAGEConv(4, 4), WRITTEN_BY: SAGEConv(4, 4)}, aggr="sum")

        def forward(self, x_dict, edge_index_dict):
            return self.conv(x_dict, edge_index_dict)

    module = One().eval()
    module(d.x_dict, d.edge_index_dict)
    return HeteroModel.from_pyg(module, d.metadata(), in_dims={"paper": 4, "author": 4})


def test_one_hop_relations_run_on_the_driver_and_a_degree_statistic_is_named_as_the_reason_not_to():
    assert why_not_local(_model(SAGEConv(4, 4))) is None
    assert why_not_local(_model(GINConv(torch.nn.Linear(4, 4)))) is None
    reason = why_not_local(_model(GCNConv(4, 4)))
    assert reason is not None and "relation ('paper', 'cites', 'paper') (gcn) needs node statistics" in reason
    assert reason.endswith("its requested ids run through the relation jobs")
