"""PyG convolutions -> sparkgnn MergeableConvs with copied weights.

CONV_CONVERTERS maps the exact conv class (GCNConv, SAGEConv, GINConv, GATConv, GATv2Conv,
ResGatedGraphConv, LEConv, ...; by qualified name, see pyg_common) to a converter
`(conv, where, use_edge_weight) -> MergeableConv`; convs whose forward takes an edge weight
(GCNConv, LEConv) consume it when the flag is set, the others ignore the flag. REJECTED maps
convs that look close to a supported one but are not (GINEConv) to the reason given. SAGE_AGGREGATIONS maps
the PyG aggregation modules SAGEConv may use to a sparkgnn aggregator name and options; any other
aggregation cannot be merged across partitions exactly and is refused.

WHY exact classes and explicit refusals: sparkgnn reproduces a layer's forward from its
parameters, so a subclass that overrides forward, an option whose semantics we do not implement,
or an aggregation that cannot be merged would be *silently wrong*.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.base import MergeableConv
from sparkgnn.layers.gat import GATLayer
from sparkgnn.layers.gatv2 import GATv2Layer
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.gin import GINLayer
from sparkgnn.layers.graphconv import GraphConvLayer
from sparkgnn.layers.le import LELayer
from sparkgnn.layers.multihop import SGLayer
from sparkgnn.layers.nodeops import ActivationOp, BatchNormOp, LinearOp
from sparkgnn.layers.resgated import ResGatedLayer
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.models.pyg_common import class_name, copy_into, is_message_passing, short_name, tensor_of, unsupported
from sparkgnn.models.pyg_nodeops import node_ops, stack
from sparkgnn.registry import Registry

ConvConverter = Callable[..., MergeableConv]

CONV_CONVERTERS: Registry[ConvConverter] = Registry("PyG conv", UnsupportedModelError)
REJECTED: dict[str, str] = {}  # PyG class name -> why it is refused
SAGE_AGGREGATIONS: Registry[Callable] = Registry("SAGEConv aggregation", UnsupportedModelError)


def is_conv(module) -> bool:
    """A graph convolution (supported, rejected or unknown): it must sit at the top level of a
    stack, where conv_layer converts or refuses it."""
    ensure_registered()
    name = class_name(module)
    return name in CONV_CONVERTERS or name in REJECTED or is_message_passing(module)


def conv_layer(conv, where: str, use_edge_weight: bool = True) -> MergeableConv:
    """The exact class's converter, or UnsupportedModelError naming why there is none."""
    ensure_registered()
    name = class_name(conv)
    if name in REJECTED:
        unsupported(where, conv, REJECTED[name])
    convert = CONV_CONVERTERS.get(name)
    if convert is None:
        supported = ", ".join(sorted(short_name(n) for n in CONV_CONVERTERS))
        for base in type(conv).__mro__[1:]:
            if class_name(base) in CONV_CONVERTERS:
                unsupported(
                    where,
                    conv,
                    f"subclass of {short_name(base)} may override forward(); "
                    f"only the exact classes {supported} are supported",
                )
        unsupported(where, conv, f"layer {name} is not supported (supported convs: {supported})")
    return convert(conv, where, use_edge_weight)


def _common_checks(conv, where: str, aggr: str | None = "add"):
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        unsupported(where, conv, f"flow={conv.flow!r} (only 'source_to_target')")
    if aggr is not None and conv.aggr != aggr:
        unsupported(where, conv, f"aggr={conv.aggr!r} (this layer is only supported with aggr={aggr!r})")
    if getattr(conv, "explain", None):
        unsupported(where, conv, "explain mode is on")


def in_width(in_channels, where, conv) -> int:
    """A homogeneous, explicit input width (refusing bipartite and lazy ones)."""
    if isinstance(in_channels, (tuple, list)):
        if in_channels[0] != in_channels[1]:
            unsupported(
                where,
                conv,
                f"bipartite in_channels={tuple(in_channels)}: sparkgnn "
                f"runs homogeneous graphs (source and destination share features)",
            )
        in_channels = in_channels[0]
    if in_channels is None or int(in_channels) <= 0:
        unsupported(where, conv, "lazy in_channels=-1; give explicit in_channels")
    return int(in_channels)


