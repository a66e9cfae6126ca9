"""Cosine decoder: score = F.cosine_similarity(h_src, h_dst, dim=-1, eps).

For a vector index the rows are unit-normalised and searched by inner product; that equals the
cosine up to `eps` (rows with a norm below eps, where torch clamps the norm).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from sparkgnn.decoders.base import DECODERS, Decoder


@DECODERS.register("cosine")
class CosineDecoder(Decoder):
    kind = "cosine"
    inner_product = True

    def __init__(self, in_dim: int | None = None, final: str | None = None, eps: float = 1e-8):
        super().__init__(in_dim, final)
        self.eps = float(eps)

    def config(self) -> dict:
        return {**super().config(), "eps": self.eps}

    def raw(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return F.cosine_similarity(h_src, h_dst, dim=-1, eps=self.eps)

    def search_vectors(self, h: Tensor) -> Tensor:
        return F.normalize(h, p=2.0, dim=-1, eps=self.eps)
