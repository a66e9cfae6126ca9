"""Hand-written model classes -> the chain normal form, by tracing forward() with torch.fx.

The model PyG's tutorials write is a `torch.nn.Module` subclass whose forward calls its convs and
node-wise modules and a few tensor functions:

    x = self.conv1(x, edge_index).relu()
    x = F.dropout(x, p=0.5, training=self.training)
    x = self.conv2(x, edge_index)
    return F.log_softmax(x, dim=1)

`trace_chain` traces forward symbolically (torch.fx, as PyG's own `to_hetero` does) with every
MessagePassing conv, every registered node-wise module (pyg_nodeops.NODE_CONVERTERS) and the
graph-level modules kept as leaves, then walks the traced graph in order: a conv becomes a layer
(pyg_convs.conv_layer, fed the forward's edge_index and, for GCN, its edge weights), a node-wise
module or a known function/method (FUNCTIONS, METHODS: activations, (log_)softmax and
F.normalize over the feature axis, dropout, a no-op at inference) becomes node ops.

WHY a chain walk with refusals: sparkgnn's model is a chain (pre ops, then per conv a conv and
its post ops) with skip connections (layers/dag.py), so each op must read the value the previous
op wrote; a value that a later op reads again is saved (`save`), and only a residual add (a + b),
torch.cat over the features and JumpingKnowledge 'cat' / 'max' may read saved values (`combine`).
Anything else is refused with UnsupportedModelError naming the source line and why, never
approximated: an op that branches off the chain (reads an earlier value but not the previous
op's), data-dependent control flow (fx cannot trace it), graph-level ops (a `batch` argument,
global pooling, aggregation modules), and any op not in the tables (named).

torch_geometric is imported lazily, as in the other converters.
"""

from __future__ import annotations

import functools
import inspect
import operator
import os
import re
from collections.abc import Callable
from typing import NoReturn

import torch
import torch.fx
import torch.nn.functional as F

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.dag import CURRENT, CombineOp, SaveOp
from sparkgnn.layers.nodeops import ActivationOp, NodeOp, NormalizeOp
from sparkgnn.models.pyg_common import class_name, is_message_passing, short_name
from sparkgnn.models.pyg_convs import conv_layer
from sparkgnn.models.pyg_nodeops import NODE_CONVERTERS, node_ops

__all__ = ["FUNCTIONS", "METHODS", "trace_chain"]

# A converter gets the call's arguments by name (the value the op reads is not among them) and
# returns the node ops, or a string: the reason the call is refused.
OpConverter = Callable[[dict], "list[NodeOp] | str"]
# function object -> (its parameter names after the input, converter)
FUNCTIONS: dict[Callable, tuple[tuple[str, ...], OpConverter]] = {}
# Tensor method name -> (its parameter names after self, converter)
METHODS: dict[str, tuple[tuple[str, ...], OpConverter]] = {}
GRAPH_LEVEL_ARGUMENTS = ("batch", "ptr", "batch_size")
JUMPING_KNOWLEDGE = "torch_geometric.nn.models.jumping_knowledge.JumpingKnowledge"
CHAIN_ONLY = (
    "only a residual add (a + b), torch.cat(..., dim=-1) and JumpingKnowledge('cat' / 'max') may read "
    "an earlier op's result; every other op reads the previous op's result"
)
# a + b of two computed values: a residual add (layers/dag.py CombineOp mode "add")
ADD_FUNCTIONS = (operator.add, operator.iadd, torch.add)


def _activation(name: str, **options: str) -> OpConverter:
    """An activation whose options are read from the call's arguments (options maps the op's
    option to the argument's name)."""

    def convert(args: dict) -> list[NodeOp]:
        return [ActivationOp(name, **{opt: args[arg] for opt, arg in options.items() if arg in args})]

    return convert


def _feature_axis(name: str) -> OpConverter:
    def convert(args: dict) -> list[NodeOp] | str:
        dim = args.get("dim")
        if dim not in (1, -1):
            return f"{name} over dim={dim}: only the feature axis (dim=1 or -1) is node-wise"
        if args.get("dtype") is not None:
            return f"{name} with dtype={args['dtype']}: sparkgnn computes in float32"
        return [ActivationOp(name)]

    return convert