def _gcn(conv, where, use_edge_weight):
    """GCN layer (kind "gcn"); edge weights; refuses improved=True."""
    _common_checks(conv, where)
    if conv.improved:
        unsupported(where, conv, "improved=True (only improved=False)")
    layer = GCNLayer(
        in_width(conv.in_channels, where, conv),
        conv.out_channels,
        normalize=conv.normalize,
        add_self_loops=bool(conv.add_self_loops),
        bias=conv.bias is not None,
        use_edge_weight=use_edge_weight,
    )
    assert layer.weight is not None  # built linear (the default)
    copy_into(layer.weight, conv.lin.weight, where + ".lin", conv)
    if layer.bias is not None:  # built with a bias exactly when conv has one
        copy_into(layer.bias, conv.bias, where, conv)
    return layer


def _param_value(v, where, conv):
    """A learnable (tensor -> list) or fixed (float) aggregation parameter, and whether it is
    anything but the fixed value 1 (which PyG treats as "no transform")."""
    if torch.is_tensor(v):
        return tensor_of(v, where, conv).view(-1).tolist(), True
    return float(v), v != 1


def _powermean(a, where, conv):
    p, transform = _param_value(a.p, where, conv)
    return "powermean", {"p": p, "clamp_min": a.min_value, "clamp_max": a.max_value, "transform": bool(transform)}


def _softmax(a, where, conv):
    t, transform = _param_value(a.t, where, conv)
    return "softmax", {"t": t, "transform": bool(transform)}


def _plain(name):
    return lambda a, where, conv: (name, {})


def _sage_aggr(conv, where):
    a = conv.aggr_module
    convert = SAGE_AGGREGATIONS.get(class_name(a))
    if convert is None:
        unsupported(
            where,
            conv,
            f"aggregation {short_name(a)} (aggr={conv.aggr!r}) cannot be merged "
            f"across partitions exactly; supported: sum, mean, max, min, var, std, "
            f"PowerMeanAggregation, SoftmaxAggregation",
        )
    return convert(a, where, conv)


def _sage(conv, where, use_edge_weight):
    """SAGE layer (kind "sage"): sum, mean, max, min, var, std, power-mean and softmax
    aggregations, project, normalize, root_weight; refuses other aggregations (LSTM, median,
    multi-aggregation, ...)."""
    _common_checks(conv, where, aggr=None)
    in_dim = in_width(conv.in_channels, where, conv)
    aggr, opts = _sage_aggr(conv, where)
    layer = SAGELayer(
        in_dim,
        conv.out_channels,
        aggr=aggr,
        aggr_options=opts,
        normalize=conv.normalize,
        root_weight=conv.root_weight,
        bias=conv.lin_l.bias is not None,
        project=bool(conv.project),
    )
    if layer.weight_p is not None:  # built with a projection exactly when conv has one
        _linear_into(layer.weight_p, layer.bias_p, conv.lin, where + ".lin", conv)
    copy_into(layer.weight_l, conv.lin_l.weight, where + ".lin_l", conv)
    if layer.bias_l is not None:  # built with a bias exactly when conv.lin_l has one
        copy_into(layer.bias_l, conv.lin_l.bias, where + ".lin_l", conv)
    if layer.weight_r is not None:  # built with a root weight exactly when conv has one
        copy_into(layer.weight_r, conv.lin_r.weight, where + ".lin_r", conv)
    return layer


def _input_width(ops: list) -> int | None:
    """The row width a node-op stack reads, from its first Linear or BatchNorm; None when neither
    is in the stack (the ops before it, activations or dropout, keep any width)."""
    for op in ops:
        if isinstance(op, LinearOp):
            return op.in_features
        if isinstance(op, BatchNormOp):
            return op.num_features
    return None


def _gin(conv, where, use_edge_weight):
    """GIN layer (kind "gin"): nn of Linear, activations, BatchNorm, Dropout (MLP included)."""
    _common_checks(conv, where)
    ops = node_ops(conv.nn, where + ".nn")
    in_dim = _input_width(ops)
    if in_dim is None:
        unsupported(where, conv, "nn has no Linear/BatchNorm, so its input width is unknown")
    layer = GINLayer(in_dim, [op.config() for op in ops])
    layer.nn = stack(ops)
    copy_into(layer.eps, conv.eps.view(-1), where + ".eps", conv)
    return layer


def _attention_options(conv) -> dict:
    """The head options GATConv and GATv2Conv share, as keywords of GATLayer / GATv2Layer."""
    return {
        "heads": conv.heads,
        "concat": conv.concat,
        "negative_slope": conv.negative_slope,
        "add_self_loops": conv.add_self_loops,
        "residual": getattr(conv, "res", None) is not None,
    }


