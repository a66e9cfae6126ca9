"""Decoders and PyG reference embeddings shared by the link-prediction tests."""

import torch


class ConcatMLP(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin1, self.lin2 = torch.nn.Linear(2 * width, 8), torch.nn.Linear(8, 1)

    def forward(self, h_src, h_dst):
        return self.lin2(self.lin1(torch.cat([h_src, h_dst], dim=-1)).relu()).squeeze(-1)


class DistMult(torch.nn.Module):  # PyG's examples/rgcn_link_pred.py DistMultDecoder
    def __init__(self, num_relations: int, width: int):
        super().__init__()
        self.rel_emb = torch.nn.Parameter(torch.randn(num_relations, width))

    def forward(self, z, edge_index, edge_type):
        z_src, z_dst = z[edge_index[0]], z[edge_index[1]]
        return torch.sum(z_src * self.rel_emb[edge_type] * z_dst, dim=1)


RELATIONS = ["likes", "follows", "blocks"]


class Dot(torch.nn.Module):
    def forward(self, h_src, h_dst):
        return (h_src * h_dst).sum(dim=-1)


def pyg_embeddings(data, encoder) -> torch.Tensor:
    """The encoder's outputs, row i for data.ids[i]."""
    x = torch.as_tensor(data.x, dtype=torch.float32)
    index = {int(v): i for i, v in enumerate(data.ids)}
    src = torch.tensor([index[int(v)] for v in data.edge_src])
    dst = torch.tensor([index[int(v)] for v in data.edge_dst])
    with torch.no_grad():
        return encoder(x, torch.stack([src, dst]))