def _normalize(args: dict) -> list[NodeOp] | str:
    dim = args.get("dim", 1)
    if dim not in (1, -1):
        return f"F.normalize over dim={dim}: only the feature axis (dim=1 or -1) is node-wise"
    if args.get("out") is not None:
        return "F.normalize with out=: not supported"
    return [NormalizeOp(p=float(args.get("p", 2.0)), eps=float(args.get("eps", 1e-12)))]


def _noop(args: dict) -> list[NodeOp]:
    return []


@functools.cache
def _ensure_tables() -> bool:
    relu, elu = _activation("relu"), _activation("elu", alpha="alpha")
    leaky = _activation("leaky_relu", negative_slope="negative_slope")
    for fns, params, convert in (
        ((F.relu, torch.relu, F.relu_, torch.relu_), ("inplace",), relu),
        ((F.elu, F.elu_), ("alpha", "inplace"), elu),
        ((F.leaky_relu, F.leaky_relu_), ("negative_slope", "inplace"), leaky),
        ((F.gelu,), ("approximate",), _activation("gelu", approximate="approximate")),
        ((torch.sigmoid, F.sigmoid), (), _activation("sigmoid")),
        ((torch.tanh, F.tanh), (), _activation("tanh")),
        ((F.silu,), ("inplace",), _activation("silu")),
        ((F.softmax, torch.softmax), ("dim", "_stacklevel", "dtype"), _feature_axis("softmax")),
        ((F.log_softmax, torch.log_softmax), ("dim", "_stacklevel", "dtype"), _feature_axis("log_softmax")),
        ((F.normalize,), ("p", "dim", "eps", "out"), _normalize),
        ((F.dropout, F.alpha_dropout, F.feature_alpha_dropout), ("p", "training", "inplace"), _noop),
        ((torch.dropout,), ("p", "train"), _noop),
    ):
        for fn in fns:
            FUNCTIONS[fn] = (params, convert)
    for names, params, convert in (
        (("relu", "relu_"), (), relu),
        (("sigmoid", "sigmoid_"), (), _activation("sigmoid")),
        (("tanh", "tanh_"), (), _activation("tanh")),
        (("softmax",), ("dim", "dtype"), _feature_axis("softmax")),
        (("log_softmax",), ("dim", "dtype"), _feature_axis("log_softmax")),
    ):
        for name in names:
            METHODS[name] = (params, convert)
    return True


def _graph_level_module(module: torch.nn.Module) -> str | None:
    """Why a module works over whole graphs (not node-wise), or None."""
    from torch_geometric.nn.aggr import Aggregation

    if isinstance(module, Aggregation):
        return "an aggregation module pools rows into one per graph (graph-level)"
    mod = type(module).__module__
    if mod.startswith("torch_geometric.nn.pool"):
        return "pooling is graph-level"
    if mod.startswith("torch_geometric.nn.norm") and class_name(module) not in NODE_CONVERTERS:
        return "this normalization uses statistics over a graph's nodes (graph-level), not one node's row"
    return None


def _graph_level_function(fn) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    return mod.startswith("torch_geometric.nn.pool") or getattr(fn, "__name__", "").startswith("global_")


