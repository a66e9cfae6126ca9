"""PyG's multi-hop and width-less convs -> sparkgnn layers: SGConv, TAGConv, ChebConv, APPNP, LGConv.

Each converter `(conv, where, use_edge_weight) -> MergeableConv` builds the K-round layers of
layers/multihop.py (or, for LGConv, a weightless GCN round) and copies the hop weights into them;
`converters()` names them for pyg_convs.CONV_CONVERTERS. LGConv and APPNP have no channel
arguments: they convert to an UnsizedConv, which `size_convs` builds once the width of the rows
reaching it is known from the layers before it (the generic fallback uses it too).

WHY apart from pyg_convs: these convs share one structure (a stack of per-hop rounds with per-hop
weights, or no width of their own), which the one-hop converters do not; pyg_convs keeps the
registry, the dispatch and the one-hop convs.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkgnn.layers.base import MergeableConv
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.multihop import CHEB_NORMALIZATIONS, APPNPLayer, ChebLayer, SGLayer, TAGLayer
from sparkgnn.models.pyg_common import common_checks, copy_into, in_width, unsupported
from sparkgnn.models.pyg_nodeops import input_width, stack


def converters() -> list[tuple[type, Callable[..., MergeableConv]]]:
    """(PyG conv class, converter) for each conv this module converts (imports torch_geometric)."""
    import torch_geometric.nn as gnn

    return [
        (gnn.LGConv, _lg),
        (gnn.SGConv, _sg),
        (gnn.TAGConv, _tag),
        (gnn.APPNP, _appnp),
        (gnn.ChebConv, _cheb),
    ]


class UnsizedConv(MergeableConv):
    """Conversion-time stand-in for a conv that has no channel arguments (LGConv keeps whatever
    width it is given): `size_convs` replaces it by `build(width)` once the width of the rows
    reaching it is known from the layers before it."""

    def __init__(self, build: Callable[[int], MergeableConv], where: str, module, uses_edge_weight: bool):
        super().__init__()
        self.in_dim = self.out_dim = -1
        self.build, self.where, self.module = build, where, module
        self.uses_edge_weight = bool(uses_edge_weight)


def size_convs(pre_ops: list, convs: list, posts: list) -> list:
    """`convs` with every UnsizedConv built at the width of the rows that reach it: the width
    after the pre ops (known when they start with a Linear or BatchNorm), then each conv's output
    width through its post ops. An UnsizedConv that no earlier layer gives a width is refused."""
    if not any(isinstance(c, UnsizedConv) for c in convs):
        return convs
    width = input_width(pre_ops)
    if width is not None:
        width = stack(pre_ops).out_dim(width)
    sized = []
    for conv, post in zip(convs, posts, strict=True):
        if isinstance(conv, UnsizedConv):
            if width is None:
                unsupported(
                    conv.where,
                    conv.module,
                    "has no in_channels and is the model's first layer, so the input width is unknown: "
                    "put a Linear (or a conv with in_channels) before it",
                )
            conv = conv.build(width)
        sized.append(conv)
        width = stack(post).out_dim(conv.out_dim)
    return sized


def _lg(conv, where, use_edge_weight):
    """A weightless GCN round (kind "gcn", linear=False): normalize on or off; edge weights; its
    width comes from the layer before it."""
    common_checks(conv, where)
    normalize = bool(conv.normalize)

    def build(width: int) -> MergeableConv:
        return GCNLayer(
            width,
            width,
            normalize=normalize,
            add_self_loops=False,
            bias=False,
            use_edge_weight=use_edge_weight,
            linear=False,
        )

    return UnsizedConv(build, where, conv, use_edge_weight)


def _sg(conv, where, use_edge_weight):
    """K GCN rounds (layers/multihop.py), lin in the first or last; edge weights; refuses cached=True."""
    common_checks(conv, where)
    if conv.cached:
        unsupported(where, conv, "cached=True (a cached result belongs to one graph; only cached=False)")
    in_dim = in_width(conv.in_channels, where, conv)
    layer = SGLayer(
        in_dim,
        conv.out_channels,
        K=conv.K,
        add_self_loops=bool(conv.add_self_loops),
        bias=conv.lin.bias is not None,
        use_edge_weight=use_edge_weight,
    )
    lin_round, bias_round = layer.lin_round, layer.bias_round
    assert lin_round.weight is not None  # the lin round is built linear
    copy_into(lin_round.weight, conv.lin.weight, where + ".lin", conv)
    if bias_round.bias is not None:  # built with a bias exactly when conv.lin has one
        copy_into(bias_round.bias, conv.lin.bias, where + ".lin", conv)
    return layer


def _tag(conv, where, use_edge_weight):
    """K rounds (layers/multihop.py, TAGRound): x W_0 + sum_k (A^k x) W_k, the running sum kept
    per vertex; normalize on (gcn_norm without self loops) or off; edge weights; bias; refuses
    K=0."""
    common_checks(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    if int(conv.K) < 1:
        unsupported(where, conv, "K=0 propagates nothing (the conv is a Linear: write one instead)")
    if any(lin.bias is not None for lin in conv.lins):
        unsupported(where, conv, "a bias on lins (TAGConv's hop linears have none; only its own bias)")
    layer = TAGLayer(
        in_dim,
        conv.out_channels,
        K=conv.K,
        bias=conv.bias is not None,
        normalize=bool(conv.normalize),
        use_edge_weight=use_edge_weight,
    )
    return _copy_hop_weights(layer, layer.tag_rounds(), conv, where)


def _copy_hop_weights(layer, rounds, conv, where):
    """Copy a hop-sum conv's weights (TAGConv, ChebConv: `lins[k]` weighs hop k, one bias) into its
    rounds (layers/multihop.py HopRound: the first also holds hop 0's weight, the last the bias)
    and return `layer`."""
    assert rounds[0].weight_0 is not None  # the first round starts the sum
    copy_into(rounds[0].weight_0, conv.lins[0].weight, where + ".lins.0", conv)
    for k, step in enumerate(rounds, start=1):
        copy_into(step.weight_k, conv.lins[k].weight, f"{where}.lins.{k}", conv)
    if rounds[-1].bias is not None:  # built with a bias exactly when conv has one
        copy_into(rounds[-1].bias, conv.bias, where, conv)
    return layer


def _appnp(conv, where, use_edge_weight):
    """K rounds (layers/multihop.py, APPNPRound): (1 - alpha) A x_k + alpha x_0, x_0 kept per
    vertex; normalize and add_self_loops on or off; edge weights; dropout (off in eval); its
    width comes from the layer before it; refuses K=0 and cached=True."""
    common_checks(conv, where)
    if conv.cached:
        unsupported(where, conv, "cached=True (a cached result belongs to one graph; only cached=False)")
    if int(conv.K) < 1:
        unsupported(where, conv, "K=0 propagates nothing (the conv returns its input: leave it out)")
    K, alpha = int(conv.K), float(conv.alpha)
    normalize, loops = bool(conv.normalize), bool(conv.add_self_loops)

    def build(width: int) -> MergeableConv:
        return APPNPLayer(width, K, alpha, add_self_loops=loops, normalize=normalize, use_edge_weight=use_edge_weight)

    return UnsizedConv(build, where, conv, use_edge_weight)


def _cheb(conv, where, use_edge_weight):
    """K - 1 rounds (layers/multihop.py, ChebRound): the Chebyshev recursion over PyG's scaled
    Laplacian with normalization 'sym' or 'rw' and lambda_max None (then 2, for edge weights >= 0;
    a negative weight is refused when the layer runs); edge weights; bias. Refuses
    normalization=None (lambda_max = 2 x the graph's largest degree, a global maximum no vertex
    can read locally) and K=1."""
    common_checks(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    if conv.normalization not in CHEB_NORMALIZATIONS:
        unsupported(
            where,
            conv,
            f"normalization={conv.normalization!r}: lambda_max is then 2 x the graph's largest degree, a "
            "global maximum no vertex can read locally (normalization 'sym' and 'rw' are supported)",
        )
    K = len(conv.lins)
    if K < 2:
        unsupported(where, conv, "K=1 propagates nothing (the conv is a Linear: write one instead)")
    if any(lin.bias is not None for lin in conv.lins):
        unsupported(where, conv, "a bias on lins (ChebConv's hop linears have none; only its own bias)")
    layer = ChebLayer(
        in_dim,
        conv.out_channels,
        K=K,
        normalization=conv.normalization,
        bias=conv.bias is not None,
        use_edge_weight=use_edge_weight,
    )
    return _copy_hop_weights(layer, layer.cheb_rounds(), conv, where)
