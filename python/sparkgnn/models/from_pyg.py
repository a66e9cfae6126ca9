"""Conversion of PyTorch Geometric modules into sparkgnn Models: `convert` (Model.from_pyg).

Three registries keyed by the exact PyG / torch class (its qualified name, see pyg_common):
  MODEL_CONVERTERS  whole models (BasicGNN GCN/GraphSAGE/GIN/GAT, Sequential/ModuleList stacks,
                    a single conv), here; any other torch.nn.Module is traced with torch.fx
                    (pyg_fx.py: a forward that chains convs, node-wise modules and functions)
  CONV_CONVERTERS   PyG convs -> MergeableConv with copied weights (pyg_convs.py; the README's
                    coverage table, made by models/coverage.py, lists them)
  NODE_CONVERTERS   node-wise modules (Linear, activations, BatchNorm, MLP, ...) -> node ops
                    (pyg_nodeops.py)
WHY exact classes and explicit refusals: sparkgnn reproduces a layer's forward from its
parameters, so a subclass that overrides forward, an option whose semantics we do not
implement, or a layer whose aggregation cannot be merged would be *silently wrong*. Anything not
registered raises UnsupportedModelError naming the module (its path in the model) and the
option, so users know exactly what to change.

torch_geometric is imported lazily: it is only needed to convert, never to serve.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.dag import CURRENT, CombineOp, SaveOp, is_dag_op, size_combines
from sparkgnn.layers.nodeops import ActivationOp, BatchNormOp, LinearOp, NodeOp
from sparkgnn.models import pyg_convs, pyg_multihop
from sparkgnn.models.pyg_common import class_name, in_width, is_message_passing, short_name, unsupported
from sparkgnn.models.pyg_convs import CONV_CONVERTERS, REJECTED, conv_layer, is_conv
from sparkgnn.models.pyg_nodeops import NODE_CONVERTERS, node_ops, stack
from sparkgnn.registry import Registry

__all__ = [
    "CONV_CONVERTERS",
    "MODEL_CONVERTERS",
    "NODE_CONVERTERS",
    "REJECTED",
    "conv_layer",
    "convert",
    "infer_output",
    "node_ops",
]

MODEL_CONVERTERS: Registry[Callable] = Registry("PyG model", UnsupportedModelError)
log = logging.getLogger(__name__)


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


#: BasicGNN's jk modes: 'last' keeps the last layer's output, 'cat' / 'max' combine every layer's
#: (layers/dag.py CombineOp, as for a hand-written JumpingKnowledge).
_JK_MODES = (None, "last", "cat", "max")


def _basic_gnn(m, where):
    """BasicGNN's forward as a chain: conv, then (except after the last conv when jk is None) act
    and norm in PyG's order; with jk, every layer's output is saved and the last one combines
    them ('cat' / 'max'; 'last' reads only the last), and PyG's Linear `lin` follows."""
    if m.jk_mode not in _JK_MODES:
        unsupported(
            where,
            m,
            f"jk={m.jk_mode!r} weighs the layers with an LSTM and attention, not among sparkgnn's node ops; "
            "jk=None, 'last', 'cat' and 'max' are supported",
        )
    if isinstance(m.in_channels, (tuple, list)):
        in_width(m.in_channels, where, m)
    chain = _Chain()
    act = [] if m.act is None else node_ops(m.act, f"{where}.act")
    n = len(m.convs)
    combine = m.jk_mode in ("cat", "max")
    for i, (conv, norm) in enumerate(zip(m.convs, m.norms, strict=False)):
        chain.add_conv(conv_layer(conv, f"{where}.convs.{i}", use_edge_weight=bool(m.supports_edge_weight)))
        if i < n - 1 or m.jk_mode is not None:
            norm_ops = node_ops(norm, f"{where}.norms.{i}")
            chain.add_ops(act + norm_ops if m.act_first else norm_ops + act)
        if combine and i < n - 1:
            chain.add_ops([SaveOp(f"jk{i}")])
    if combine and n > 1:
        chain.add_ops([CombineOp(m.jk_mode, [f"jk{i}" for i in range(n - 1)] + [CURRENT], None)])
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
        if is_conv(child):
            chain.add_conv(conv_layer(child, path, call_known=False))
        else:
            chain.add_ops(node_ops(child, path))
    return chain