class _Tracer(torch.fx.Tracer):
    """Keeps convs, registered node-wise modules and graph-level modules whole (fx leaves), so the
    walk sees them as one call each; other submodules are traced through."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if is_message_passing(m) or class_name(m) in NODE_CONVERTERS or _graph_level_module(m):
            return True
        if class_name(m) == JUMPING_KNOWLEDGE:
            return True
        return super().is_leaf_module(m, module_qualified_name)


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n\s*(?P<code>[^\n]*)')


def _library_file(path: str) -> bool:
    import torch_geometric

    roots = [os.path.dirname(torch.__file__), os.path.dirname(torch_geometric.__file__)]
    return any(os.path.abspath(path).startswith(root + os.sep) for root in roots)


def _format_frame(path: str, line: int | str, code: str) -> str:
    return f"{os.path.basename(path)}:{line} `{code.strip()}`"


def _source(node: torch.fx.Node) -> str:
    """The user's source line that made the node (`file:line `code``), else the node's name."""
    frames = [m for m in _FRAME.finditer(node.stack_trace or "") if not _library_file(m["file"])]
    if frames:
        last = frames[-1]
        return _format_frame(last["file"], last["line"], last["code"])
    return f"fx node {node.name!r}"


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return str(node.target)
    if node.op == "get_attr":
        return f"attribute self.{node.target}"
    target = node.target
    mod = getattr(target, "__module__", None)
    name = getattr(target, "__name__", str(target))
    if target in vars(operator).values() or mod == "_operator":
        return f"operator {name!r}"
    return f"{mod}.{name}" if mod else name


def _nodes_in(value) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []

    def collect(n: torch.fx.Node) -> torch.fx.Node:
        found.append(n)
        return n

    torch.fx.node.map_arg(value, collect)
    return found


def _bind(node: torch.fx.Node, params: tuple[str, ...], refuse) -> dict:
    """The call's arguments after the input, by name; refuses an unknown keyword or too many."""
    rest = node.args[1:]
    if len(rest) > len(params):
        refuse(f"{_op_name(node)} with {len(node.args)} positional arguments is not supported")
    bound = dict(zip(params, rest, strict=False))
    for key, value in node.kwargs.items():
        if key not in params:
            refuse(f"{_op_name(node)} with argument {key}= is not supported")
        bound[key] = value
    for key, value in bound.items():
        if _nodes_in(value):
            refuse(f"{_op_name(node)}'s argument {key} is computed in forward(), not a constant")
    return bound


