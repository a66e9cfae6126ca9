"""A two-layer GAT on Cora, written as PyG's GAT example writes it, converted for sparkgnn
(`--help` shows how to run it)."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import GATConv


class GAT(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, heads):
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=0.6)
        # On the output layer, heads are averaged (concat=False), as in the GAT paper.
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return GAT(num_features, 8, num_classes, heads=8)


if __name__ == "__main__":
    run(build, __doc__)
