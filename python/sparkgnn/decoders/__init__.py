"""Link-prediction decoders: score node pairs from their node outputs (base.py states the contract).

Kinds: dot, cosine, mlp (concat / hadamard / difference), per relation distmult and transe, and
per_relation (one member decoder of the other kinds per edge type of a typed model).
`sparkgnn.models.pyg_decoders` converts a PyG decoder module by tracing it; `build_decoder`
rebuilds one from its saved config.
"""

from sparkgnn.decoders.base import DECODERS, Decoder, build_decoder
from sparkgnn.decoders.cosine import CosineDecoder
from sparkgnn.decoders.dot import DotDecoder
from sparkgnn.decoders.mlp import MLPDecoder
from sparkgnn.decoders.per_relation import PerRelationDecoder
from sparkgnn.decoders.relational import DistMultDecoder, RelationalDecoder, TransEDecoder

__all__ = [
    "DECODERS",
    "CosineDecoder",
    "Decoder",
    "DistMultDecoder",
    "DotDecoder",
    "MLPDecoder",
    "PerRelationDecoder",
    "RelationalDecoder",
    "TransEDecoder",
    "build_decoder",
]