class _Walk:
    """One pass over the traced graph, filling `chain`."""

    def __init__(self, root: torch.nn.Module, graph: torch.fx.Graph, where: str, chain):
        self.root, self.graph, self.where, self.chain = root, graph, where, chain
        self.x: torch.fx.Node | None = None
        self.edge_index: torch.fx.Node | None = None
        self.extra: list[torch.fx.Node] = []
        self.cur: torch.fx.Node | None = None
        self.node: torch.fx.Node | None = None
        # values read again after the op that follows them (skip connections): node -> slot name
        self.slots: dict[torch.fx.Node, str] = {}

    def refuse(self, why: str, node: torch.fx.Node | None = None) -> NoReturn:
        node = node if node is not None else self.node
        at = f", {_source(node)}" if node is not None else ""
        raise UnsupportedModelError(f"{self.where} ({short_name(self.root)}): forward(){at}: {why}")

    def run(self):
        for node in self.graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "output":
                self._output(node)
            elif node.op == "get_attr":
                self.refuse(f"reads {_op_name(node)} directly; only submodules (convs, node-wise modules) are")
            elif node.op == "call_module":
                self._module(node)
            else:
                self._function(node)
        return self.chain

    # -- inputs and output ----------------------------------------------------------------------
    def _placeholder(self, node):
        if self.x is None:
            self.x = node
            self._advance(node)
        elif self.edge_index is None:
            self.edge_index = node
        elif node.users:
            self.extra.append(node)

    def _output(self, node):
        (value,) = node.args
        if value is not self.cur:
            if isinstance(value, (tuple, list, dict)):
                self.refuse("returns several values; only one node-level tensor is supported")
            self.refuse("returns a value other than the last op's result")

    # -- ops ------------------------------------------------------------------------------------
    def _advance(self, node):
        """`node` becomes the current value. A value read by more than one later op is saved
        (layers/dag.py SaveOp): the next op reads it as the current value, the others are
        combine ops that read the saved slot (checked there)."""
        if len(node.users) > 1:
            self.slots[node] = f"s{len(self.slots)}"
            self.chain.add_ops([SaveOp(self.slots[node])])
        self.cur = node

    def _combine(self, node, mode: str, values, what: str):
        """A node-wise op over the current value and saved earlier values (module doc)."""
        values = list(values)
        if not all(isinstance(v, torch.fx.Node) for v in values):
            self.refuse(f"{what} of a constant is not supported; only of computed node features")
        if values.count(self.cur) != 1:
            self.refuse(f"{what} must read the previous op's result exactly once: {CHAIN_ONLY}")
        others = [v for v in values if v is not self.cur and v not in self.slots]
        if others:
            self.refuse(f"{what} reads {others[0].name!r}, which is not a value of the model's chain of ops")
        if len(values) == 1:  # a one-element concatenation or JumpingKnowledge is its input
            self.cur = node
            return
        inputs = [CURRENT if v is self.cur else self.slots[v] for v in values]
        self.chain.add_ops([CombineOp(mode, inputs, None)])
        self._advance(node)

    def _add(self, node):
        if len(node.args) != 2 or node.kwargs:
            self.refuse(f"{_op_name(node)} with arguments other than two tensors (alpha=, out=) is not supported")
        self._combine(node, "add", node.args, "a residual add")

    def _cat(self, node):
        bound = dict(zip(("tensors", "dim"), node.args, strict=False)) | dict(node.kwargs)
        if set(bound) - {"tensors", "dim"} or bound.get("dim", 0) not in (1, -1):
            self.refuse("torch.cat is supported over the feature axis only (dim=1 or -1)")
        tensors = bound.get("tensors")
        if not isinstance(tensors, (list, tuple)):
            self.refuse("torch.cat of a computed sequence is not supported; give a list of tensors")
        self._combine(node, "cat", tensors, "torch.cat")

    def _jumping_knowledge(self, node, module, path):
        name = f"{path} ({short_name(module)})"
        if module.mode not in ("cat", "max"):
            self.refuse(
                f"{name}: mode={module.mode!r} weighs the layers with an LSTM and attention, not among "
                "sparkgnn's node ops; mode='cat' and 'max' are supported"
            )
        if len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], (list, tuple)):
            self.refuse(f"{name} must be called with one list of layer outputs")
        self._combine(node, module.mode, node.args[0], name)

    def _reads_current(self, node, tensor_args):
        """Refuse unless the op reads the current value (and no other computed value) as its input."""
        if not tensor_args or tensor_args[0] is not self.cur:
            self.refuse(f"{_op_name(node)} does not read the previous op's result: {CHAIN_ONLY}")

    def _module(self, node):
        module = self.root.get_submodule(str(node.target))
        path = f"{self.where}.{node.target}"
        why = _graph_level_module(module)
        if why:
            self.refuse(f"{path} ({short_name(module)}): {why}; sparkgnn computes one row per node")
        if is_message_passing(module):
            self._conv(node, module, path)
            return
        if class_name(module) == JUMPING_KNOWLEDGE:
            self._jumping_knowledge(node, module, path)
            return
        self._reads_current(node, list(node.args))
        if len(node.args) != 1 or node.kwargs:
            self.refuse(f"{path} ({short_name(module)}) is called with more than the features")
        self.chain.add_ops(node_ops(module, path))
        self._advance(node)

    def _conv(self, node, conv, path):
        args = list(node.args)
        kwargs = dict(node.kwargs)
        name = f"{path} ({short_name(conv)})"
        self._reads_current(node, args)
        if len(args) < 2 or args[1] is not self.edge_index:
            self.refuse(f"{name} must be called as conv(x, edge_index[, edge_weight]) with forward's edge_index")
        weight = args[2] if len(args) > 2 else kwargs.pop("edge_weight", None)
        if weight is None:
            weight = kwargs.pop("edge_attr", None)
        if len(args) > 3 or kwargs:
            extra = [f"argument {i}" for i in range(3, len(args))] + [f"{k}=" for k in kwargs]
            self.refuse(f"{name} is called with {', '.join(extra)}; only (x, edge_index[, edge_weight or edge_attr])")
        if weight is not None and (not isinstance(weight, torch.fx.Node) or weight not in self.extra):
            self.refuse(f"{name}'s edge weights / edge features must be an argument of forward()")
        layer = conv_layer(conv, path, use_edge_weight=weight is not None)
        if layer.edge_attr_dim and weight is None:
            self.refuse(f"{name} reads edge features (edge_attr); call it as conv(x, edge_index, edge_attr)")
        if weight is not None and not (layer.uses_edge_weight or layer.edge_attr_dim):
            self.refuse(f"{name} is given a third input it reads neither as edge weights nor as edge features")
        self.chain.add_conv(layer)
        self._advance(node)

    def _function(self, node):
        _ensure_tables()
        if node.target in ADD_FUNCTIONS or (node.op == "call_method" and node.target == "add"):
            self._add(node)
            return
        if node.target is torch.cat:
            self._cat(node)
            return
        if node.op == "call_method":
            entry = METHODS.get(str(node.target))
        else:
            entry = FUNCTIONS.get(node.target)
            if entry is None and _graph_level_function(node.target):
                self.refuse(f"{_op_name(node)} is graph-level (pooling); sparkgnn computes one row per node")
        if entry is None:
            self.refuse(f"{_op_name(node)} is not a supported operation (supported: {_supported()})")
        params, convert = entry
        self._reads_current(node, list(node.args))
        ops = convert(_bind(node, params, self.refuse))
        if isinstance(ops, str):
            self.refuse(ops)
        self.chain.add_ops(ops)
        self._advance(node)