def _attention_output_into(layer, conv, where) -> None:
    """Copy GATConv's / GATv2Conv's residual Linear (no bias) and output bias into the layer built
    from `_attention_options`; refuses a residual module of another form."""
    res = getattr(conv, "res", None)
    if res is not None:
        if not isinstance(res, torch.nn.Module) or not hasattr(res, "weight"):
            unsupported(where, conv, "residual module of unknown form")
        if getattr(res, "bias", None) is not None:
            unsupported(where, conv, "residual Linear with bias")
        assert layer.weight_res is not None  # built with residual=True from _attention_options
        copy_into(layer.weight_res, res.weight, where + ".res", conv)
    if layer.bias is not None:  # built with a bias exactly when conv has one
        copy_into(layer.bias, conv.bias, where, conv)


def _gat(conv, where, use_edge_weight):
    """GAT layer (kind "gat"): heads, concat, residual, separate source / destination linears; refuses edge_dim."""
    _common_checks(conv, where)
    _no_edge_dim(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    separate = conv.lin is None
    layer = GATLayer(
        in_dim,
        conv.out_channels,
        bias=conv.bias is not None,
        separate_dst_lin=separate,
        **_attention_options(conv),
    )
    if layer.weight_dst is not None:  # built with a separate destination linear exactly when conv is
        copy_into(layer.weight, conv.lin_src.weight, where + ".lin_src", conv)
        copy_into(layer.weight_dst, conv.lin_dst.weight, where + ".lin_dst", conv)
    else:
        copy_into(layer.weight, conv.lin.weight, where + ".lin", conv)
    copy_into(layer.att_src, conv.att_src, where + ".att_src", conv)
    copy_into(layer.att_dst, conv.att_dst, where + ".att_dst", conv)
    _attention_output_into(layer, conv, where)
    return layer


def _linear_into(weight, bias, lin, where, conv):
    """Copy a PyG/torch Linear's weight and bias into a layer's parameters (`bias` None: the
    layer was built without one, which must be lin's layout too)."""
    if (bias is None) != (getattr(lin, "bias", None) is None):
        unsupported(where, conv, f"{'a' if bias is None else 'no'} bias on this Linear, unlike the conv's layout")
    copy_into(weight, lin.weight, where, conv)
    if bias is not None:
        copy_into(bias, lin.bias, where, conv)


def _no_edge_dim(conv, where):
    if getattr(conv, "edge_dim", None) is not None or getattr(conv, "lin_edge", None) is not None:
        unsupported(where, conv, f"edge_dim={conv.edge_dim} (edge features are not supported yet; only edge_dim=None)")


def _gatv2(conv, where, use_edge_weight):
    """GATv2 layer (kind "gatv2"): heads, concat, negative_slope, self loops (any fill_value),
    bias, share_weights, residual; refuses edge_dim."""
    _common_checks(conv, where, aggr=None)
    if conv.aggr not in ("add", "sum"):  # GATv2Conv's default is MessagePassing's "sum"
        unsupported(where, conv, f"aggr={conv.aggr!r} (this layer is only supported with aggr='add')")
    _no_edge_dim(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    has_bias = conv.bias is not None
    if (conv.lin_l.bias is not None) != has_bias or (conv.lin_r.bias is not None) != has_bias:
        unsupported(where, conv, "lin_l / lin_r / bias disagree on having a bias (not a GATv2Conv(bias=...) layout)")
    layer = GATv2Layer(
        in_dim,
        conv.out_channels,
        bias=has_bias,
        share_weights=conv.share_weights,
        **_attention_options(conv),
    )
    # fill_value only fills edge features of the added self loops: without edge_dim it changes nothing
    _linear_into(layer.weight_src, layer.bias_src, conv.lin_l, where + ".lin_l", conv)
    if layer.weight_dst is not None:  # built with its own destination linear exactly when conv shares none
        _linear_into(layer.weight_dst, layer.bias_dst, conv.lin_r, where + ".lin_r", conv)
    copy_into(layer.att, conv.att, where + ".att", conv)
    _attention_output_into(layer, conv, where)
    return layer


def _resgated(conv, where, use_edge_weight):
    """ResGated layer (kind "resgated"): any parameter-free activation as act, root_weight, bias;
    refuses edge_dim."""
    _common_checks(conv, where)
    _no_edge_dim(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    if conv.act is None:
        unsupported(where, conv, "act=None (the gate needs an activation)")
    ops = node_ops(conv.act, where + ".act")
    if len(ops) != 1 or not isinstance(ops[0], ActivationOp):
        unsupported(where, conv, f"act={conv.act!r}: only a single parameter-free activation is supported")
    act = ops[0].config()
    act.pop("op")
    layer = ResGatedLayer(
        in_dim, conv.out_channels, act=act, root_weight=conv.lin_skip is not None, bias=conv.bias is not None
    )
    _linear_into(layer.weight_key, layer.bias_key, conv.lin_key, where + ".lin_key", conv)
    _linear_into(layer.weight_query, layer.bias_query, conv.lin_query, where + ".lin_query", conv)
    _linear_into(layer.weight_value, layer.bias_value, conv.lin_value, where + ".lin_value", conv)
    if layer.weight_skip is not None:  # built with a skip weight exactly when conv has one
        copy_into(layer.weight_skip, conv.lin_skip.weight, where + ".lin_skip", conv)
    if layer.bias is not None:  # built with a bias exactly when conv has one
        copy_into(layer.bias, conv.bias, where, conv)
    return layer


def _le(conv, where, use_edge_weight):
    """LE layer (kind "le"): edge weights, bias."""
    _common_checks(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    has_bias = conv.lin1.bias is not None
    if (conv.lin3.bias is not None) != has_bias or conv.lin2.bias is not None:
        unsupported(where, conv, "lin1 / lin2 / lin3 biases are not LEConv(bias=...)'s layout")
    layer = LELayer(in_dim, conv.out_channels, bias=has_bias, use_edge_weight=use_edge_weight)
    _linear_into(layer.weight_1, layer.bias_1, conv.lin1, where + ".lin1", conv)
    copy_into(layer.weight_2, conv.lin2.weight, where + ".lin2", conv)
    _linear_into(layer.weight_3, layer.bias_3, conv.lin3, where + ".lin3", conv)
    return layer


def _graphconv(conv, where, use_edge_weight):
    """GraphConv layer (kind "graphconv"): sum, mean, max, min, var, std, power-mean
    aggregation; edge weights; refuses softmax aggregation."""
    _common_checks(conv, where, aggr=None)
    in_dim = in_width(conv.in_channels, where, conv)
    aggr, opts = _sage_aggr(conv, where)
    if aggr == "softmax":
        unsupported(
            where,
            conv,
            "aggr=SoftmaxAggregation (GraphConv is supported with sum, mean, max, min, var, std, PowerMeanAggregation)",
        )
    layer = GraphConvLayer(
        in_dim,
        conv.out_channels,
        aggr=aggr,
        aggr_options=opts,
        bias=conv.lin_rel.bias is not None,
        use_edge_weight=use_edge_weight,
    )
    _linear_into(layer.weight_rel, layer.bias_rel, conv.lin_rel, where + ".lin_rel", conv)
    _linear_into(layer.weight_root, None, conv.lin_root, where + ".lin_root", conv)
    return layer


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
    width = _input_width(pre_ops)
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
    _common_checks(conv, where)
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
    _common_checks(conv, where)
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


@functools.cache
def ensure_registered() -> bool:
    """Fill this module's registries (once; imports torch_geometric)."""
    import torch_geometric.nn as gnn
    import torch_geometric.nn.aggr as A

    for t, convert in ((gnn.GCNConv, _gcn), (gnn.SAGEConv, _sage), (gnn.GINConv, _gin), (gnn.GATConv, _gat)):
        CONV_CONVERTERS.register(class_name(t), convert)
    for t, convert in ((gnn.GATv2Conv, _gatv2), (gnn.ResGatedGraphConv, _resgated), (gnn.LEConv, _le)):
        CONV_CONVERTERS.register(class_name(t), convert)
    for t, convert in ((gnn.GraphConv, _graphconv), (gnn.LGConv, _lg), (gnn.SGConv, _sg)):
        CONV_CONVERTERS.register(class_name(t), convert)
    REJECTED[class_name(gnn.GINEConv)] = "GINEConv needs edge features; only GINConv is supported"
    for t, aggr in (
        (A.SumAggregation, _plain("sum")),
        (A.MeanAggregation, _plain("mean")),
        (A.MaxAggregation, _plain("max")),
        (A.MinAggregation, _plain("min")),
        (A.VarAggregation, _plain("var")),
        (A.StdAggregation, _plain("std")),
        (A.PowerMeanAggregation, _powermean),
        (A.SoftmaxAggregation, _softmax),
    ):
        SAGE_AGGREGATIONS.register(class_name(t), aggr)
    return True
