"""What every PyG converter shares: naming a module, refusing it, copying its weights, the checks
every conv converter makes (flow, aggregation, input width).

Converters are registered by the *qualified name* of the exact class they convert
(`class_name(t)`, e.g. "torch_geometric.nn.conv.gcn_conv.GCNConv"), which is one name per class:
a subclass has its own name, so it is never taken for its base (it may override forward()).
"""

from __future__ import annotations

from typing import NoReturn

import torch

from sparkgnn.errors import UnsupportedModelError


def class_name(obj) -> str:
    """Qualified name of a class, or of an object's class: the key of the converter registries."""
    t = obj if isinstance(obj, type) else type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def short_name(obj) -> str:
    """The class name alone (for messages); also accepts a qualified name from class_name."""
    if isinstance(obj, str):
        return obj.rsplit(".", 1)[-1]
    return (obj if isinstance(obj, type) else type(obj)).__name__


def unsupported(where: str, module, what: str) -> NoReturn:
    raise UnsupportedModelError(f"{where} ({short_name(module)}): {what}")


def tensor_of(t, where: str, module) -> torch.Tensor:
    """A float32 CPU copy of a parameter (refusing lazily initialised ones)."""
    if isinstance(t, torch.nn.parameter.UninitializedParameter):
        unsupported(
            where,
            module,
            "has lazily initialised (uninitialised) parameters; run one "
            "forward pass or give explicit in_channels before converting",
        )
    return t.detach().to(dtype=torch.float32, device="cpu").clone().contiguous()


def copy_into(dst: torch.Tensor, src, where: str, module) -> None:
    """Copy a PyG parameter into a sparkgnn one of the same shape."""
    src = tensor_of(src, where, module)
    if tuple(src.shape) != tuple(dst.shape):
        unsupported(where, module, f"parameter shape {tuple(src.shape)} where {tuple(dst.shape)} was expected")
    with torch.no_grad():
        dst.copy_(src)


def is_message_passing(module) -> bool:
    from torch_geometric.nn.conv import MessagePassing

    return isinstance(module, MessagePassing)


def common_checks(conv, where: str, aggr: str | None = "add") -> None:
    """Refuse what no conv converter runs: a target_to_source flow, an aggregation other than
    `aggr` (None: the converter checks it), explain mode."""
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
