"""Typed PyG models -> HeteroModel (models/hetero.py) with copied weights.

Three forms are converted:

* `to_hetero(model, metadata, aggr=...)`'s output, a torch.fx GraphModule holding per relation a
  copy of each conv (`conv1.author__writes__paper`), per node type a copy of each node-wise
  module (`lin.paper`), per-type calls of the functions, and the cross-relation aggregation as
  pairwise torch.add (sum; mean then divides by the number of relations) or torch.max / min.
* a model class whose forward(x_dict, edge_index_dict) stacks `HeteroConv({edge type: conv},
  aggr=...)` with per-type node-wise code between them (`{k: v.relu() for k, v in x.items()}`,
  `self.lin(x_dict['paper'])`); HeteroConv groups its relations by torch.stack and
  torch.sum / mean / max / min over dim 0.
* a model of RGCNConv / FastRGCNConv layers run on the typed graph's homogeneous form
  (`HeteroData.to_homogeneous()`: relation id k is metadata edge type k): per relation a mean
  (or sum) of the neighbours times that relation's weight (bases and blocks multiplied out into
  one matrix per relation), summed over relations, plus the root weight and bias once per node
  (`rgcn_round`). This is RGCNConv's per-relation loop, which PyG runs unless pyg_lib's
  segment_matmul is installed and picked (its `aggr='mean'` then averages over all of a node's
  in-edges, not per relation: a TODO in PyG's RGCNConv.message).

WHY one walk over a traced graph for the first two: both are traced here with torch.fx the same
way (forward called with per-type placeholders in concrete dicts, so dict code runs as Python and
only tensor ops are recorded), which leaves the same flat graph: per-relation conv calls,
cross-relation combinations, per-type node ops. The walk identifies each conv's relation by the
edge_index placeholder it reads (not by module names), converts it with the homogeneous
converters (pyg_convs.conv_layer), and refuses, naming the source line, what is not a per-type
chain of rounds: an op reading a type's earlier value, a type read after a round that gave it no
value, relations merged by anything but one sum / mean / max / min per round, concatenation across
relations.

HGTConv (a leaf of the trace, called as conv(x_dict, edge_index_dict)) becomes one round of its
own (`_hgt`): per relation an HGTRelationLayer with that relation's slices of HGT's weights, merged
by the `softmax` aggregation, and per destination type an HGTOutputOp as the first post op
(layers/hgt.py). The tracer gives its result as a concrete dict of per-type values (the types PyG's
HGTConv returns: those of x_dict that a relation of its metadata points into), so code reading it
like any x_dict (`.items()`, `out['paper']`, passing it whole) traces as Python.
"""

from __future__ import annotations

import copy
import inspect
import operator
from dataclasses import dataclass, field
from typing import NoReturn, cast

import torch
import torch.fx

from sparkgnn.errors import UnsupportedModelError
from sparkgnn.layers.base import MergeableConv
from sparkgnn.layers.hetero import EdgeType, HeteroRound
from sparkgnn.layers.nodeops import LinearOp, NodeOp, NodeOpStack
from sparkgnn.layers.sage import SAGELayer
from sparkgnn.models.pyg_common import class_name, is_message_passing, short_name, tensor_of, unsupported
from sparkgnn.models.pyg_convs import conv_layer
from sparkgnn.models.pyg_convs import ensure_registered as ensure_convs
from sparkgnn.models.pyg_fx import FUNCTIONS, METHODS, _bind, _ensure_tables, _graph_level_module, _source, _Tracer
from sparkgnn.models.pyg_nodeops import ensure_registered as ensure_node_ops
from sparkgnn.models.pyg_nodeops import node_ops

HETERO_DICT_LINEAR = "torch_geometric.nn.dense.linear.HeteroDictLinear"
RGCN_CLASSES = ("torch_geometric.nn.conv.rgcn_conv.RGCNConv", "torch_geometric.nn.conv.rgcn_conv.FastRGCNConv")
HGT_CLASS = "torch_geometric.nn.conv.hgt_conv.HGTConv"
RELATION_FUNCTIONS = {torch.add: "sum", operator.add: "sum", torch.max: "max", torch.maximum: "max"}
RELATION_FUNCTIONS.update({torch.min: "min", torch.minimum: "min"})
REDUCTIONS = {torch.sum: "sum", torch.mean: "mean", torch.max: "max", torch.min: "min"}


