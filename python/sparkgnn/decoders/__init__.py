"""Link-prediction decoders: score node pairs from their node outputs (base.py states the contract).

Kinds: dot, cosine, mlp (concat / hadamard / difference), and per relation distmult and transe.
`sparkgnn.models.pyg_decoders` converts a PyG decoder module by tracing it; `build_decoder`
rebuilds one from its saved config.
"""

from sparkgnn.decoders.base import DECODERS, Decoder, build_decoder
from sparkgnn.decoders.cosine import CosineDecoder
from sparkgnn.decoders.dot import DotDecoder
from sparkgnn.decoders.mlp import MLPDecoder
from sparkgnn.decoders.relational import DistMultDecoder, RelationalDecoder, TransEDecoder

__all__ = [
    "DECODERS",
    "CosineDecoder",
    "Decoder",
    "DistMultDecoder",
    "DotDecoder",
    "MLPDecoder",
    "RelationalDecoder",
    "TransEDecoder",
    "build_decoder",
]
