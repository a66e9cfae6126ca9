"""Conversion of PyTorch Geometric modules into sparkgnn Models.

Three registries keyed by the exact PyG / torch class:
  MODEL_CONVERTERS  whole models (BasicGNN GCN/GraphSAGE/GIN/GAT, Sequential/ModuleList stacks)
  CONV_CONVERTERS   GCNConv, SAGEConv, GINConv, GATConv -> MergeableConv with copied weights
  NODE_CONVERTERS   node-wise modules (Linear, activations, BatchNorm, MLP, ...) -> node ops
WHY exact classes and explicit refusals: sparkgnn reproduces a layer's forward from its
parameters, so a subclass that overrides forward, an option whose semantics we do not
implement, or a layer whose aggregation cannot be merged would be *silently wrong*. Anything not
registered raises UnsupportedModelError naming the module (its path in the model) and the
option, so users know exactly what to change.

torch_geometric is imported lazily: it is only needed to convert, never to serve.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.gat import GATLayer
from sparkgnn.layers.gcn import GCNLayer
from sparkgnn.layers.gin import GINLayer
from sparkgnn.layers.nodeops import (ActivationOp, BatchNormOp, LinearOp, NodeOp, NodeOpStack,
                                     PReLUOp)
from sparkgnn.layers.sage import SAGELayer

MODEL_CONVERTERS: dict[type, Callable] = {}
CONV_CONVERTERS: dict[type, Callable] = {}
NODE_CONVERTERS: dict[type, Callable] = {}
REJECTED: dict[type, str] = {}


def _name(obj) -> str:
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _short(obj) -> str:
    return (obj if isinstance(obj, type) else type(obj)).__name__


def _unsupported(where: str, module, what: str):
    raise UnsupportedModelError(f"{where} ({_short(module)}): {what}")


def _tensor(t, where: str, module) -> torch.Tensor:
    if isinstance(t, torch.nn.parameter.UninitializedParameter):
        _unsupported(where, module, "has lazily initialised (uninitialised) parameters; run one "
                     "forward pass or give explicit in_channels before converting")
    return t.detach().to(dtype=torch.float32, device="cpu").clone().contiguous()


def _copy(dst: torch.Tensor, src, where: str, module) -> None:
    src = _tensor(src, where, module)
    if tuple(src.shape) != tuple(dst.shape):
        _unsupported(where, module, f"parameter shape {tuple(src.shape)} where "
                     f"{tuple(dst.shape)} was expected")
    with torch.no_grad():
        dst.copy_(src)


# ---------------------------------------------------------------------------------------------
# node-wise modules
# ---------------------------------------------------------------------------------------------
def node_ops(module, where: str) -> list[NodeOp]:
    """Node-wise module (or plain activation function) -> list of node ops ([] for no-ops)."""
    _registries()
    if not isinstance(module, torch.nn.Module):
        fn = _FUNCTIONS.get(module)
        if fn is None:
            raise UnsupportedModelError(
                f"{where}: callable {getattr(module, '__qualname__', module)!r} is not a "
                f"supported activation function; use a torch.nn activation module")
        name, opts = fn
        return [ActivationOp(name, **opts)]
    conv = type(module) in CONV_CONVERTERS or _is_message_passing(module)
    if conv:
        _unsupported(where, module, "graph convolution nested inside a node-wise block "
                     "(e.g. an MLP or nested Sequential); put convs at the top level of the stack")
    conv_fn = NODE_CONVERTERS.get(type(module))
    if conv_fn is None:
        _unsupported(where, module, f"module {_name(module)} is not a supported node-wise "
                     f"operation (supported: {', '.join(sorted(_short(t) for t in NODE_CONVERTERS))})")
    return conv_fn(module, where)


def _linear(m, where):
    w = m.weight
    _tensor(w, where, m)
    op = LinearOp(w.shape[1], w.shape[0], bias=m.bias is not None)
    _copy(op.weight, w, where, m)
    if m.bias is not None:
        _copy(op.bias, m.bias, where, m)
    return [op]


def _act(name, **fixed):
    def conv(m, where):
        opts = {k: (getter(m) if callable(getter) else getter) for k, getter in fixed.items()}
        return [ActivationOp(name, **opts)]
    return conv


def _softmax_like(name):
    def conv(m, where):
        if m.dim not in (1, -1):
            _unsupported(where, m, f"dim={m.dim}: only the feature axis (dim=1 or -1) is "
                         f"node-wise")
        return [ActivationOp(name)]
    return conv


def _prelu(m, where):
    op = PReLUOp(m.weight.numel())
    _copy(op.weight, m.weight.view(-1), where, m)
    return [op]


def _batchnorm1d(m, where):
    if not m.track_running_stats or m.running_mean is None or m.running_var is None:
        _unsupported(where, m, "track_running_stats=False: in eval mode it normalises with "
                     "statistics of the whole batch of nodes, which is not node-wise")
    op = BatchNormOp(m.num_features, eps=m.eps, affine=m.affine)
    _copy(op.running_mean, m.running_mean, where, m)
    _copy(op.running_var, m.running_var, where, m)
    if m.affine:
        _copy(op.weight, m.weight, where, m)
        _copy(op.bias, m.bias, where, m)
    return [op]


def _pyg_batchnorm(m, where):
    return _batchnorm1d(m.module, where + ".module")


def _noop(m, where):
    return []


def _sequential(m, where):
    ops = []
    for name, child in m.named_children():
        ops += node_ops(child, f"{where}.{name}")
    return ops


def _pyg_mlp(m, where):
    """Mirror torch_geometric.nn.MLP.forward: lin, [act], norm, [act], dropout; plain last."""
    if getattr(m, "residual", False):
        _unsupported(where, m, "residual=True")
    act = [] if m.act is None else node_ops(m.act, f"{where}.act")
    ops = []
    for i, (lin, norm) in enumerate(zip(m.lins, m.norms)):
        ops += node_ops(lin, f"{where}.lins.{i}")
        if m.act_first:
            ops += act
        ops += node_ops(norm, f"{where}.norms.{i}")
        if not m.act_first:
            ops += act
    if m.plain_last:
        ops += node_ops(m.lins[-1], f"{where}.lins.{len(m.lins) - 1}")
    return ops


def _stack(ops) -> NodeOpStack:
    return NodeOpStack(ops=list(ops))


# ---------------------------------------------------------------------------------------------
# convolutions
# ---------------------------------------------------------------------------------------------
def _is_message_passing(module) -> bool:
    from torch_geometric.nn.conv import MessagePassing

    return isinstance(module, MessagePassing)


def _common_checks(conv, where: str, aggr: str | None = "add"):
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        _unsupported(where, conv, f"flow={conv.flow!r} (only 'source_to_target')")
    if aggr is not None and conv.aggr != aggr:
        _unsupported(where, conv, f"aggr={conv.aggr!r} (this layer is only supported with "
                     f"aggr={aggr!r})")
    if getattr(conv, "explain", None):
        _unsupported(where, conv, "explain mode is on")


def _in_width(in_channels, where, conv) -> int:
    if isinstance(in_channels, (tuple, list)):
        if in_channels[0] != in_channels[1]:
            _unsupported(where, conv, f"bipartite in_channels={tuple(in_channels)}: sparkgnn "
                         f"runs homogeneous graphs (source and destination share features)")
        in_channels = in_channels[0]
    if in_channels is None or int(in_channels) <= 0:
        _unsupported(where, conv, "lazy in_channels=-1; give explicit in_channels")
    return int(in_channels)


def _gcn(conv, where, use_edge_weight=True):
    _common_checks(conv, where)
    if conv.improved:
        _unsupported(where, conv, "improved=True (only improved=False)")
    layer = GCNLayer(_in_width(conv.in_channels, where, conv), conv.out_channels,
                     normalize=conv.normalize, add_self_loops=bool(conv.add_self_loops),
                     bias=conv.bias is not None, use_edge_weight=use_edge_weight)
    _copy(layer.weight, conv.lin.weight, where + ".lin", conv)
    if conv.bias is not None:
        _copy(layer.bias, conv.bias, where, conv)
    return layer


def _sage_aggr(conv, where):
    import torch_geometric.nn.aggr as A

    a = conv.aggr_module
    simple = {A.SumAggregation: "sum", A.MeanAggregation: "mean", A.MaxAggregation: "max",
              A.MinAggregation: "min", A.VarAggregation: "var", A.StdAggregation: "std"}
    if type(a) in simple:
        return simple[type(a)], {}
    if type(a) is A.PowerMeanAggregation:
        p = a.p
        p_val = _tensor(p, where, conv).view(-1).tolist() if torch.is_tensor(p) else float(p)
        transform = torch.is_tensor(p) or p != 1
        return "powermean", {"p": p_val, "clamp_min": a.min_value, "clamp_max": a.max_value,
                             "transform": bool(transform)}
    if type(a) is A.SoftmaxAggregation:
        t = a.t
        t_val = _tensor(t, where, conv).view(-1).tolist() if torch.is_tensor(t) else float(t)
        return "softmax", {"t": t_val, "transform": bool(torch.is_tensor(t) or t != 1)}
    _unsupported(where, conv, f"aggregation {_short(a)} (aggr={conv.aggr!r}) cannot be merged "
                 f"across partitions exactly; supported: sum, mean, max, min, var, std, "
                 f"PowerMeanAggregation, SoftmaxAggregation")


def _sage(conv, where):
    _common_checks(conv, where, aggr=None)
    if conv.project:
        _unsupported(where, conv, "project=True (only project=False)")
    in_dim = _in_width(conv.in_channels, where, conv)
    aggr, opts = _sage_aggr(conv, where)
    layer = SAGELayer(in_dim, conv.out_channels, aggr=aggr, aggr_options=opts,
                      normalize=conv.normalize, root_weight=conv.root_weight,
                      bias=conv.lin_l.bias is not None)
    _copy(layer.weight_l, conv.lin_l.weight, where + ".lin_l", conv)
    if conv.lin_l.bias is not None:
        _copy(layer.bias_l, conv.lin_l.bias, where + ".lin_l", conv)
    if conv.root_weight:
        _copy(layer.weight_r, conv.lin_r.weight, where + ".lin_r", conv)
    return layer


def _gin(conv, where):
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
        _unsupported(where, conv, "nn has no Linear/BatchNorm, so its input width is unknown")
    layer = GINLayer(in_dim, [op.config() for op in ops])
    layer.nn = _stack(ops)
    _copy(layer.eps, conv.eps.view(-1), where + ".eps", conv)
    return layer


def _gat(conv, where):
    _common_checks(conv, where)
    if conv.edge_dim is not None or getattr(conv, "lin_edge", None) is not None:
        _unsupported(where, conv, f"edge_dim={conv.edge_dim} (edge features are not supported; "
                     f"only edge_dim=None)")
    in_dim = _in_width(conv.in_channels, where, conv)
    separate = conv.lin is None
    res = getattr(conv, "res", None)
    layer = GATLayer(in_dim, conv.out_channels, heads=conv.heads, concat=conv.concat,
                     negative_slope=conv.negative_slope, add_self_loops=conv.add_self_loops,
                     bias=conv.bias is not None, residual=res is not None,
                     separate_dst_lin=separate)
    if separate:
        _copy(layer.weight, conv.lin_src.weight, where + ".lin_src", conv)
        _copy(layer.weight_dst, conv.lin_dst.weight, where + ".lin_dst", conv)
    else:
        _copy(layer.weight, conv.lin.weight, where + ".lin", conv)
    _copy(layer.att_src, conv.att_src, where + ".att_src", conv)
    _copy(layer.att_dst, conv.att_dst, where + ".att_dst", conv)
    if res is not None:
        if not isinstance(res, torch.nn.Module) or not hasattr(res, "weight"):
            _unsupported(where, conv, "residual module of unknown form")
        if getattr(res, "bias", None) is not None:
            _unsupported(where, conv, "residual Linear with bias")
        _copy(layer.weight_res, res.weight, where + ".res", conv)
    if conv.bias is not None:
        _copy(layer.bias, conv.bias, where, conv)
    return layer


def conv_layer(conv, where: str, use_edge_weight: bool = True):
    _registries()
    t = type(conv)
    if t in REJECTED:
        _unsupported(where, conv, REJECTED[t])
    fn = CONV_CONVERTERS.get(t)
    if fn is None:
        supported = ", ".join(sorted(_short(c) for c in CONV_CONVERTERS))
        for base in CONV_CONVERTERS:
            if isinstance(conv, base):
                _unsupported(where, conv, f"subclass of {_short(base)} may override forward(); "
                             f"only the exact classes {supported} are supported")
        _unsupported(where, conv, f"layer {_name(conv)} is not supported (supported convs: "
                     f"{supported})")
    if fn is _gcn:          # the only supported conv that consumes edge weights
        return fn(conv, where, use_edge_weight=use_edge_weight)
    return fn(conv, where)


# ---------------------------------------------------------------------------------------------
# whole models
# ---------------------------------------------------------------------------------------------
class _Chain:
    """Accumulates pre ops, convs and the node ops after each conv."""

    def __init__(self):
        self.pre: list[NodeOp] = []
        self.convs = []
        self.posts: list[list[NodeOp]] = []

    def add_ops(self, ops):
        (self.posts[-1] if self.convs else self.pre).extend(ops)

    def add_conv(self, layer):
        self.convs.append(layer)
        self.posts.append([])


def _basic_gnn(m, where):
    if m.jk_mode is not None:
        _unsupported(where, m, f"jk={m.jk_mode!r} (only jk=None)")
    if isinstance(m.in_channels, (tuple, list)):
        _in_width(m.in_channels, where, m)
    chain = _Chain()
    act = [] if m.act is None else node_ops(m.act, f"{where}.act")
    n = len(m.convs)
    for i, (conv, norm) in enumerate(zip(m.convs, m.norms)):
        chain.add_conv(conv_layer(conv, f"{where}.convs.{i}",
                                  use_edge_weight=bool(m.supports_edge_weight)))
        if i < n - 1:
            norm_ops = node_ops(norm, f"{where}.norms.{i}")
            chain.add_ops(act + norm_ops if m.act_first else norm_ops + act)
    if hasattr(m, "lin"):
        chain.add_ops(node_ops(m.lin, f"{where}.lin"))
    return chain


def _flatten(module, where):
    if type(module) in (torch.nn.Sequential, torch.nn.ModuleList):
        for name, child in module.named_children():
            yield from _flatten(child, f"{where}.{name}")
    else:
        yield module, where


def _torch_stack(m, where):
    chain = _Chain()
    for child, path in _flatten(m, where):
        if type(child) in CONV_CONVERTERS or type(child) in REJECTED or _is_message_passing(child):
            chain.add_conv(conv_layer(child, path))
        else:
            chain.add_ops(node_ops(child, path))
    return chain


def _pyg_sequential(m, where):
    """Accept only a straight chain: each conv reads (x, edge_index[, edge_weight]) of the
    model's inputs and the current features, each other child reads just the current features,
    and every child writes one value that becomes the current features."""
    params = list(m.signature.param_dict)
    if len(params) < 2:
        _unsupported(where, m, f"signature {params}: expected (x, edge_index[, edge_weight])")
    cur, ei = params[0], params[1]
    ew = params[2] if len(params) > 2 else None
    if len(params) > 3:
        _unsupported(where, m, f"extra inputs {params[3:]}")
    chain = _Chain()
    for child in m._children:
        mod = getattr(m, child.name)
        path = f"{where}.{child.name}"
        args, outs = list(child.param_names), list(child.return_names)
        if len(outs) != 1:
            _unsupported(path, mod, f"returns {outs}; only single-output chains are supported")
        is_conv = (isinstance(mod, torch.nn.Module)
                   and (type(mod) in CONV_CONVERTERS or type(mod) in REJECTED
                        or _is_message_passing(mod)))
        if is_conv:
            if args[:2] != [cur, ei] or len(args) > 3 or (len(args) == 3 and args[2] != ew):
                _unsupported(path, mod, f"reads {args}; a conv must read ({cur}, {ei}"
                             f"{', ' + ew if ew else ''})")
            if len(args) == 3 and _short(mod) != "GCNConv":
                _unsupported(path, mod, f"extra input {args[2]!r} (edge features unsupported)")
            chain.add_conv(conv_layer(mod, path, use_edge_weight=len(args) == 3))
        else:
            if args != [cur]:
                _unsupported(path, mod, f"reads {args}; only a straight chain through {cur!r} is "
                             f"supported (no skip connections / jumping knowledge)")
            chain.add_ops(node_ops(mod, path))
        cur = outs[0]
    return chain


def _single_conv(m, where):
    chain = _Chain()
    chain.add_conv(conv_layer(m, where))
    return chain


# ---------------------------------------------------------------------------------------------
_FUNCTIONS: dict = {}


@functools.lru_cache(maxsize=None)
def _registries() -> bool:
    import torch_geometric.nn as gnn
    import torch_geometric.nn.models.basic_gnn as bg
    from torch_geometric.nn.norm import BatchNorm as PygBatchNorm

    CONV_CONVERTERS.update({gnn.GCNConv: _gcn, gnn.SAGEConv: _sage, gnn.GINConv: _gin,
                            gnn.GATConv: _gat})
    REJECTED.update({
        gnn.GATv2Conv: "GATv2Conv (dynamic attention, 'v2') is not supported; only GATConv (v1)",
        gnn.GINEConv: "GINEConv needs edge features; only GINConv is supported",
    })
    for t in (torch.nn.Linear, gnn.Linear):
        NODE_CONVERTERS[t] = _linear
    NODE_CONVERTERS.update({
        torch.nn.ReLU: _act("relu"),
        torch.nn.LeakyReLU: _act("leaky_relu", negative_slope=lambda m: float(m.negative_slope)),
        torch.nn.ELU: _act("elu", alpha=lambda m: float(m.alpha)),
        torch.nn.GELU: _act("gelu", approximate=lambda m: str(m.approximate)),
        torch.nn.Tanh: _act("tanh"),
        torch.nn.Sigmoid: _act("sigmoid"),
        torch.nn.SiLU: _act("silu"),
        torch.nn.Softplus: _act("softplus", beta=lambda m: float(m.beta),
                                threshold=lambda m: float(m.threshold)),
        torch.nn.LogSoftmax: _softmax_like("log_softmax"),
        torch.nn.Softmax: _softmax_like("softmax"),
        torch.nn.PReLU: _prelu,
        torch.nn.BatchNorm1d: _batchnorm1d,
        PygBatchNorm: _pyg_batchnorm,
        torch.nn.Dropout: _noop,
        torch.nn.Identity: _noop,
        torch.nn.Sequential: _sequential,
        gnn.MLP: _pyg_mlp,
    })
    _FUNCTIONS.update({
        F.relu: ("relu", {}), torch.relu: ("relu", {}), F.elu: ("elu", {}),
        F.gelu: ("gelu", {}), torch.tanh: ("tanh", {}), F.tanh: ("tanh", {}),
        torch.sigmoid: ("sigmoid", {}), F.sigmoid: ("sigmoid", {}), F.silu: ("silu", {}),
        F.leaky_relu: ("leaky_relu", {}),
    })
    MODEL_CONVERTERS.update({
        bg.GCN: _basic_gnn, bg.GraphSAGE: _basic_gnn, bg.GIN: _basic_gnn, bg.GAT: _basic_gnn,
        torch.nn.Sequential: _torch_stack, torch.nn.ModuleList: _torch_stack,
        gnn.Sequential: _pyg_sequential,
    })
    for conv_type in list(CONV_CONVERTERS) + list(REJECTED):
        MODEL_CONVERTERS.setdefault(conv_type, _single_conv)
    return True


def convert(cls, module, output: str = "logits"):
    """PyG module -> cls (Model) with copied float32 weights."""
    from sparkgnn.models.model import OUTPUTS, SPEC_FORMAT, SPEC_VERSION

    _registries()
    if output not in OUTPUTS:
        raise UnsupportedModelError(f"output={output!r} is not supported (one of {OUTPUTS})")
    where = "model"
    fn = MODEL_CONVERTERS.get(type(module))
    if fn is None and _is_message_passing(module):
        fn = _single_conv          # refuses with the conv-specific reason
    if fn is None:
        import torch_geometric.nn.models.basic_gnn as bg

        if isinstance(module, bg.BasicGNN):
            what = (f"BasicGNN model {_name(module)} is not supported (supported: GCN, "
                    f"GraphSAGE, GIN, GAT)")
        else:
            what = (f"{_name(module)} is not a supported model: give a BasicGNN (GCN, GraphSAGE, "
                    f"GIN, GAT), a torch.nn.Sequential / ModuleList / torch_geometric.nn."
                    f"Sequential of GCNConv/SAGEConv/GINConv/GATConv and node-wise modules, or "
                    f"a single conv (a custom forward() cannot be inspected)")
        _unsupported(where, module, what)
    chain = fn(module, where)
    if not chain.convs:
        _unsupported(where, module, "contains no graph convolution")
    in_dim = _infer_in_dim(chain)
    pre = _stack(chain.pre)
    posts = [_stack(p) for p in chain.posts]
    spec = {"format": SPEC_FORMAT, "version": SPEC_VERSION, "source": _name(module),
            "output": output, "in_dim": in_dim, "pre": pre.config(),
            "convs": [c.config() for c in chain.convs], "post": [p.config() for p in posts]}
    try:
        return cls(spec, _modules=(pre, chain.convs, posts))
    except ValueError as e:
        raise UnsupportedModelError(f"{where} ({_short(module)}): inconsistent layer widths: {e}") from e


def _infer_in_dim(chain: _Chain) -> int:
    for op in chain.pre:
        if isinstance(op, LinearOp):
            return op.in_features
        if isinstance(op, BatchNormOp):
            return op.num_features
    return chain.convs[0].in_dim