def convert_hetero(cls, module: torch.nn.Module, metadata, output: str | None = None, in_dims=None):
    """`cls` (HeteroModel) with the weights of a typed PyG model for `metadata` (module doc).
    `in_dims` (node type -> feature width) is needed only when a type's input width cannot be read
    from the model (its first reader is a conv with lazy in_channels)."""
    from sparkgnn.models.hetero import SPEC_FORMAT, SPEC_VERSION, normalize_metadata

    if not isinstance(module, torch.nn.Module):
        raise UnsupportedModelError(f"cannot convert {type(module).__name__}: expected a torch.nn.Module")
    meta = normalize_metadata(metadata)
    ensure_convs(), ensure_node_ops(), _ensure_tables()
    if any(class_name(m) in RGCN_CLASSES for m in module.modules()):
        walk: _Walk = _RGCNWalk(module, meta, in_dims)
    else:
        walk = _Walk(module, meta, in_dims)
    pre, rounds, outputs, in_dims, last = walk.run()
    if output is None:
        output = infer_output(last)
    spec = {
        "format": SPEC_FORMAT,
        "version": SPEC_VERSION,
        "source": class_name(module),
        "output": output,
        "metadata": {"node_types": meta[0], "edge_types": [list(e) for e in meta[1]]},
        "in_dims": in_dims,
        "outputs": outputs,
    }
    try:
        return cls(spec, _modules=(pre, rounds))
    except ValueError as e:
        if isinstance(e, UnsupportedModelError):
            raise
        raise UnsupportedModelError(f"{short_name(module)}: {e}") from e


def infer_output(last) -> str:
    """ "logits" when the model ends in a (log_)softmax, or in a Linear or conv that narrows the
    width it reads (a classifier head), else "embedding" (from_pyg.infer_output's rule 2 and 3;
    pass `output=` to decide)."""
    from sparkgnn.layers.nodeops import ActivationOp

    if isinstance(last, ActivationOp):
        return "logits" if last.config().get("name") in ("softmax", "log_softmax") else "embedding"
    if isinstance(last, LinearOp):
        return "logits" if last.out_features < last.in_features else "embedding"
    if isinstance(last, MergeableConv):
        return "logits" if last.out_dim < last.in_dim else "embedding"
    return "embedding"


@dataclass
class _Rel:
    """One round's relation outputs into `dst` merged so far (by `aggr`, None while one)."""

    round: int
    dst: str
    count: int
    aggr: str | None = None
    stacked: bool = False  # a torch.stack of relation outputs, waiting for its reduction


@dataclass
class _Round:
    convs: dict = field(default_factory=dict)  # edge type -> MergeableConv
    inputs: dict = field(default_factory=dict)  # type -> fx node the convs read
    aggr: str | None = None
    closed: bool = False  # a non-conv op ran: the next conv starts a new round
    post: dict = field(default_factory=dict)  # type -> [NodeOp]
    keep: dict = field(default_factory=dict)  # type -> [NodeOp]

    def into(self, t: str) -> int:
        return sum(1 for e in self.convs if e[2] == t)


class _Flat(torch.nn.Module):
    """Calls the model with per-type placeholders in concrete dicts (module doc)."""

    def __init__(self, model: torch.nn.Module, metadata):
        super().__init__()
        self.model, self.metadata = model, metadata

    def forward(self, xs, eis):
        x_dict = {t: xs[i] for i, t in enumerate(self.metadata[0])}
        ei_dict = {e: eis[i] for i, e in enumerate(self.metadata[1])}
        return self.model(x_dict, ei_dict)


class _HeteroTracer(_Tracer):
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name == "model":  # the converted model itself (_Flat) is always traced through
            return False
        return class_name(m) == HETERO_DICT_LINEAR or super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m, forward, args, kwargs):
        """An HGTConv's result as {type: value} (module doc), in PyG's order."""
        out = super().call_module(m, forward, args, kwargs)
        if class_name(m) == HGT_CLASS and args and isinstance(args[0], dict):
            targets = {e[2] for e in m.edge_types}
            return {t: out[t] for t in args[0] if t in targets}
        return out


