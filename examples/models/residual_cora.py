"""A GCN with residual connections on Cora, written as PyG users write one (an input projection,
then `x = x + conv(x)` per layer and a Linear head), converted for sparkgnn (`--help` shows how
to run it). The residual adds read the previous layer's output again after its conv: sparkgnn
carries that value in the node's row through the conv's round and adds it after."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import GCNConv, SAGEConv


class ResGNN(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.lin_in = torch.nn.Linear(in_channels, hidden_channels)
        self.conv1 = GCNConv(hidden_channels, hidden_channels)
        self.conv2 = SAGEConv(hidden_channels, hidden_channels)
        self.lin_out = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.lin_in(x).relu()
        x = x + self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index).relu() + x
        return F.log_softmax(self.lin_out(x), dim=-1)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return ResGNN(num_features, 32, num_classes)


if __name__ == "__main__":
    run(build, __doc__)