def _pyg_sequential(m, where):
    """Accept only a straight chain: each conv reads (x, edge_index[, edge_weight]) of the
    model's inputs and the current features, each other child reads just the current features,
    and every child writes one value that becomes the current features."""
    params = list(m.signature.param_dict)
    if len(params) < 2:
        unsupported(where, m, f"signature {params}: expected (x, edge_index[, edge_weight])")
    cur, ei = params[0], params[1]
    ew = params[2] if len(params) > 2 else None
    if len(params) > 3:
        unsupported(where, m, f"extra inputs {params[3:]}")
    chain = _Chain()
    for child in m._children:
        mod = getattr(m, child.name)
        path = f"{where}.{child.name}"
        args, outs = list(child.param_names), list(child.return_names)
        if len(outs) != 1:
            unsupported(path, mod, f"returns {outs}; only single-output chains are supported")
        if isinstance(mod, torch.nn.Module) and is_conv(mod):
            if args[:2] != [cur, ei] or len(args) > 3 or (len(args) == 3 and args[2] != ew):
                unsupported(path, mod, f"reads {args}; a conv must read ({cur}, {ei}{', ' + ew if ew else ''})")
            layer = conv_layer(mod, path, use_edge_weight=len(args) == 3)
            if len(args) == 3 and not (layer.uses_edge_weight or layer.edge_attr_dim):
                unsupported(path, mod, f"extra input {args[2]!r} is read neither as edge weights nor as edge features")
            if layer.edge_attr_dim and len(args) != 3:
                need = f"({cur}, {ei}, {ew or 'edge_attr'})"
                unsupported(path, mod, f"reads edge features (edge_attr); it must read {need}")
            chain.add_conv(layer)
        else:
            if args != [cur]:
                unsupported(
                    path,
                    mod,
                    f"reads {args}; only a straight chain through {cur!r} is "
                    f"supported (no skip connections / jumping knowledge)",
                )
            chain.add_ops(node_ops(mod, path))
        cur = outs[0]
    return chain


def _traced(m, where):
    from sparkgnn.models.pyg_fx import trace_chain

    return trace_chain(m, where, _Chain())


def _single_conv(m, where):
    chain = _Chain()
    chain.add_conv(conv_layer(m, where, call_known=False))
    return chain


@functools.cache
def ensure_registered() -> bool:
    """Fill this module's registries (once; imports torch_geometric)."""
    import torch_geometric.nn as gnn
    import torch_geometric.nn.models.basic_gnn as bg

    pyg_convs.ensure_registered()
    for t, convert in (
        (bg.GCN, _basic_gnn),
        (bg.GraphSAGE, _basic_gnn),
        (bg.GIN, _basic_gnn),
        (bg.GAT, _basic_gnn),
        (torch.nn.Sequential, _torch_stack),
        (torch.nn.ModuleList, _torch_stack),
        (gnn.Sequential, _pyg_sequential),
    ):
        MODEL_CONVERTERS.register(class_name(t), convert)
    for name in list(CONV_CONVERTERS) + list(REJECTED):
        if name not in MODEL_CONVERTERS:
            MODEL_CONVERTERS.register(name, _single_conv)
    return True


