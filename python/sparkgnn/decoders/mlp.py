"""MLP decoder: score = head(combine(h_src, h_dst)) reduced to one number per pair.

`combine`: "concat" ([h_src | h_dst], width 2F), "hadamard" (h_src * h_dst) or "diff"
(h_src - h_dst); `head`: node ops (layers/nodeops.py: Linear, activations, norms) on the combined
row; `reduce`: "squeeze" (the head ends in width 1) or "sum" (over the head's output features).
These are the MLP decoders of PyG's link-prediction examples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.decoders.base import DECODERS, Decoder
from sparkgnn.layers.nodeops import LinearOp, NodeOpStack

COMBINES = ("concat", "hadamard", "diff")
REDUCES = ("squeeze", "sum")


@DECODERS.register("mlp")
class MLPDecoder(Decoder):
    kind = "mlp"

    def __init__(
        self,
        in_dim: int | None = None,
        final: str | None = None,
        combine: str = "concat",
        head: list | None = None,
        reduce: str = "squeeze",
        _head: NodeOpStack | None = None,
    ):
        if combine not in COMBINES:
            raise ValueError(f"mlp decoder combine {combine!r} is not one of {COMBINES}")
        if reduce not in REDUCES:
            raise ValueError(f"mlp decoder reduce {reduce!r} is not one of {REDUCES}")
        stack = _head if _head is not None else NodeOpStack(head or [])
        first = stack.ops[0] if len(stack.ops) else None
        if in_dim is None and isinstance(first, LinearOp):
            width = first.in_features
            if combine == "concat" and width % 2:
                raise ValueError(f"an mlp decoder on concatenated pairs needs an even input width, got {width}")
            in_dim = width // 2 if combine == "concat" else width
        super().__init__(in_dim, final)
        self.combine, self.reduce = combine, reduce
        self.head = stack
        if in_dim is not None:
            out = stack.out_dim(2 * in_dim if combine == "concat" else in_dim)
            if reduce == "squeeze" and out != 1:
                raise ValueError(f"the mlp decoder's head ends in width {out}; reduce='squeeze' needs width 1")

    def config(self) -> dict:
        return {**super().config(), "combine": self.combine, "head": self.head.config(), "reduce": self.reduce}

    def raw(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        if self.combine == "concat":
            pair = torch.cat([h_src, h_dst], dim=-1)
        elif self.combine == "hadamard":
            pair = h_src * h_dst
        else:
            pair = h_src - h_dst
        return self._reduced(self.head(pair))

    def project(self, h: Tensor) -> tuple[Tensor, Tensor] | None:
        """Decoder.project for a concatenating head whose first op is a Linear: W [h_s | h_d] + b =
        (W_s h_s + b) + W_d h_d, the two halves of W applied per node; the rest of the head runs
        per pair on their sum (raw_projected). Float32 sums in another order than one product over
        the concatenation: about 4e-7 relative from `raw` on 128-d outputs (the exactness bar is
        1e-5). None for the other combines."""
        first = self.head.first_linear()
        if self.combine != "concat" or first is None or first.in_features % 2:
            return None
        half = first.in_features // 2
        return F.linear(h, first.weight[:, :half], first.bias), F.linear(h, first.weight[:, half:])

    def raw_projected(self, src_side: Tensor, dst_side: Tensor) -> Tensor:
        joined = src_side + dst_side  # broadcast: [S, 1, H] + [1, C, H] scores every (s, c)
        rows = self.head(joined.reshape(-1, joined.shape[-1]), start=1)  # the head's ops read [N, H] rows
        return self._reduced(rows).reshape(joined.shape[:-1])

    def _reduced(self, out: Tensor) -> Tensor:
        if self.reduce == "sum":
            return out.sum(dim=-1)
        if out.shape[-1] != 1:
            raise ValueError(f"the mlp decoder's head gave width {out.shape[-1]}; reduce='squeeze' needs width 1")
        return out.squeeze(-1)
