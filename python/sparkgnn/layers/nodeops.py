"""Node-wise operations (Linear, activations, BatchNorm in eval, LayerNorm, normalize): everything a model does to one
node's vector without looking at the graph.

WHY a separate, closed vocabulary: node-wise ops run wherever the node's row happens to be (on a
worker after `update`, fused into the same Pipe round trip), so they must be self-contained,
serialisable as JSON + tensors, and provably row-independent. Dropout and Identity are no-ops in
eval mode and are simply not represented. BatchNorm is allowed only with running statistics (eval
mode), where it is a per-feature affine map; batch statistics would couple nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from sparkgnn.registry import Registry

NODE_OPS: Registry[type] = Registry("node op", ValueError)


def _op(name: str):
    def deco(cls):
        cls.op = name
        return NODE_OPS.register(name, cls)

    return deco


class NodeOp(torch.nn.Module):
    op: str = ""

    def config(self) -> dict:
        return {"op": self.op}

    def out_dim(self, in_dim: int) -> int:
        return in_dim


@_op("linear")
class LinearOp(NodeOp):
    def __init__(self, in_dim: int, out_dim: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = int(in_dim), int(out_dim)
        self.weight = torch.nn.Parameter(torch.zeros(self.out_features, self.in_features))
        self.bias = torch.nn.Parameter(torch.zeros(self.out_features)) if bias else None

    def config(self):
        return {"op": self.op, "in_dim": self.in_features, "out_dim": self.out_features, "bias": self.bias is not None}

    def out_dim(self, in_dim):
        if in_dim != self.in_features:
            raise ValueError(f"linear expects width {self.in_features}, got {in_dim}")
        return self.out_features

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


_ACTIVATIONS: Registry[Callable[..., Tensor]] = Registry("activation", ValueError)
_ACTIVATIONS.register("relu", lambda x: F.relu(x))
_ACTIVATIONS.register("leaky_relu", lambda x, negative_slope=0.01: F.leaky_relu(x, negative_slope))
_ACTIVATIONS.register("elu", lambda x, alpha=1.0: F.elu(x, alpha))
_ACTIVATIONS.register("gelu", lambda x, approximate="none": F.gelu(x, approximate=approximate))
_ACTIVATIONS.register("tanh", torch.tanh)
_ACTIVATIONS.register("sigmoid", torch.sigmoid)
_ACTIVATIONS.register("silu", lambda x: F.silu(x))
_ACTIVATIONS.register("softplus", lambda x, beta=1.0, threshold=20.0: F.softplus(x, beta, threshold))
_ACTIVATIONS.register("log_softmax", lambda x: F.log_softmax(x, dim=-1))
_ACTIVATIONS.register("softmax", lambda x: F.softmax(x, dim=-1))


@_op("activation")
class ActivationOp(NodeOp):
    """Parameter-free activation, by name, with its scalar options (negative_slope, alpha, ...).
    (log_)softmax is over the feature axis only, which is node-wise."""

    def __init__(self, name: str, **options):
        super().__init__()
        _ACTIVATIONS.lookup(name)  # refuses an unknown name, listing the known ones
        self.name, self.options = name, dict(options)

    def config(self):
        return {"op": self.op, "name": self.name, **self.options}

    def forward(self, x):
        return _ACTIVATIONS[self.name](x, **self.options)


@_op("prelu")
class PReLUOp(NodeOp):
    def __init__(self, num_parameters: int = 1):
        super().__init__()
        self.num_parameters = int(num_parameters)
        self.weight = torch.nn.Parameter(torch.zeros(self.num_parameters))

    def config(self):
        return {"op": self.op, "num_parameters": self.num_parameters}

    def forward(self, x):
        return F.prelu(x, self.weight)


@_op("batchnorm")
class BatchNormOp(NodeOp):
    """BatchNorm1d in eval mode: (x - running_mean) / sqrt(running_var + eps) * weight + bias,
    computed by F.batch_norm(training=False) so it rounds exactly like PyTorch's eval path."""

    weight: torch.nn.Parameter | None
    bias: torch.nn.Parameter | None
    running_mean: Tensor
    running_var: Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        self.num_features, self.eps, self.affine = int(num_features), float(eps), bool(affine)
        self.register_buffer("running_mean", torch.zeros(self.num_features))
        self.register_buffer("running_var", torch.ones(self.num_features))
        if affine:
            self.weight = torch.nn.Parameter(torch.ones(self.num_features))
            self.bias = torch.nn.Parameter(torch.zeros(self.num_features))
        else:
            self.weight = self.bias = None

    def config(self):
        return {"op": self.op, "num_features": self.num_features, "eps": self.eps, "affine": self.affine}

    def out_dim(self, in_dim):
        if in_dim != self.num_features:
            raise ValueError(f"batchnorm expects width {self.num_features}, got {in_dim}")
        return in_dim

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