class _Walk:
    """One pass over the traced graph of a to_hetero / HeteroConv model (module doc)."""

    def __init__(self, module: torch.nn.Module, metadata, in_dims=None):
        self.module, self.metadata = module, metadata
        self.given_dims = {str(t): int(w) for t, w in (in_dims or {}).items()}
        self.where = short_name(module)
        self.node: torch.fx.Node | None = None
        self.values: dict[torch.fx.Node, object] = {}
        self.current: dict[str, torch.fx.Node] = {}  # type -> its value now
        self.stage: dict[str, int] = {}  # type -> -1 (input ops) or the round that gave its value
        self.width: dict[str, int] = {}
        self.in_dims: dict[str, int] = {}
        self.pre: dict[str, list[NodeOp]] = {}
        self.rounds: list[_Round] = []
        self.last: torch.nn.Module | None = None  # the last op or conv (infer_output)

    def refuse(self, why: str) -> NoReturn:
        at = f", {_source(self.node)}" if self.node is not None else ""
        raise UnsupportedModelError(f"{self.where}: forward(){at}: {why}")

    # -- driving ---------------------------------------------------------------------------------
    def trace(self) -> torch.fx.Graph:
        try:
            params = list(inspect.signature(self.module.forward).parameters)
        except (TypeError, ValueError) as e:
            raise UnsupportedModelError(f"{self.where}: forward() has no inspectable signature: {e}") from e
        if len(params) < 2:
            raise UnsupportedModelError(
                f"{self.where}: forward{tuple(params)}: expected forward(x_dict, edge_index_dict)"
            )
        tracer = _HeteroTracer()
        tracer.record_stack_traces = True
        try:
            return tracer.trace(_Flat(self.module, self.metadata))
        except Exception as e:  # noqa: BLE001 - any failure of symbolic execution is reported, named
            raise UnsupportedModelError(
                f"{self.where}: forward(x_dict, edge_index_dict) cannot be traced symbolically "
                f"({type(e).__name__}: {e}); data-dependent control flow is not supported"
            ) from e

    def run(self):
        graph = self.trace()
        outputs: list[str] = []
        for node in graph.nodes:
            self.node = node
            if node.op == "placeholder":
                self.values[node] = node.target  # "xs" / "eis"
            elif node.op == "output":
                outputs = self._output(node)
            elif node.op == "get_attr":
                self.refuse(f"reads attribute self.{node.target} directly; only submodules are supported")
            elif node.op == "call_module":
                self._module(node)
            else:
                self._function(node)
        self.node = None
        return self._result(outputs)

    def _result(self, outputs: list[str]):
        pre = {t: NodeOpStack(ops=ops) for t, ops in self.pre.items() if ops}
        rounds = []
        for index, rnd in enumerate(self.rounds):
            if not rnd.convs:
                raise UnsupportedModelError(f"{self.where}: round {index} has no relation")
            post = {t: NodeOpStack(ops=ops) for t, ops in rnd.post.items() if ops}
            keep = {t: NodeOpStack(ops=ops) for t, ops in rnd.keep.items()}
            rounds.append(HeteroRound(convs=rnd.convs, aggr=rnd.aggr or "sum", keep=keep, post=post))
        if not rounds:
            raise UnsupportedModelError(f"{self.where}: forward() calls no graph convolution")
        in_dims = {t: w for t, w in self.in_dims.items() if w >= 0}
        return pre, rounds, outputs, in_dims, self.last

    # -- values ----------------------------------------------------------------------------------
    def _type_of(self, value, what: str) -> str:
        """The type whose CURRENT value `value` is (refusing anything else)."""
        if isinstance(value, torch.fx.Node):
            v = self.values.get(value)
            if isinstance(v, _Rel):
                return self._settle(value, v)
            if isinstance(v, tuple) and v[0] == "node":
                t = v[1]
                if self.current.get(t) is not value:
                    self.refuse(f"{what} reads an earlier value of type {t!r}; a typed model is a chain per type")
                return t
        self.refuse(f"{what} reads {getattr(value, 'name', value)!r}, which is not a node type's features")

    def _settle(self, node: torch.fx.Node, rel: _Rel) -> str:
        """A round's merged relation outputs become the type's value: all of the round's
        relations into the type must be in it, merged by the round's one aggregation."""
        self._close_round()
        rnd = self.rounds[rel.round]
        if rel.stacked:
            self.refuse("a torch.stack of relation outputs is read without a sum / mean / max / min over dim 0")
        if rel.count != rnd.into(rel.dst):
            self.refuse(
                f"merges {rel.count} of the {rnd.into(rel.dst)} relations into {rel.dst!r}; "
                "every relation of a round must be merged"
            )
        if rel.aggr is not None:
            if rnd.aggr not in (None, rel.aggr):
                self.refuse(
                    f"relations are merged by {rnd.aggr} and {rel.aggr} in one round; one aggregation per round"
                )
            rnd.aggr = rel.aggr
        self.values[node] = ("node", rel.dst)
        self.current[rel.dst] = node
        self.stage[rel.dst] = rel.round
        self.width[rel.dst] = next(c.out_dim for e, c in rnd.convs.items() if e[2] == rel.dst)
        return rel.dst

    def _close_round(self) -> None:
        """The first op reading a round's result or not a conv: every type's value before the
        round is gone (a relation destination gets the round's result when it is read, a type no
        relation points into has no value any more)."""
        if self.rounds and not self.rounds[-1].closed:
            self.rounds[-1].closed = True
            self.current.clear()

    def _add_ops(self, t: str, ops: list[NodeOp], node: torch.fx.Node) -> None:
        stage = self.stage[t]
        target = self.pre if stage < 0 else self.rounds[stage].post
        width = self.width[t]
        for op in ops:
            try:
                width = op.out_dim(width)
            except ValueError as e:
                self.refuse(f"type {t!r}: {e}")
        target.setdefault(t, []).extend(ops)
        if ops:
            self.last = ops[-1]
        self.width[t] = width
        self.values[node] = ("node", t)
        self.current[t] = node

    # -- node kinds ------------------------------------------------------------------------------
    def _output(self, node) -> list[str]:
        (value,) = node.args
        self._close_round()
        items = value.items() if isinstance(value, dict) else [(None, value)]
        outputs = []
        for key, v in items:
            t = self._type_of(v, "the returned value")
            if key is not None and key != t:
                self.refuse(f"returns type {t!r}'s rows under key {key!r}")
            outputs.append(t)
        return outputs

    def _getitem_input(self, node) -> bool:
        source, index = node.args
        kind = self.values.get(source) if isinstance(source, torch.fx.Node) else None
        if kind == "xs":
            t = self.metadata[0][index]
            self.values[node] = ("node", t)
            self.current[t], self.stage[t] = node, -1
            width = self._input_width(node, t)
            self.width[t] = self.in_dims[t] = width
            return True
        if kind == "eis":
            self.values[node] = ("edges", self.metadata[1][index])
            return True
        if isinstance(kind, tuple) and kind[0] == "dict_ops":
            ops = kind[1].get(index)
            if ops is None:
                self.refuse(f"reads type {index!r} from a per-type module that was not given it")
            self._add_ops(index, ops, node)
            return True
        if isinstance(kind, tuple) and kind[0] == "hgt":  # the tracer's per-type values (module doc)
            if index not in kind[2] or kind[1] != len(self.rounds) - 1:
                self.refuse(f"reads type {index!r} of an HGTConv's result, which holds {list(kind[2])}")
            self.values[node] = ("node", index)
            self.current[index] = node
            return True
        rel = kind if isinstance(kind, _Rel) else None
        if rel is not None and index == 0 and rel.aggr in ("max", "min"):  # (values, indices)[0]
            self.values[node] = rel
            return True
        return False

    def _input_width(self, node, t: str) -> int:
        """The width of type t's input rows when `in_dims` gives it, else -1: then the first
        reader tells (a Linear's in_features or a conv's declared in_channels)."""
        return self.given_dims.get(t, -1)

    def _module(self, node) -> None:
        path = str(node.target).removeprefix("model.")
        module = self.module.get_submodule(path)
        why = _graph_level_module(module)
        if why:
            self.refuse(f"{path} ({short_name(module)}): {why}")
        if class_name(module) == HGT_CLASS:
            self._hgt(node, module, path)
            return
        if is_message_passing(module):
            self._conv(node, module, path)
            return
        self._close_round()
        if class_name(module) == HETERO_DICT_LINEAR:
            self._dict_linear(node, module, path)
            return
        if len(node.args) != 1 or node.kwargs:
            self.refuse(f"{path} ({short_name(module)}) is called with more than one type's features")
        t = self._type_of(node.args[0], path)
        ops = node_ops(module, path)
        self._fix_width(t, ops)
        self._add_ops(t, ops, node)

    def _hgt(self, node, module, path: str) -> None:
        """An HGTConv call: one round of its own (module doc), its result a dict of types."""
        from sparkgnn.models.pyg_hgt import hgt_round

        args, kwargs = list(node.args), dict(node.kwargs)
        if len(args) != 2 or kwargs or not isinstance(args[1], dict):
            self.refuse(f"{path} (HGTConv) must be called as conv(x_dict, edge_index_dict)")
        x, ei = args
        relations: list[EdgeType] = []
        for key, value in ei.items():
            kind = self.values.get(value) if isinstance(value, torch.fx.Node) else None
            if not (isinstance(kind, tuple) and kind[0] == "edges") or tuple(key) != tuple(kind[1]):
                self.refuse(f"{path} is not given forward's edge_index_dict (relation {key!r})")
            relations.append(cast(EdgeType, tuple(kind[1])))
        if not isinstance(x, dict):
            self.refuse(f"{path} (HGTConv) is not given a dict of node types' features")
        inputs = []
        for key, value in x.items():
            t = self._type_of(value, path)
            if key != t:
                self.refuse(f"{path} is given type {t!r}'s rows under key {key!r}")
            inputs.append(t)
        self._close_round()
        read = [t for t in inputs if any(t in (e[0], e[2]) for e in relations)]
        for t in read:
            if self.width[t] < 0:  # an input read first by this conv: its kqv_lin tells
                weight = module.kqv_lin.lins[t].weight
                if isinstance(weight, torch.nn.parameter.UninitializedParameter):
                    self.refuse(f"{path}: type {t!r}'s input width is unknown (lazy): run the model once first")
                self.width[t] = self.in_dims[t] = int(weight.shape[1])
        try:
            convs, post = hgt_round(module, path, relations, {t: self.width[t] for t in read})
        except UnsupportedModelError as e:
            self.refuse(str(e))
        self.rounds.append(_Round(convs=convs, aggr="softmax", closed=True, post=post))
        self.current.clear()
        index = len(self.rounds) - 1
        for t, ops in post.items():
            self.stage[t], self.width[t] = index, int(module.out_channels)
            self.last = ops[0]
        self.values[node] = ("hgt", index, tuple(post))

    def _fix_width(self, t: str, ops: list[NodeOp]) -> None:
        """An input read first by a node op gets that op's width (a Linear's in_features)."""
        if self.width.get(t, 0) < 0 and ops:
            first = next((op for op in ops if isinstance(op, LinearOp)), None)
            if first is None or ops[0] is not first:
                self.refuse(f"type {t!r}'s input width is unknown: read it first with a Linear or a conv")
            self.width[t] = self.in_dims[t] = first.in_features

    def _dict_linear(self, node, module, path) -> None:
        if len(node.args) != 1 or not isinstance(node.args[0], dict) or node.kwargs:
            self.refuse(f"{path} (HeteroDictLinear) must be called with one dict of per-type features")
        per_type = {}
        for key, value in node.args[0].items():
            t = self._type_of(value, path)
            if key != t:
                self.refuse(f"{path} is given type {t!r}'s rows under key {key!r}")
            if t not in module.lins:
                self.refuse(f"{path} has no Linear for type {t!r}")
            ops = node_ops(module.lins[t], f"{path}.lins.{t}")
            self._fix_width(t, ops)
            per_type[t] = ops
        self.values[node] = ("dict_ops", per_type)

    def _conv(self, node, module, path) -> None:
        args, kwargs = list(node.args), dict(node.kwargs)
        if len(args) != 2 or kwargs:
            self.refuse(
                f"{path} ({short_name(module)}) must be called as conv(x, edge_index); edge features "
                "and weights on typed relations are not supported yet"
            )
        x, ei = args
        kind = self.values.get(ei) if isinstance(ei, torch.fx.Node) else None
        if not (isinstance(kind, tuple) and kind[0] == "edges"):
            self.refuse(f"{path} is not called with one relation's edge_index from forward's edge_index_dict")
        e = cast(EdgeType, kind[1])
        s, _, d = e
        xs, xd = (x, x) if not isinstance(x, (tuple, list)) else tuple(x)
        if s == d and isinstance(x, (tuple, list)) and xs is not xd:
            self.refuse(f"{path}: relation {e} within one type is given two different inputs")
        sides = [(t, v, self._type_of(v, path)) for t, v in ((s, xs), (d, xd))]  # may close the last round
        if not self.rounds or self.rounds[-1].closed:
            self.rounds.append(_Round())
        rnd = self.rounds[-1]
        if e in rnd.convs:
            self.refuse(f"relation {e} has two convs in one round")
        for t, v, got in sides:
            if got != t:
                self.refuse(f"{path}: relation {e} is given type {got!r}'s rows for its {t!r} side")
            if rnd.inputs.setdefault(t, v) is not v:
                self.refuse(f"{path}: convs of one round read different values of type {t!r}")
        layer = self._layer(module, path, e)
        rnd.convs[e] = layer
        self.last = layer
        self.values[node] = _Rel(len(self.rounds) - 1, d, 1)

    def _layer(self, module, path: str, e: EdgeType) -> MergeableConv:
        s, _, d = e
        ws, wd = self.width[s], self.width[d]
        for t in (s, d):
            if self.width[t] < 0:  # an input read first by this conv: its in_channels tell
                w = _declared_width(module, t == s)
                if w is None:
                    self.refuse(
                        f"{path}: type {t!r}'s input width is unknown (lazy in_channels, no Linear first): "
                        "pass in_dims={type: width}"
                    )
                self.width[t] = self.in_dims[t] = w
        ws, wd = self.width[s], self.width[d]
        if ws != wd:
            self.refuse(
                f"{path}: relation {e} reads {ws}-wide {s!r} rows and {wd}-wide {d!r} rows; a relation's conv "
                "reads one width on both sides: project the types to one width first (a per-type Linear)"
            )
        conv = copy.copy(module)  # a shallow copy with concrete in_channels (to_hetero's are often lazy)
        if hasattr(conv, "in_channels"):
            conv.in_channels = ws if s == d or not isinstance(module.in_channels, (tuple, list)) else (ws, wd)
        return conv_layer(conv, path, use_edge_weight=False)

    def _function(self, node) -> None:
        if node.op == "call_function" and node.target is operator.getitem and self._getitem_input(node):
            return
        if node.op == "call_function" and self._relation_op(node):
            return
        self._close_round()
        if node.op == "call_method":
            entry = METHODS.get(str(node.target))
        else:
            entry = FUNCTIONS.get(node.target)
        if entry is None:
            name = (
                f"Tensor.{node.target}" if node.op == "call_method" else getattr(node.target, "__name__", node.target)
            )
            self.refuse(f"{name} is not a supported operation in a typed model")
        params, convert = entry
        t = self._type_of(node.args[0] if node.args else None, str(node.target))
        bound = _bind(node, params, self.refuse)
        if bound.get("training") is True or bound.get("train") is True:
            self.refuse(
                "dropout with training=True fixed in the traced code (to_hetero traced a model in training "
                "mode), so PyG applies it even in eval: use torch.nn.Dropout, or call to_hetero on an eval model"
            )
        ops = convert(bound)
        if isinstance(ops, str):
            self.refuse(ops)
        self._add_ops(t, ops, node)

    def _relation_op(self, node) -> bool:
        """Cross-relation merges: pairwise add / max / min (to_hetero), the mean's division,
        torch.stack + a reduction over dim 0 (HeteroConv). False for anything else."""
        target, args, kwargs = node.target, node.args, dict(node.kwargs)
        rels = [self.values.get(a) if isinstance(a, torch.fx.Node) else None for a in args[:2]]
        if target is torch.stack:
            items = list((args[0] if args else kwargs.get("tensors")) or [])
            dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
            found = [r for r in (self.values.get(a) for a in items) if isinstance(r, _Rel)]
            if not found or len(found) != len(items) or any(r.aggr is not None or r.stacked for r in found):
                return False
            if dim != 0 or len({(r.round, r.dst) for r in found}) != 1:
                self.refuse("stacks relation outputs other than one type's over dim 0")
            self.values[node] = _Rel(found[0].round, found[0].dst, sum(r.count for r in found), stacked=True)
            return True
        if target in REDUCTIONS and len(args) == 1 and isinstance(rels[0], _Rel) and rels[0].stacked:
            if kwargs.get("dim", 0) != 0 or set(kwargs) - {"dim"}:
                self.refuse(f"{target.__name__} of stacked relation outputs is supported over dim 0 only")
            rel = rels[0]
            self.values[node] = _Rel(rel.round, rel.dst, rel.count, REDUCTIONS[target])
            return True
        if target is torch.div and isinstance(rels[0], _Rel) and not rels[0].stacked and len(args) == 2:
            rel = rels[0]
            if rel.aggr != "sum" or args[1] != rel.count or kwargs:
                self.refuse(f"divides merged relation outputs by {args[1]!r}; only a mean's count ({rel.count}) is")
            self.values[node] = _Rel(rel.round, rel.dst, rel.count, "mean")
            return True
        if target in RELATION_FUNCTIONS and len(args) == 2 and all(isinstance(r, _Rel) for r in rels):
            a, b = cast(_Rel, rels[0]), cast(_Rel, rels[1])
            aggr = RELATION_FUNCTIONS[target]
            if (a.round, a.dst) != (b.round, b.dst) or a.stacked or b.stacked or kwargs:
                self.refuse("merges relation outputs of different types or rounds")
            if {a.aggr, b.aggr} - {None, aggr}:
                self.refuse(f"merges relations by {aggr} and {a.aggr or b.aggr} at once; one aggregation per round")
            self.values[node] = _Rel(a.round, a.dst, a.count + b.count, aggr)
            return True
        read = [x for a in args for x in (a if isinstance(a, (list, tuple)) else [a])]
        if target in (torch.cat, torch.mul, operator.mul) and any(isinstance(self.values.get(x), _Rel) for x in read):
            self.refuse(
                f"relations merged by {getattr(target, '__name__', target)}: only sum, mean, max, min merge exactly"
            )
        return False


