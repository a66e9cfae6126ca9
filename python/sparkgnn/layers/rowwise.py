"""Which layers compute each destination's row from that row alone.

WHY a module of its own: two sides need the same answer. The DL step (dl/step.py) runs a layer's
update and post ops on destination ranges only when every module of them is row-wise, which keeps
its vertex-sized temporaries (sums, state, the update's intermediates) to one range; and the
planner's memory rule (planner/partitions.py) may leave those temporaries out of a task's peak only
for the layers where the step does that (Model.plan_info carries the answer as `range_wise`).
"""

from __future__ import annotations

import torch

ROW_WISE_ACTIVATIONS = frozenset(
    {"relu", "leaky_relu", "elu", "gelu", "tanh", "sigmoid", "silu", "softplus", "log_softmax", "softmax"}
)


def _row_wise_module(module: torch.nn.Module) -> bool:
    from sparkgnn.layers.gat import GATLayer
    from sparkgnn.layers.gcn import GCNLayer
    from sparkgnn.layers.gin import GINLayer
    from sparkgnn.layers.nodeops import ActivationOp, BatchNormOp, LinearOp, NodeOpStack, PReLUOp
    from sparkgnn.layers.sage import SAGELayer

    declared = getattr(module, "row_wise", None)
    if declared is not None:
        return bool(declared)
    # Checked: each update reads h_dst[i], agg[i] and stats[i] only; BatchNorm runs in eval on its
    # running statistics (an affine map per feature); the activations are element-wise or over the
    # feature axis of one row ((log_)softmax).
    if type(module) is ActivationOp:
        return module.name in ROW_WISE_ACTIVATIONS
    known = (GCNLayer, SAGELayer, GINLayer, GATLayer, NodeOpStack, torch.nn.ModuleList, LinearOp, BatchNormOp, PReLUOp)
    return type(module) in known


def rows_independent(conv: torch.nn.Module, post: torch.nn.Module) -> bool:
    """Whether a conv's update and its post stack compute each destination's row from that row
    alone, so a step may run them on destination ranges. Decided per module: a module's own
    `row_wise` attribute when it has one, else membership of the classes checked above (the exact
    class: a subclass may override forward). Anything else (a layer normalising over all rows, an
    op with batch statistics) runs on the whole partition."""
    return all(_row_wise_module(module) for part in (conv, post) for module in part.modules())