def convert(cls, module, output: str | None = None):
    """PyG module -> cls (Model) with copied float32 weights. `output` None: chosen by
    `infer_output` (logged at INFO with the reason)."""
    from sparkgnn.models.model import OUTPUTS, SPEC_FORMAT, SPEC_VERSION

    ensure_registered()
    if output is not None and output not in OUTPUTS:
        raise UnsupportedModelError(f"output={output!r} is not supported (one of {OUTPUTS})")
    where = "model"
    fn = MODEL_CONVERTERS.get(class_name(module))
    if fn is None and is_message_passing(module):
        fn = _single_conv  # refuses with the conv-specific reason
    if fn is None:
        import torch_geometric.nn.models.basic_gnn as bg

        if isinstance(module, bg.BasicGNN):
            what = f"BasicGNN model {class_name(module)} is not supported (supported: GCN, GraphSAGE, GIN, GAT)"
            unsupported(where, module, what)
        if not isinstance(module, torch.nn.Module):
            raise UnsupportedModelError(f"{where}: {type(module).__name__} is not a torch.nn.Module")
        fn = _traced  # any other model class: its forward() traced with torch.fx
    chain = fn(module, where)
    dag = any(is_dag_op(op) for op in chain.pre + [op for post in chain.posts for op in post])
    if dag and any(isinstance(c, pyg_multihop.UnsizedConv) for c in chain.convs):
        unsupported(where, module, "a conv without in_channels (LGConv) in a model with skip connections")
    chain.convs = pyg_multihop.size_convs(chain.pre, chain.convs, chain.posts)
    if not chain.convs:
        unsupported(where, module, "contains no graph convolution")
    in_dim = _infer_in_dim(chain)
    if dag:
        try:
            size_combines(in_dim, chain.pre, chain.convs, chain.posts)
        except ValueError as e:
            raise UnsupportedModelError(f"{where} ({short_name(module)}): inconsistent widths: {e}") from e
    if output is None:
        output, why = infer_output(module, chain)
        log.info("sparkgnn: Model.from_pyg(%s): output=%r: %s", short_name(module), output, why)
    pre = stack(chain.pre)
    posts = [stack(p) for p in chain.posts]
    spec = {
        "format": SPEC_FORMAT,
        "version": SPEC_VERSION,
        "source": class_name(module),
        "output": output,
        "in_dim": in_dim,
        "pre": pre.config(),
        "convs": [c.config() for c in chain.convs],
        "post": [p.config() for p in posts],
    }
    try:
        return cls(spec, _modules=(pre, chain.convs, posts))
    except ValueError as e:
        raise UnsupportedModelError(f"{where} ({short_name(module)}): inconsistent layer widths: {e}") from e


def infer_output(module, chain: _Chain) -> tuple[str, str]:
    """(output, why) for a model converted without `output=`: "logits" (the model ends in a
    classifier head, so a prediction column `pred` = argmax is added) or "embedding".

    The rule, in order:
      1. a BasicGNN (GCN, GraphSAGE, GIN, GAT) is "logits" exactly when it was built with
         `out_channels`: PyG then makes its last conv the "final transformation to output size"
         (its `_is_conv_to_out`), and without `out_channels` the model returns its hidden
         representation, i.e. an embedding; with jk, PyG's Linear head `lin` maps to
         out_channels, read as "logits" when it differs from hidden_channels (PyG keeps no record
         of out_channels=None, so an equal width reads as an embedding);
      2. a model whose last op is a (log_)softmax over the features is "logits": it outputs class
         scores (log-probabilities or probabilities), whose argmax is the prediction;
      3. any other model (a Sequential / ModuleList stack, a traced model class or a single conv)
         is "logits" when it ends in a linear map (the last conv, or a Linear after it) with no
         node-wise op after it (no activation or normalization; dropout is a no-op at inference)
         that narrows the width it receives: that is the shape of a classifier head, while a stack ending in an
         activation, a normalization or a map that keeps or widens the width is an embedding.
    Pass `output=` to decide it yourself; it always wins."""
    import torch_geometric.nn.models.basic_gnn as bg

    if isinstance(module, bg.BasicGNN):
        if module.jk_mode is not None and module.out_channels != module.hidden_channels:
            return (
                "logits",
                f"a BasicGNN with jk={module.jk_mode!r} and out_channels={module.out_channels} (PyG's lin head)",
            )
        if getattr(module, "_is_conv_to_out", False):
            return "logits", f"a BasicGNN built with out_channels={module.out_channels} (PyG's output head)"
        return "embedding", "a BasicGNN built without out_channels returns its hidden representation"
    last_op = chain.posts[-1][-1] if chain.posts[-1] else None
    if isinstance(last_op, ActivationOp) and last_op.name in ("log_softmax", "softmax"):
        return "logits", f"the model ends in {last_op.name} over the features (class scores)"
    if last_op is not None and not isinstance(last_op, LinearOp):
        return "embedding", f"the model ends in {type(last_op).__name__}, not in a linear map"
    if isinstance(last_op, LinearOp):
        width_in, width_out, what = last_op.in_features, last_op.out_features, "Linear"
    else:
        conv = chain.convs[-1]
        width_in, width_out, what = int(conv.in_dim), int(conv.out_dim), "conv"
    if width_out < width_in:
        return "logits", f"the model ends in a {what} narrowing {width_in} -> {width_out} (a classifier head)"
    return "embedding", f"the model ends in a {what} that does not narrow ({width_in} -> {width_out})"


def _infer_in_dim(chain: _Chain) -> int:
    for op in chain.pre:
        if isinstance(op, LinearOp):
            return op.in_features
        if isinstance(op, BatchNormOp):
            return op.num_features
    return chain.convs[0].in_dim
