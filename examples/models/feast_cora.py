"""A two-layer network on Cora whose first conv, FeaStConv, has no native sparkgnn layer: it runs
through the generic fallback (the conv's own forward on each partition's in-edge neighbourhoods,
replicate strategy), written as PyG's tutorials write a model (`--help` shows how to run it)."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import FeaStConv, SAGEConv


class FeaStNet(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels):
        super().__init__()
        self.conv1 = FeaStConv(in_channels, hidden_channels, heads=2)
        self.conv2 = SAGEConv(hidden_channels, out_channels)

    def forward(self, x, edge_index):
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv2(x, edge_index)
        return F.log_softmax(x, dim=1)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return FeaStNet(num_features, 16, num_classes)


if __name__ == "__main__":
    run(build, __doc__)