@_op("layernorm")
class LayerNormOp(NodeOp):
    """LayerNorm over the feature axis of each row (torch.nn.LayerNorm over the last dimension,
    PyG's LayerNorm in mode="node"), computed by F.layer_norm so it rounds exactly like PyTorch.
    Row-wise: a row's mean and variance are its own."""

    row_wise = True
    weight: torch.nn.Parameter | None
    bias: torch.nn.Parameter | None

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        super().__init__()
        self.num_features, self.eps, self.affine = int(num_features), float(eps), bool(affine)
        self.weight = torch.nn.Parameter(torch.ones(self.num_features)) if affine else None
        self.bias = torch.nn.Parameter(torch.zeros(self.num_features)) if affine and bias else None

    def config(self):
        return {
            "op": self.op,
            "num_features": self.num_features,
            "eps": self.eps,
            "affine": self.affine,
            "bias": self.bias is not None,
        }

    def out_dim(self, in_dim):
        if in_dim != self.num_features:
            raise ValueError(f"layernorm expects width {self.num_features}, got {in_dim}")
        return in_dim

    def forward(self, x):
        return F.layer_norm(x, (self.num_features,), self.weight, self.bias, self.eps)


@_op("normalize")
class NormalizeOp(NodeOp):
    """F.normalize over the feature axis: each row divided by max(its p-norm, eps). Row-wise."""

    row_wise = True

    def __init__(self, p: float = 2.0, eps: float = 1e-12):
        super().__init__()
        self.p, self.eps = float(p), float(eps)
        if not self.p > 0:
            raise ValueError(f"normalize needs p > 0, got {self.p}")

    def config(self):
        return {"op": self.op, "p": self.p, "eps": self.eps}

    def forward(self, x):
        return F.normalize(x, p=self.p, dim=-1, eps=self.eps)


def build_node_op(config: dict) -> NodeOp:
    cfg = dict(config)
    return NODE_OPS.lookup(cfg.pop("op"))(**cfg)


class NodeOpStack(torch.nn.Module):
    """An ordered list of node ops, applied in sequence (empty = identity)."""

    def __init__(self, configs=(), ops=None):
        super().__init__()
        self.ops = torch.nn.ModuleList(ops if ops is not None else [build_node_op(c) for c in configs])

    def config(self) -> list:
        return [cast(NodeOp, op).config() for op in self.ops]

    def out_dim(self, in_dim: int) -> int:
        for op in self.ops:
            in_dim = cast(NodeOp, op).out_dim(in_dim)
        return in_dim

    def first_linear(self):
        """The leading LinearOp, if the stack starts with one (used by GIN's transform-then-
        propagate: a leading Linear commutes with the sum aggregation)."""
        return self.ops[0] if len(self.ops) and isinstance(self.ops[0], LinearOp) else None

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        for op in list(self.ops)[start:]:
            x = op(x)
        return x

    def __len__(self):
        return len(self.ops)


@_op("parallel")
class ParallelOp(NodeOp):
    """Several node-op stacks side by side, each reading its own column slice of the row, their
    outputs concatenated: [stack_0(x[:, a_0:b_0]) | stack_1(x[:, a_1:b_1]) | ...].

    WHY: model batching (models/batching.py) runs k models as one model whose rows are the k
    models' rows side by side; each model's node-wise ops (pre, post) then apply to its own slice.
    An empty stack passes its slice through. Row-wise whenever its stacks are (layers.rowwise
    checks the stacks' ops one by one; this op itself only slices and concatenates)."""

    row_wise = True

    def __init__(self, in_dim: int, branches: list):
        super().__init__()
        self.in_dim = int(in_dim)
        self.inputs: list[tuple[int, int]] = []
        stacks = []
        for branch in branches:
            start, stop = (int(v) for v in branch["input"])
            if not 0 <= start < stop <= self.in_dim:
                raise ValueError(f"parallel branch input [{start}, {stop}) is not inside [0, {self.in_dim})")
            self.inputs.append((start, stop))
            stacks.append(NodeOpStack(branch.get("ops", ())))
        if not stacks:
            raise ValueError("a parallel op needs at least one branch")
        self.stacks = torch.nn.ModuleList(stacks)

    def config(self):
        return {
            "op": self.op,
            "in_dim": self.in_dim,
            "branches": [
                {"input": [start, stop], "ops": cast(NodeOpStack, stack).config()}
                for (start, stop), stack in zip(self.inputs, self.stacks, strict=True)
            ],
        }

    def branch_dims(self) -> list[int]:
        """Output width of each branch, in order."""
        stacks = [cast(NodeOpStack, stack) for stack in self.stacks]
        return [stack.out_dim(stop - start) for (start, stop), stack in zip(self.inputs, stacks, strict=True)]

    def out_dim(self, in_dim):
        if in_dim != self.in_dim:
            raise ValueError(f"parallel op expects width {self.in_dim}, got {in_dim}")
        return sum(self.branch_dims())

    def forward(self, x):
        outs = [stack(columns(x, start, stop)) for (start, stop), stack in zip(self.inputs, self.stacks, strict=True)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def columns(x: Tensor, start: int, stop: int) -> Tensor:
    """Columns start..stop-1 of a row matrix: x itself when that is all of it, else a contiguous
    copy, so the ops that read it run the same kernels as on a model's own (contiguous) rows."""
    if start == 0 and stop == x.shape[1]:
        return x
    return x[:, start:stop].contiguous()
