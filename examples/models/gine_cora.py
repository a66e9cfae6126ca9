"""A two-layer GINE (GIN with edge features) on Cora whose edges carry seeded synthetic
attributes, written as PyG's examples write one, converted for sparkgnn (`--help` shows how to
run it; `--graph-out` writes the graph with its edge features for the batch job)."""

import functools

import cora_common
import torch
import torch.nn.functional as F
from torch.nn import BatchNorm1d, Linear, ReLU, Sequential
from torch_geometric.nn import GINEConv

EDGE_DIM = 4
# Cora's edges get EDGE_DIM seeded synthetic attributes for training, the check and --graph-out
run = functools.partial(cora_common.run, edge_dim=EDGE_DIM)


class GINE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, edge_dim):
        super().__init__()
        self.conv1 = GINEConv(
            Sequential(
                Linear(in_channels, hidden_channels),
                BatchNorm1d(hidden_channels),
                ReLU(),
                Linear(hidden_channels, hidden_channels),
            ),
            train_eps=True,
            edge_dim=edge_dim,
        )
        self.conv2 = GINEConv(
            Sequential(Linear(hidden_channels, hidden_channels), ReLU(), Linear(hidden_channels, out_channels)),
            edge_dim=edge_dim,
        )

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index, edge_attr)
        return F.log_softmax(x, dim=1)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return GINE(num_features, 32, num_classes, EDGE_DIM)


if __name__ == "__main__":
    run(build, __doc__)
