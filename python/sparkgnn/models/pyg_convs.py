"""PyG convolutions -> sparkgnn MergeableConvs with copied weights.

CONV_CONVERTERS maps the exact conv class (GCNConv, SAGEConv, GINConv, GATConv, GATv2Conv,
ResGatedGraphConv, LEConv, ...; by qualified name, see pyg_common) to a converter
`(conv, where, use_edge_weight) -> MergeableConv`; convs whose forward takes an edge weight
(GCNConv, LEConv) consume it when the flag is set, the others ignore the flag; convs that read
edge features (GINEConv, GATConv / GATv2Conv with edge_dim) convert to layers with `edge_attr_dim`.
The multi-hop and width-less convs (SGConv, TAGConv, ChebConv, APPNP, LGConv) have their converters
in pyg_multihop, registered here.
REJECTED maps convs that look close to a supported one but are not (ChebConv) to the reason given.
SAGE_AGGREGATIONS maps the PyG aggregation modules SAGEConv may use to a sparkgnn aggregator name and options; any other
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
from sparkgnn.layers.edgeconv import EDGE_AGGRS, EdgeConvLayer
from sparkgnn.layers.gat import GATLayer
from sparkgnn.layers.gatv2 import GATv2Layer
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.gen import GENLayer
from sparkgnn.layers.gin import GINELayer, GINLayer
from sparkgnn.layers.graphconv import GraphConvLayer
from sparkgnn.layers.le import LELayer
from sparkgnn.layers.nodeops import ActivationOp
from sparkgnn.layers.pna import PNALayer
from sparkgnn.layers.resgated import ResGatedLayer
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.layers.transformer import TransformerLayer
from sparkgnn.models import pyg_multihop
from sparkgnn.models.pyg_common import (
    class_name,
    common_checks,
    copy_into,
    in_width,
    is_message_passing,
    short_name,
    tensor_of,
    unsupported,
)
from sparkgnn.models.pyg_multihop import UnsizedConv
from sparkgnn.models.pyg_nodeops import input_width, node_ops, stack
from sparkgnn.registry import Registry

ConvConverter = Callable[..., MergeableConv]

CONV_CONVERTERS: Registry[ConvConverter] = Registry("PyG conv", UnsupportedModelError)
REJECTED: dict[str, str] = {  # PyG class name -> why it is refused
    "torch_geometric.nn.conv.hgt_conv.HGTConv": (
        "a typed conv (its softmax spans every relation into a node type): HeteroModel.from_pyg converts it, "
        "exactly, as one typed round whose relations' partial softmax states merge per type (layers/hgt.py)"
    ),
    **{
        f"torch_geometric.nn.conv.rgcn_conv.{name}": (
            "a typed conv (one weight per relation, bases or blocks): HeteroModel.from_pyg converts it, exactly, "
            "as one typed round with a relation per edge type (models/from_pyg_hetero.py)"
        )
        for name in ("RGCNConv", "FastRGCNConv")
    },
}
SAGE_AGGREGATIONS: Registry[Callable] = Registry("SAGEConv aggregation", UnsupportedModelError)


def is_conv(module) -> bool:
    """A graph convolution (supported, rejected or unknown): it must sit at the top level of a
    stack, where conv_layer converts or refuses it."""
    ensure_registered()
    name = class_name(module)
    return name in CONV_CONVERTERS or name in REJECTED or is_message_passing(module)


def conv_layer(conv, where: str, use_edge_weight: bool = True, *, call_known: bool = True) -> MergeableConv:
    """The exact class's converter, or UnsupportedModelError naming why there is none.
    `call_known`: False for a conv converted without the call that runs it (a bare conv, a
    torch.nn.Sequential): convs are then taken as called with edge weights, and a GENConv, whose
    edge features depend only on the call, as _gen says."""
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
        return generic_layer(conv, where)
    if not call_known and convert is _gen:
        return _gen(conv, where, use_edge_weight, call_known=False)
    return convert(conv, where, use_edge_weight)


def generic_layer(conv, where: str) -> MergeableConv:
    """The generic fallback (layers/generic.py) for a MessagePassing conv with no native layer:
    the conv itself, run on whole in-edge neighbourhoods, once the locality probe and the rebuild
    check pass; its width comes from `in_channels`, else from the layer before it. Refused when its
    forward needs more than (x, edge_index), when it is not local, or when it cannot be rebuilt
    from its class and constructor arguments (each named)."""
    import inspect

    from sparkgnn.layers.generic import GenericConv

    if not is_message_passing(conv):
        unsupported(where, conv, f"layer {class_name(conv)} is not a MessagePassing conv")
    try:
        params = list(inspect.signature(conv.forward).parameters.values())
    except (TypeError, ValueError) as e:
        unsupported(where, conv, f"forward() has no inspectable signature ({e})")
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    needed = [p.name for p in params[2:] if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(positional) < 2 or needed:
        what = needed or [p.name for p in params]
        unsupported(
            where,
            conv,
            f"not supported: forward() needs {what}; the generic fallback calls conv(x, edge_index) only",
        )
    in_channels = getattr(conv, "in_channels", None)
    if in_channels is not None:
        return GenericConv.from_module(conv, in_width(in_channels, where, conv), where)
    return UnsizedConv(lambda width: GenericConv.from_module(conv, width, where), where, conv, False)


def _gcn(conv, where, use_edge_weight):
    """GCN layer (kind "gcn"); edge weights; refuses improved=True."""
    common_checks(conv, where)
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
    common_checks(conv, where, aggr=None)
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


def _gin(conv, where, use_edge_weight):
    """GIN layer (kind "gin"): nn of Linear, activations, BatchNorm, Dropout (MLP included)."""
    common_checks(conv, where)
    ops = node_ops(conv.nn, where + ".nn")
    in_dim = input_width(ops)
    if in_dim is None:
        unsupported(where, conv, "nn has no Linear/BatchNorm, so its input width is unknown")
    layer = GINLayer(in_dim, [op.config() for op in ops])
    layer.nn = stack(ops)
    copy_into(layer.eps, conv.eps.view(-1), where + ".eps", conv)
    return layer


def _gine(conv, where, use_edge_weight):
    """GINE layer (kind "gine"): GIN's nn, eps, and edge features added to each source row before
    the ReLU, through lin when edge_dim is given (else of the input width)."""
    common_checks(conv, where)
    ops = node_ops(conv.nn, where + ".nn")
    in_dim = input_width(ops)
    if in_dim is None:
        unsupported(where, conv, "nn has no Linear/BatchNorm, so its input width is unknown")
    lin = getattr(conv, "lin", None)
    edge_dim = None
    if lin is not None:
        rows, cols = (int(n) for n in tensor_of(lin.weight, where + ".lin", conv).shape)
        if rows != in_dim or lin.bias is None:
            unsupported(where, conv, f"lin maps {cols} -> {rows} features, not GINEConv's Linear(edge_dim, {in_dim})")
        edge_dim = cols
    layer = GINELayer(in_dim, [op.config() for op in ops], edge_dim=edge_dim)
    layer.nn = stack(ops)
    copy_into(layer.eps, conv.eps.view(-1), where + ".eps", conv)
    if layer.lin is not None:  # built with lin exactly when conv has one
        _linear_into(layer.lin.weight, layer.lin.bias, lin, where + ".lin", conv)
    return layer


def _edge_dim(conv, where) -> int | None:
    """GATConv's / GATv2Conv's edge_dim (None: no edge features); refuses a self-loop fill other
    than PyG's default "mean" (layers/selfloops.py `replace_mean`) when both are on."""
    edge_dim = getattr(conv, "edge_dim", None)
    if edge_dim is None:
        return None
    fill = getattr(conv, "fill_value", "mean")
    if conv.add_self_loops and fill != "mean":
        unsupported(where, conv, f"fill_value={fill!r} with edge_dim (self-loop edge features: only fill_value='mean')")
    lin_edge = conv.lin_edge
    if getattr(lin_edge, "bias", None) is not None:
        unsupported(where, conv, "lin_edge with a bias (GATConv's / GATv2Conv's lin_edge has none)")
    return int(edge_dim)


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
    """GAT layer (kind "gat"): heads, concat, residual, separate source / destination linears,
    edge_dim (edge features in the attention logits; self-loop fill_value 'mean')."""
    common_checks(conv, where)
    edge_dim = _edge_dim(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    separate = conv.lin is None
    layer = GATLayer(
        in_dim,
        conv.out_channels,
        bias=conv.bias is not None,
        separate_dst_lin=separate,
        edge_dim=edge_dim,
        **_attention_options(conv),
    )
    if layer.weight_edge is not None and layer.att_edge is not None:  # built with edge_dim exactly when conv is
        copy_into(layer.weight_edge, conv.lin_edge.weight, where + ".lin_edge", conv)
        copy_into(layer.att_edge, conv.att_edge, where + ".att_edge", conv)
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
    """GATv2 layer (kind "gatv2"): heads, concat, negative_slope, self loops, bias, share_weights,
    residual, edge_dim (edge features in the attention; self-loop fill_value 'mean')."""
    common_checks(conv, where, aggr=None)
    if conv.aggr not in ("add", "sum"):  # GATv2Conv's default is MessagePassing's "sum"
        unsupported(where, conv, f"aggr={conv.aggr!r} (this layer is only supported with aggr='add')")
    edge_dim = _edge_dim(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    has_bias = conv.bias is not None
    if (conv.lin_l.bias is not None) != has_bias or (conv.lin_r.bias is not None) != has_bias:
        unsupported(where, conv, "lin_l / lin_r / bias disagree on having a bias (not a GATv2Conv(bias=...) layout)")
    layer = GATv2Layer(
        in_dim,
        conv.out_channels,
        bias=has_bias,
        share_weights=conv.share_weights,
        edge_dim=edge_dim,
        **_attention_options(conv),
    )
    if layer.weight_edge is not None:  # built with edge_dim exactly when conv is
        copy_into(layer.weight_edge, conv.lin_edge.weight, where + ".lin_edge", conv)
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
    common_checks(conv, where)
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
    common_checks(conv, where)
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
    common_checks(conv, where, aggr=None)
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


def _edgeconv(conv, where, use_edge_weight):
    """EdgeConv layer (kind "edge"): nn of Linear, activations, BatchNorm, Dropout (MLP
    included) over [x_i | x_j - x_i] per edge, aggr max, mean or add."""
    common_checks(conv, where, aggr=None)
    if conv.aggr not in EDGE_AGGRS:
        unsupported(where, conv, f"aggr={conv.aggr!r} (EdgeConv is supported with aggr 'max', 'mean' or 'add')")
    ops = node_ops(conv.nn, where + ".nn")
    width = input_width(ops)
    if width is None:
        unsupported(where, conv, "nn has no Linear/BatchNorm, so its input width is unknown")
    if width % 2:
        unsupported(where, conv, f"nn reads width {width}; EdgeConv feeds it [x_i | x_j - x_i], an even width")
    layer = EdgeConvLayer(width // 2, [op.config() for op in ops], aggr=conv.aggr)
    layer.nn = stack(ops)
    return layer


def _transformer(conv, where, use_edge_weight):
    """Transformer layer (kind "transformer"): heads, concat, beta, root_weight, bias, edge_dim
    (lin_edge added to each edge's key and value); softmax attention merged like GAT's."""
    common_checks(conv, where)
    in_dim = in_width(conv.in_channels, where, conv)
    has_bias = conv.lin_key.bias is not None
    lins = (conv.lin_query, conv.lin_value, conv.lin_skip)
    if any((lin.bias is not None) != has_bias for lin in lins):
        unsupported(where, conv, "lin_key / lin_query / lin_value / lin_skip disagree on having a bias")
    layer = TransformerLayer(
        in_dim,
        conv.out_channels,
        heads=conv.heads,
        concat=conv.concat,
        beta=bool(conv.beta),
        bias=has_bias,
        root_weight=conv.root_weight,
        edge_dim=conv.edge_dim,
    )
    if layer.weight_edge is not None:  # built with edge_dim exactly when conv has lin_edge
        copy_into(layer.weight_edge, conv.lin_edge.weight, where + ".lin_edge", conv)
    _linear_into(layer.weight_key, layer.bias_key, conv.lin_key, where + ".lin_key", conv)
    _linear_into(layer.weight_query, layer.bias_query, conv.lin_query, where + ".lin_query", conv)
    _linear_into(layer.weight_value, layer.bias_value, conv.lin_value, where + ".lin_value", conv)
    if layer.weight_skip is not None:  # built with a root weight exactly when conv has one
        _linear_into(layer.weight_skip, layer.bias_skip, conv.lin_skip, where + ".lin_skip", conv)
    if layer.weight_beta is not None:  # built with beta exactly when conv has lin_beta
        copy_into(layer.weight_beta, conv.lin_beta.weight, where + ".lin_beta", conv)
    return layer


def _gen(conv, where, use_edge_weight, call_known: bool = True):
    """GEN layer (kind "gen"): softmax (t, learn_t) and power-mean (p, learn_p) aggregations, also
    sum / mean / max / min / var / std; lin_src / lin_dst (in != out), bias, eps, msg_norm
    (MessageNorm, learn_msg_scale), the MLP (Linear, activations, BatchNorm, LayerNorm, Dropout);
    edge features of width edge_dim when the conv is called with edge_attr (through lin_edge, or as
    they are when edge_dim = out_channels); converted on its own (no call to read), it reads them
    only through lin_edge, and refuses a graph carrying edge features of out_channels' width (it
    cannot tell whether they are meant); refuses a multi-aggregation (lin_aggr_out)."""
    # WHY a bare conv (`call_known` False) is special: PyG reads edge_attr only when the call passes
    # it and keeps no edge_dim, so GENConv(i, o) and GENConv(i, o, edge_dim=o) are the same module.
    # With lin_edge (edge_dim given and != out_channels) the constructor asked for edge features:
    # they are read. Without, the layer reads none, as PyG's conv(x, edge_index) does, and records
    # `ambiguous_edge_dim`, so a graph carrying edge features of width out_channels is refused
    # (Model.check_edge_attr) instead of silently left out.
    common_checks(conv, where, aggr=None)
    in_dim = in_width(conv.in_channels, where, conv)
    out_dim = int(conv.out_channels)
    if hasattr(conv, "lin_aggr_out"):
        unsupported(where, conv, f"aggr={conv.aggr!r}: a multi-aggregation (lin_aggr_out); only one aggregation")
    aggr, opts = _sage_aggr(conv, where)
    lin_edge = getattr(conv, "lin_edge", None)
    # PyG keeps no edge_dim: lin_edge's input width, or out_channels when the features are added as
    # they are; called without edge_attr (use_edge_weight False), PyG's message reads none
    edge_dim = (int(lin_edge.weight.shape[1]) if lin_edge is not None else out_dim) if use_edge_weight else None
    ambiguous = None
    if not call_known and lin_edge is None:
        edge_dim, ambiguous = None, out_dim
    lins = [getattr(conv, n) for n in ("lin_src", "lin_dst", "lin_edge") if hasattr(conv, n)]
    mlp_lins = [m for m in conv.mlp.modules() if isinstance(m, torch.nn.Linear)]
    has_bias = any(lin.bias is not None for lin in lins + mlp_lins)
    if any((lin.bias is not None) != has_bias for lin in lins):
        unsupported(where, conv, "lin_src / lin_dst / lin_edge disagree on having a bias")
    # GENConv's own MLP class: a torch Sequential of Linear, BatchNorm1d / LayerNorm / InstanceNorm1d,
    # ReLU and Dropout, converted child by child (InstanceNorm1d is refused there by name)
    ops = [op for name, child in conv.mlp.named_children() for op in node_ops(child, f"{where}.mlp.{name}")]
    layer = GENLayer(
        in_dim,
        out_dim,
        [op.config() for op in ops],
        aggr=aggr,
        aggr_options=opts,
        eps=float(conv.eps),
        bias=has_bias,
        msg_norm=hasattr(conv, "msg_norm"),
        edge_dim=edge_dim,
        ambiguous_edge_dim=ambiguous,
    )
    layer.mlp = stack(ops)
    if layer.weight_src is not None:  # built with lin_src / lin_dst exactly when in != out, as PyG
        _linear_into(layer.weight_src, layer.bias_src, conv.lin_src, where + ".lin_src", conv)
        _linear_into(layer.weight_dst, layer.bias_dst, conv.lin_dst, where + ".lin_dst", conv)
    if layer.weight_edge is not None:  # built with lin_edge exactly when conv has one and reads edge_attr
        _linear_into(layer.weight_edge, layer.bias_edge, lin_edge, where + ".lin_edge", conv)
    if layer.msg_scale is not None:
        copy_into(layer.msg_scale, conv.msg_norm.scale, where + ".msg_norm.scale", conv)
    return layer


def _pna_aggregators(conv, where) -> list[str]:
    """The names of PNAConv's aggregators (a MultiAggregation concatenating them, or one)."""
    import torch_geometric.nn.aggr as A

    inner = conv.aggr_module.aggr
    parts = list(inner.aggrs) if isinstance(inner, A.MultiAggregation) else [inner]
    if isinstance(inner, A.MultiAggregation) and inner.mode != "cat":
        unsupported(where, conv, f"aggregators combined with mode={inner.mode!r} (only 'cat')")
    known = {
        class_name(A.MeanAggregation): "mean",
        class_name(A.MinAggregation): "min",
        class_name(A.MaxAggregation): "max",
        class_name(A.SumAggregation): "sum",
        class_name(A.VarAggregation): "var",
        class_name(A.StdAggregation): "std",
    }
    names = [known.get(class_name(a)) for a in parts]
    if None in names:
        odd = ", ".join(short_name(a) for a, n in zip(parts, names, strict=True) if n is None)
        unsupported(where, conv, f"aggregator {odd} (supported: mean, min, max, sum, var, std)")
    return [str(n) for n in names]


def _pna(conv, where, use_edge_weight):
    """PNA layer (kind "pna"): aggregators mean / min / max / sum / var / std, scalers identity /
    amplification / attenuation / linear / inverse_linear (with the degree averages of the `deg`
    histogram it was built with, trained or not), towers, divide_input, pre / post layers and their
    activation, edge_dim (edge_encoder); the in-degree comes from the engine's statistics."""
    common_checks(conv, where, aggr=None)
    in_dim = in_width(conv.in_channels, where, conv)
    aggregators = _pna_aggregators(conv, where)
    scalers = [str(s) for s in conv.aggr_module.scaler]
    stacks = {}
    for name in ("pre_nns", "post_nns"):
        stacks[name] = [node_ops(nn, f"{where}.{name}.{t}") for t, nn in enumerate(getattr(conv, name))]
    layer = PNALayer(
        in_dim,
        int(conv.out_channels),
        aggregators,
        scalers,
        [[op.config() for op in ops] for ops in stacks["pre_nns"]],
        [[op.config() for op in ops] for ops in stacks["post_nns"]],
        towers=int(conv.towers),
        divide_input=bool(conv.divide_input),
        edge_dim=conv.edge_dim,
    )
    layer.pre_nns = torch.nn.ModuleList(stack(ops) for ops in stacks["pre_nns"])
    layer.post_nns = torch.nn.ModuleList(stack(ops) for ops in stacks["post_nns"])
    if layer.edge_encoder is not None:  # built with edge_dim exactly when conv has its edge_encoder
        _linear_into(
            layer.edge_encoder.weight, layer.edge_encoder.bias, conv.edge_encoder, where + ".edge_encoder", conv
        )
    _linear_into(layer.lin.weight, layer.lin.bias, conv.lin, where + ".lin", conv)
    copy_into(layer.avg_deg_lin, conv.aggr_module.avg_deg_lin, where + ".aggr_module.avg_deg_lin", conv)
    copy_into(layer.avg_deg_log, conv.aggr_module.avg_deg_log, where + ".aggr_module.avg_deg_log", conv)
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
    for t, convert in ((gnn.GraphConv, _graphconv), (gnn.GINEConv, _gine), (gnn.EdgeConv, _edgeconv)):
        CONV_CONVERTERS.register(class_name(t), convert)
    for t, convert in ((gnn.TransformerConv, _transformer), (gnn.GENConv, _gen), (gnn.PNAConv, _pna)):
        CONV_CONVERTERS.register(class_name(t), convert)
    for t, convert in pyg_multihop.converters():
        CONV_CONVERTERS.register(class_name(t), convert)
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