def _declared_width(module, source: bool) -> int | None:
    """A conv's declared input width for its source (or destination) side, None when lazy."""
    channels = getattr(module, "in_channels", None)
    if isinstance(channels, (tuple, list)):
        channels = channels[0 if source else 1]
    return int(channels) if isinstance(channels, int) and channels > 0 else None


# -- RGCN ----------------------------------------------------------------------------------------


def rgcn_round(conv, where: str, metadata, width: int) -> HeteroRound:
    """One RGCNConv / FastRGCNConv as a typed round (module doc): relation k (metadata edge
    type k) gets a SAGE layer with that relation's weight over the mean (or sum) of its
    neighbours; the first relation into each type also carries the root weight and bias, and a
    type no relation points into keeps `x @ root + bias` (what RGCN gives every node)."""
    name = class_name(conv)
    if getattr(conv, "flow", "source_to_target") != "source_to_target":
        unsupported(where, conv, f"flow={conv.flow!r} (only 'source_to_target')")
    aggr = {"mean": "mean", "add": "sum", "sum": "sum", "max": "max"}.get(conv.aggr)
    if aggr is None or (name.endswith("FastRGCNConv") and aggr == "max"):
        unsupported(
            where, conv, f"aggr={conv.aggr!r} (supported: mean, add / sum{', max' if 'Fast' not in name else ''})"
        )
    channels = conv.in_channels
    if isinstance(channels, (tuple, list)):
        if channels[0] != channels[1]:
            unsupported(where, conv, f"in_channels={tuple(channels)}: source and destination widths must agree")
        channels = channels[0]
    if int(channels) != width:
        unsupported(where, conv, f"in_channels={channels}, but it reads {width}-wide rows")
    edge_types = metadata[1]
    if conv.num_relations != len(edge_types):
        unsupported(
            where, conv, f"num_relations={conv.num_relations}, but the metadata has {len(edge_types)} edge types"
        )
    weights = _relation_weights(conv, where)  # [R, in, out]
    out_dim = int(conv.out_channels)
    root = None if conv.root is None else tensor_of(conv.root, where + ".root", conv)
    bias = None if conv.bias is None else tensor_of(conv.bias, where + ".bias", conv)
    convs: dict[EdgeType, MergeableConv] = {}
    carries_root: set[str] = set()
    for k, e in enumerate(edge_types):
        first = e[2] not in carries_root
        carries_root.add(e[2])
        layer = SAGELayer(
            width, out_dim, aggr=aggr, root_weight=first and root is not None, bias=first and bias is not None
        )
        with torch.no_grad():
            layer.weight_l.copy_(weights[k].t())
            if layer.weight_r is not None and root is not None:
                layer.weight_r.copy_(root.t())
            if layer.bias_l is not None and bias is not None:
                layer.bias_l.copy_(bias)
        convs[e] = layer
    keep = {}
    for t in metadata[0]:
        if t not in carries_root:
            op = LinearOp(width, out_dim, bias=bias is not None)
            with torch.no_grad():
                op.weight.copy_(root.t() if root is not None else torch.zeros(out_dim, width))
                if op.bias is not None and bias is not None:
                    op.bias.copy_(bias)
            keep[t] = NodeOpStack(ops=[op])
    return HeteroRound(convs=convs, aggr="sum", keep=keep)


