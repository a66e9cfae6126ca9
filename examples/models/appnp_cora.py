"""APPNP on Cora ("Predict then Propagate"), written as PyG's citation example writes it: an MLP
predicts, then K = 10 personalised-PageRank hops propagate the predictions, converted for
sparkgnn as ten engine rounds that keep each vertex's x_0 beside its row (`--help` shows how to
run it)."""

import torch
import torch.nn.functional as F
from cora_common import run
from torch_geometric.nn import APPNP


class Net(torch.nn.Module):
    def __init__(self, in_channels, hidden_channels, out_channels, K=10, alpha=0.1):
        super().__init__()
        self.lin1 = torch.nn.Linear(in_channels, hidden_channels)
        self.lin2 = torch.nn.Linear(hidden_channels, out_channels)
        self.prop1 = APPNP(K, alpha)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.lin1(x))
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.lin2(x)
        x = self.prop1(x, edge_index)
        return F.log_softmax(x, dim=1)


def build(num_features: int, num_classes: int) -> torch.nn.Module:
    return Net(num_features, 64, num_classes)


if __name__ == "__main__":
    run(build, __doc__)
