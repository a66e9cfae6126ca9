"""A three-layer GraphSAGE with jumping knowledge on Cora (PyG's JumpingKnowledge in 'cat' mode
over every layer's output, then a Linear classifier), written as PyG's examples write it and
converted for sparkgnn (`--help` shows how to run it). Each layer's output is carried in the
node's row until the concatenation that reads it."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import JumpingKnowledge, SAGEConv


class JKNet(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, num_layers=3, mode="cat"):
        super().__init__()
        self.convs = torch.nn.ModuleList()
        self.convs.append(SAGEConv(in_channels, hidden_channels))
        for _ in range(num_layers - 1):
            self.convs.append(SAGEConv(hidden_channels, hidden_channels))
        self.jump = JumpingKnowledge(mode)
        width = num_layers * hidden_channels if mode == "cat" else hidden_channels
        self.lin = torch.nn.Linear(width, out_channels)

    def forward(self, x, edge_index):
        xs = []
        for conv in self.convs:
            x = conv(x, edge_index).relu()
            x = F.dropout(x, p=0.5, training=self.training)
            xs.append(x)
        x = self.jump(xs)
        return self.lin(x)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return JKNet(num_features, 16, num_classes)


if __name__ == "__main__":
    run(build, __doc__)
