"""Dot-product decoder: score = <h_src, h_dst> (PyG's `(z[src] * z[dst]).sum(dim=-1)`)."""

from __future__ import annotations

from torch import Tensor

from sparkgnn.decoders.base import DECODERS, Decoder


@DECODERS.register("dot")
class DotDecoder(Decoder):
    kind = "dot"
    inner_product = True

    def raw(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return (h_src * h_dst).sum(dim=-1)

    def search_vectors(self, h: Tensor) -> Tensor:
        return h
