"""PyG convolutions -> sparkgnn MergeableConvs with copied weights.

CONV_CONVERTERS maps the exact conv class (GCNConv, SAGEConv, GINConv, GATConv; by qualified
name, see pyg_common) to a converter `(conv, where, use_edge_weight) -> MergeableConv`; only GCN
consumes edge weights, the others ignore the flag. REJECTED maps convs that look close to a
supported one but are not (GATv2Conv, GINEConv) to the reason given. SAGE_AGGREGATIONS maps
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
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.gin import GINLayer
from sparkgnn.layers.nodeops import BatchNormOp, LinearOp
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.models.pyg_common import class_name, copy_into, is_message_passing, short_name, tensor_of, unsupported
from sparkgnn.models.pyg_nodeops import node_ops, stack
from sparkgnn.registry import Registry

ConvConverter = Callable[..., MergeableConv]

CONV_CONVERTERS: Registry[ConvConverter] = Registry("PyG conv", UnsupportedModelError)
REJECTED: Registry[str] = Registry("rejected PyG conv", UnsupportedModelError)
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
    copy_into(layer.weight, conv.lin.weight, where + ".lin", conv)
    if conv.bias is not None:
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
    _common_checks(conv, where, aggr=None)
    if conv.project:
        unsupported(where, conv, "project=True (only project=False)")
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
    )
    copy_into(layer.weight_l, conv.lin_l.weight, where + ".lin_l", conv)
    if conv.lin_l.bias is not None:
        copy_into(layer.bias_l, conv.lin_l.bias, where + ".lin_l", conv)
    if conv.root_weight:
        copy_into(layer.weight_r, conv.lin_r.weight, where + ".lin_r", conv)
    return layer


def _gin(conv, where, use_edge_weight):
    _common_checks(conv, where)
    ops = node_ops(conv.nn, where + ".nn")
    in_dim = None
    for op in ops:
        if isinstance(op, LinearOp):
            in_dim = op.in_features
            break
        if isinstance(op, BatchNormOp):
            in_dim = op.num_features
            break
    if in_dim is None:
        unsupported(where, conv, "nn has no Linear/BatchNorm, so its input width is unknown")
    layer = GINLayer(in_dim, [op.config() for op in ops])
    layer.nn = stack(ops)
    copy_into(layer.eps, conv.eps.view(-1), where + ".eps", conv)
    return layer


def _gat(conv, where, use_edge_weight):
    _common_checks(conv, where)
    if conv.edge_dim is not None or getattr(conv, "lin_edge", None) is not None:
        unsupported(where, conv, f"edge_dim={conv.edge_dim} (edge features are not supported; only edge_dim=None)")
    in_dim = in_width(conv.in_channels, where, conv)
    separate = conv.lin is None
    res = getattr(conv, "res", None)
    layer = GATLayer(
        in_dim,
        conv.out_channels,
        heads=conv.heads,
        concat=conv.concat,
        negative_slope=conv.negative_slope,
        add_self_loops=conv.add_self_loops,
        bias=conv.bias is not None,
        residual=res is not None,
        separate_dst_lin=separate,
    )
    if separate:
        copy_into(layer.weight, conv.lin_src.weight, where + ".lin_src", conv)
        copy_into(layer.weight_dst, conv.lin_dst.weight, where + ".lin_dst", conv)
    else:
        copy_into(layer.weight, conv.lin.weight, where + ".lin", conv)
    copy_into(layer.att_src, conv.att_src, where + ".att_src", conv)
    copy_into(layer.att_dst, conv.att_dst, where + ".att_dst", conv)
    if res is not None:
        if not isinstance(res, torch.nn.Module) or not hasattr(res, "weight"):
            unsupported(where, conv, "residual module of unknown form")
        if getattr(res, "bias", None) is not None:
            unsupported(where, conv, "residual Linear with bias")
        copy_into(layer.weight_res, res.weight, where + ".res", conv)
    if conv.bias is not None:
        copy_into(layer.bias, conv.bias, where, conv)
    return layer


@functools.cache
def ensure_registered() -> bool:
    """Fill this module's registries (once; imports torch_geometric)."""
    import torch_geometric.nn as gnn
    import torch_geometric.nn.aggr as A

    for t, convert in ((gnn.GCNConv, _gcn), (gnn.SAGEConv, _sage), (gnn.GINConv, _gin), (gnn.GATConv, _gat)):
        CONV_CONVERTERS.register(class_name(t), convert)
    REJECTED.register(
        class_name(gnn.GATv2Conv), "GATv2Conv (dynamic attention, 'v2') is not supported; only GATConv (v1)"
    )
    REJECTED.register(class_name(gnn.GINEConv), "GINEConv needs edge features; only GINConv is supported")
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