def _supported() -> str:
    names = sorted({getattr(f, "__name__", str(f)) for f in FUNCTIONS} | {f"Tensor.{m}" for m in METHODS})
    return ", ".join(names) + ", convs and node-wise modules"


def _trace_error_line(module: torch.nn.Module, error: BaseException) -> str:
    """The user's source line where tracing failed (the deepest frame outside torch and PyG)."""
    tb = error.__traceback__
    frames = [f for f in inspect.getinnerframes(tb, context=1) if not _library_file(f.filename)] if tb else []
    if not frames:
        return f"{short_name(module)}.forward"
    last = frames[-1]
    return _format_frame(last.filename, last.lineno, (last.code_context or [""])[0])


def trace_chain(module: torch.nn.Module, where: str, chain):
    """Trace `module.forward` and fill `chain` (from_pyg's _Chain) with its convs and node ops
    (save / combine ops for skip connections, their widths left for from_pyg to fill in);
    UnsupportedModelError naming the source line for anything that is not a chain of them."""
    head = f"{where} ({short_name(module)}): forward()"
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError) as e:
        raise UnsupportedModelError(f"{head} has no inspectable signature: {e}") from e
    graph_args = [p for p in params if p in GRAPH_LEVEL_ARGUMENTS]
    if graph_args:
        raise UnsupportedModelError(
            f"{head} takes {graph_args[0]!r}: a graph-level model (one output per graph, e.g. global "
            f"pooling over a batch vector) is not supported; sparkgnn computes one row per node"
        )
    if len(params) < 2:
        raise UnsupportedModelError(f"{head} takes {params}: expected forward(x, edge_index[, edge_weight])")
    import torch_geometric.nn.pool as pool

    # pooling functions named in forward's module stay whole calls (refused by name), not traced into
    tracer = _Tracer(autowrap_functions=(pool.global_add_pool, pool.global_mean_pool, pool.global_max_pool))
    tracer.record_stack_traces = True
    try:
        graph = tracer.trace(module)
    except torch.fx.proxy.TraceError as e:
        raise UnsupportedModelError(
            f"{head}, {_trace_error_line(module, e)}: cannot be traced ({e}); data-dependent "
            f"control flow (an `if`/loop on tensor values) is not supported"
        ) from e
    except Exception as e:  # noqa: BLE001 - any failure of symbolic execution is reported, named
        raise UnsupportedModelError(
            f"{head}, {_trace_error_line(module, e)}: cannot be traced symbolically ({type(e).__name__}: {e})"
        ) from e
    return _Walk(module, graph, where, chain).run()
