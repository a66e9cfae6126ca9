"""Node-wise PyG / torch modules (Linear, activations, BatchNorm, MLP, ...) -> sparkgnn node ops.

NODE_CONVERTERS maps the exact class (by qualified name, see pyg_common) to a converter
`(module, where) -> list[NodeOp]` ([] for modules that are no-ops in eval mode: Dropout, Identity).
ACTIVATION_FUNCTIONS maps plain activation functions (F.relu, torch.tanh, ...) given where a
module is expected (BasicGNN's `act`) to an activation name and its options. Anything else is
refused with UnsupportedModelError naming the module and its path in the model.

torch_geometric is imported lazily (on the first conversion): it is only needed to convert.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.nodeops import ActivationOp, BatchNormOp, LayerNormOp, LinearOp, NodeOp, NodeOpStack, PReLUOp
from sparkgnn.models.pyg_common import class_name, copy_into, is_message_passing, short_name, tensor_of, unsupported
from sparkgnn.registry import Registry

NodeConverter = Callable[[torch.nn.Module, str], "list[NodeOp]"]

NODE_CONVERTERS: Registry[NodeConverter] = Registry("node-wise module", UnsupportedModelError)
# keyed by the function object itself: builtins such as torch.relu have no reliable qualified name
ACTIVATION_FUNCTIONS: dict[Callable, tuple[str, dict]] = {}


def node_ops(module, where: str) -> list[NodeOp]:
    """Node-wise module (or plain activation function) -> list of node ops ([] for no-ops)."""
    ensure_registered()
    if not isinstance(module, torch.nn.Module):
        fn = ACTIVATION_FUNCTIONS.get(module)
        if fn is None:
            raise UnsupportedModelError(
                f"{where}: callable {getattr(module, '__qualname__', module)!r} is not a "
                f"supported activation function; use a torch.nn activation module"
            )
        name, opts = fn
        return [ActivationOp(name, **opts)]
    if is_message_passing(module):  # every supported or rejected conv is one
        unsupported(
            where,
            module,
            "graph convolution nested inside a node-wise block "
            "(e.g. an MLP or nested Sequential); put convs at the top level of the stack",
        )
    convert = NODE_CONVERTERS.get(class_name(module))
    if convert is None:
        unsupported(
            where,
            module,
            f"module {class_name(module)} is not a supported node-wise "
            f"operation (supported: {', '.join(sorted(short_name(n) for n in NODE_CONVERTERS))})",
        )
    return convert(module, where)


def stack(ops) -> NodeOpStack:
    return NodeOpStack(ops=list(ops))


def input_width(ops: list) -> int | None:
    """The row width a node-op stack reads, from its first Linear or BatchNorm; None when neither
    is in the stack (the ops before it, activations or dropout, keep any width)."""
    for op in ops:
        if isinstance(op, LinearOp):
            return op.in_features
        if isinstance(op, BatchNormOp):
            return op.num_features
    return None


def _linear(m, where):
    w = m.weight
    tensor_of(w, where, m)
    op = LinearOp(w.shape[1], w.shape[0], bias=m.bias is not None)
    copy_into(op.weight, w, where, m)
    if op.bias is not None:  # built with a bias exactly when m has one
        copy_into(op.bias, m.bias, where, m)
    return [op]


def _act(name, **fixed):
    """An activation module whose options are read from the module (getter) or fixed."""

    def convert(m, where):
        opts = {k: (getter(m) if callable(getter) else getter) for k, getter in fixed.items()}
        return [ActivationOp(name, **opts)]

    return convert


def _softmax_like(name):
    def convert(m, where):
        if m.dim not in (1, -1):
            unsupported(where, m, f"dim={m.dim}: only the feature axis (dim=1 or -1) is node-wise")
        return [ActivationOp(name)]

    return convert


def _prelu(m, where):
    op = PReLUOp(m.weight.numel())
    copy_into(op.weight, m.weight.view(-1), where, m)
    return [op]


def _batchnorm1d(m, where):
    if not m.track_running_stats or m.running_mean is None or m.running_var is None:
        unsupported(
            where,
            m,
            "track_running_stats=False: in eval mode it normalises with "
            "statistics of the whole batch of nodes, which is not node-wise",
        )
    op = BatchNormOp(m.num_features, eps=m.eps, affine=m.affine)
    copy_into(op.running_mean, m.running_mean, where, m)
    copy_into(op.running_var, m.running_var, where, m)
    if op.weight is not None and op.bias is not None:  # built affine exactly when m is
        copy_into(op.weight, m.weight, where, m)
        copy_into(op.bias, m.bias, where, m)
    return [op]


def _layernorm(m, where):
    shape = tuple(m.normalized_shape)
    if len(shape) != 1:
        unsupported(where, m, f"normalized_shape={shape}: only the feature axis (one dimension) is node-wise")
    affine = bool(m.elementwise_affine)
    op = LayerNormOp(shape[0], eps=m.eps, affine=affine, bias=m.bias is not None)
    if op.weight is not None:  # built affine exactly when m is
        copy_into(op.weight, m.weight, where, m)
    if op.bias is not None:  # built with a bias exactly when m has one
        copy_into(op.bias, m.bias, where, m)
    return [op]


def _pyg_layernorm(m, where):
    if m.mode != "node":
        unsupported(
            where,
            m,
            f"mode={m.mode!r}: it normalises over all the nodes of a graph, which is not node-wise "
            f"(only mode='node', a per-node LayerNorm, is supported)",
        )
    op = LayerNormOp(m.in_channels, eps=m.eps, affine=m.weight is not None, bias=m.bias is not None)
    if op.weight is not None:  # built affine exactly when m is
        copy_into(op.weight, m.weight, where, m)
    if op.bias is not None:
        copy_into(op.bias, m.bias, where, m)
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
        unsupported(where, m, "residual=True")
    act = [] if m.act is None else node_ops(m.act, f"{where}.act")
    ops = []
    for i, (lin, norm) in enumerate(zip(m.lins, m.norms, strict=False)):
        ops += node_ops(lin, f"{where}.lins.{i}")
        if m.act_first:
            ops += act
        ops += node_ops(norm, f"{where}.norms.{i}")
        if not m.act_first:
            ops += act
    if m.plain_last:
        ops += node_ops(m.lins[-1], f"{where}.lins.{len(m.lins) - 1}")
    return ops


@functools.cache
def ensure_registered() -> bool:
    """Fill this module's registries (once; imports torch_geometric)."""
    import torch_geometric.nn as gnn
    from torch_geometric.nn.norm import BatchNorm as PygBatchNorm
    from torch_geometric.nn.norm import LayerNorm as PygLayerNorm

    for t, convert in (
        (torch.nn.Linear, _linear),
        (gnn.Linear, _linear),
        (torch.nn.ReLU, _act("relu")),
        (torch.nn.LeakyReLU, _act("leaky_relu", negative_slope=lambda m: float(m.negative_slope))),
        (torch.nn.ELU, _act("elu", alpha=lambda m: float(m.alpha))),
        (torch.nn.GELU, _act("gelu", approximate=lambda m: str(m.approximate))),
        (torch.nn.Tanh, _act("tanh")),
        (torch.nn.Sigmoid, _act("sigmoid")),
        (torch.nn.SiLU, _act("silu")),
        (torch.nn.Softplus, _act("softplus", beta=lambda m: float(m.beta), threshold=lambda m: float(m.threshold))),
        (torch.nn.LogSoftmax, _softmax_like("log_softmax")),
        (torch.nn.Softmax, _softmax_like("softmax")),
        (torch.nn.PReLU, _prelu),
        (torch.nn.BatchNorm1d, _batchnorm1d),
        (PygBatchNorm, _pyg_batchnorm),
        (torch.nn.LayerNorm, _layernorm),
        (PygLayerNorm, _pyg_layernorm),
        (torch.nn.Dropout, _noop),
        (torch.nn.Identity, _noop),
        (torch.nn.Sequential, _sequential),
        (gnn.MLP, _pyg_mlp),
    ):
        NODE_CONVERTERS.register(class_name(t), convert)
    ACTIVATION_FUNCTIONS.update(
        {
            F.relu: ("relu", {}),
            torch.relu: ("relu", {}),
            F.elu: ("elu", {}),
            F.gelu: ("gelu", {}),
            torch.tanh: ("tanh", {}),
            F.tanh: ("tanh", {}),
            torch.sigmoid: ("sigmoid", {}),
            F.sigmoid: ("sigmoid", {}),
            F.silu: ("silu", {}),
            F.leaky_relu: ("leaky_relu", {}),
        }
    )
    return True
