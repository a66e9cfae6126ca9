"""The DL handler's op registry: op name -> fn(models, header, tables) -> result tables, where
`models` is the handler's ModelRegistry (models by fingerprint) and the header names the op.

WHY a registry that others fill: dl is the torch worker layer and must not know the layers above
it. dl registers its own op here (layer_step, handler.py). An op of a layer above is registered
by that layer, from its composition roots: serving's "serving_partials" (sparkgnn.serving.dl_ops)
is registered when serving is imported, so the in-process runner serves it wherever serving sends
it, and by `sparkgnn-worker` (sparkgnn.worker.cli) at start, since nothing else imports serving in
a standalone worker. An unknown op is a StepError naming the registered ones.
"""

from __future__ import annotations

from sparkgnn.dl.step import StepError
from sparkgnn.registry import Registry

OPS: Registry = Registry("op", StepError)