def _relation_weights(conv, where: str) -> torch.Tensor:
    """Each relation's dense [in, out] weight: bases combined, blocks laid on the diagonal."""
    weight = tensor_of(conv.weight, where + ".weight", conv)
    if conv.num_bases is not None:
        comp = tensor_of(conv.comp, where + ".comp", conv)
        return (comp @ weight.view(conv.num_bases, -1)).view(conv.num_relations, -1, conv.out_channels)
    if conv.num_blocks is not None:
        return torch.stack([torch.block_diag(*weight[r]) for r in range(conv.num_relations)])
    return weight


class _RGCNWalk(_Walk):
    """An RGCN model's forward(x, edge_index, edge_type) over the homogeneous form: every conv a
    typed round over all relations (rgcn_round), every node op applied to each node type (each
    type gets its own copy of the weights, as the homogeneous model applies one to all rows)."""

    def trace(self) -> torch.fx.Graph:
        tracer = _HeteroTracer()
        tracer.record_stack_traces = True
        try:
            return tracer.trace(self.module)
        except Exception as e:  # noqa: BLE001 - any failure of symbolic execution is reported, named
            raise UnsupportedModelError(
                f"{self.where}: forward() cannot be traced symbolically ({type(e).__name__}: {e})"
            ) from e

    def run(self):
        graph = self.trace()
        placeholders: list[torch.fx.Node] = []
        outputs: list[str] = []
        for node in graph.nodes:
            self.node = node
            if node.op == "placeholder":
                placeholders.append(node)
                if len(placeholders) == 1:
                    self.values[node] = ("all", None)
                    self.cur = node
                    for t in self.metadata[0]:
                        self.stage[t], self.width[t] = -1, self.given_dims.get(t, -1)
                        if self.width[t] >= 0:
                            self.in_dims[t] = self.width[t]
            elif node.op == "output":
                if node.args[0] is not self.cur:
                    self.refuse("returns a value other than the last op's result")
                outputs = list(self.metadata[0])
            elif node.op == "call_module":
                module = self.module.get_submodule(str(node.target))
                if node.args and node.args[0] is not self.cur:
                    self.refuse(f"{node.target} does not read the previous op's result")
                if class_name(module) in RGCN_CLASSES:
                    if len(placeholders) < 3 or list(node.args[1:3]) != placeholders[1:3] or node.kwargs:
                        self.refuse(
                            f"{node.target} must be called as conv(x, edge_index, edge_type) with forward's inputs"
                        )
                    self._rgcn(module, str(node.target))
                elif is_message_passing(module):
                    self.refuse(
                        f"{node.target} ({short_name(module)}): an RGCN model may mix RGCN convs and node-wise ops only"
                    )
                else:
                    if len(node.args) != 1 or node.kwargs:
                        self.refuse(f"{node.target} ({short_name(module)}) is called with more than the features")
                    for t in self.metadata[0]:
                        ops = node_ops(module, str(node.target))
                        self._fix_width(t, ops)
                        self._add_ops(t, ops, node)
                self.cur = node
            elif node.op == "call_function" or node.op == "call_method":
                entry = METHODS.get(str(node.target)) if node.op == "call_method" else FUNCTIONS.get(node.target)
                if entry is None:
                    self.refuse(f"{node.target} is not a supported operation in an RGCN model")
                if not node.args or node.args[0] is not self.cur:
                    self.refuse(f"{node.target} does not read the previous op's result")
                params, convert = entry
                for t in self.metadata[0]:
                    converted = convert(_bind(node, params, self.refuse))
                    if isinstance(converted, str):
                        self.refuse(converted)
                    self._add_ops(t, converted, node)
                self.cur = node
            else:
                self.refuse(f"reads attribute self.{node.target} directly; only submodules are supported")
        self.node = None
        return self._result(outputs)

    def _rgcn(self, module, path: str) -> None:
        widths = {self.width[t] for t in self.metadata[0]}
        if widths == {-1}:
            w = _declared_width(module, True)
            if w is None:
                self.refuse(f"{path}: in_channels are unknown")
            for t in self.metadata[0]:
                self.width[t] = self.in_dims[t] = w
            widths = {w}
        (width,) = widths
        rnd = rgcn_round(module, path, self.metadata, width)
        self.last = next(c for _, c in rnd.conv_items())
        self.rounds.append(
            _Round(
                convs=dict(rnd.conv_items()),
                aggr="sum",
                closed=True,
                keep={t: list(cast(NodeOpStack, s).ops) for t, s in rnd.keep.items()},
            )
        )
        for t in self.metadata[0]:
            self.stage[t], self.width[t] = len(self.rounds) - 1, int(module.out_channels)
