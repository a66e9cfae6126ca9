"""A two-layer GCN on Cora, written as PyG's introductory tutorial writes it, converted for sparkgnn
(`--help` shows how to run it)."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import GCNConv


class GCN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden_channels)
        self.conv2 = GCNConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index)
        return F.log_softmax(x, dim=1)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return GCN(num_features, 16, num_classes)


if __name__ == "__main__":
    run(build, __doc__)
