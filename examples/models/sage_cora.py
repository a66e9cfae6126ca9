"""GraphSAGE convs with a Linear classifier head on Cora, written as PyG's examples write it,
converted for sparkgnn (`--help` shows how to run it)."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import SAGEConv


class SAGE(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels)
        self.lin = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.lin(x)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return SAGE(num_features, 64, num_classes)


if __name__ == "__main__":
    run(build, __doc__)
