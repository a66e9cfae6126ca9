"""`infer(spark, graph, [model_a, model_b, ...])`: several models over one graph in one job.

WHY one job: the cost of batch inference is moving the graph (scan, partition, ship payloads and
states between layer steps), not the layers' arithmetic. Run as one batched model
(models/batching.py), k models are planned, prepared and shipped once per layer: models with
equal layer-1 payloads (raw features, or one transform with equal weights) ship them once, and
every model's layers run in the same round trips. Models that cannot share an edge list (another
self-loop policy, statistics with and without edge weights) run as separate batches, so a call
never fails for mixing them; it only shares less.

The result is a JobResult with one DataFrame per model (`frames`, by name, in the order given),
each exactly what `infer` returns for that model alone: (id, h[, pred]), pred the argmax of the
model's own columns (the first maximum, like torch.argmax) when it ends in a classifier. With
`out`, model `name`'s result is written to `out/<name>` under sparkgnn.outputs' rules (every
target checked before any work, staged, swapped in; nothing replaced without `overwrite`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from sparkgnn import files
from sparkgnn.engine.result import JobResult
from sparkgnn.errors import SparkGNNError
from sparkgnn.models.batching import batch_models, check_same_input_width, plan_batches
from sparkgnn.outputs import check_output, write_parquet_staged
from sparkgnn.parquet_read import read_parquet

log = logging.getLogger(__name__)


def model_names(sources: Sequence) -> list[str]:
    """A name per model: the saved model's directory name, else model_<i>; a repeated name gets
    its position appended (outputs go to out/<name>, which must be distinct)."""
    names = []
    for i, source in enumerate(sources):
        name = os.path.basename(os.fspath(source).rstrip("/")) if isinstance(source, (str, os.PathLike)) else ""
        names.append(name or f"model_{i}")
    return [f"{name}_{i}" if names.count(name) > 1 else name for i, name in enumerate(names)]


def split_result(result, start: int, stop: int, with_pred: bool):
    """One model's (id, h[, pred]) from the batched (id, h): its columns start..stop-1 of h."""
    from pyspark.sql import functions as F

    frame = result.select("id", F.slice("h", start + 1, stop - start).alias("h"))
    if with_pred:
        frame = frame.withColumn("pred", (F.expr("array_position(h, array_max(h))") - 1).cast("long"))
    return frame


def _write(spark, frame, target: str):
    """Stage `frame` beside `target`, then swap it in (sparkgnn.outputs); returns it read back."""
    write_parquet_staged(frame, target)
    return read_parquet(spark, target)


def infer_models(
    spark,
    graph,
    models: Sequence,
    *,
    out: str | None = None,
    names: Sequence[str] | None = None,
    work_dir: str | None = None,
    overwrite: bool = False,
    **options: Any,
) -> JobResult:
    """`infer` for a list of models (module doc). `options` are infer's other keyword arguments.
    Returns a JobResult keyed by model name, in the order given; models that ran in one batch
    share that batch's report and plan."""
    from sparkgnn.engine.api import coerce_model, infer, resolve_work_dir

    sources = list(models)
    if not sources:
        raise SparkGNNError("infer needs at least one model; got an empty list")
    names = list(names) if names is not None else model_names(sources)
    if len(names) != len(sources) or len(set(names)) != len(names):
        raise SparkGNNError(f"need one distinct name per model, got {names} for {len(sources)} models")
    out = files.absolute(out) if out else out
    root = resolve_work_dir(spark, out, work_dir)
    targets = {name: files.join(out, name) for name in names} if out else {}
    if out:
        inputs = {"graph directory": _path(graph) or getattr(graph, "path", None), "work dir": root}
        inputs.update({f"model {name}": _path(source) for name, source in zip(names, sources, strict=True)})
        check_output(out, inputs, holds_others=True)  # out itself may hold other results; never an input
        for name, target in targets.items():
            check_output(target, inputs, overwrite, flag=f"--out (model {name})")
    loaded = [coerce_model(source) for source in sources]
    check_same_input_width(loaded, names)
    frames: dict[str, Any] = dict.fromkeys(names)
    reports: dict[str, Any] = {}
    plans: dict[str, Any] = {}
    for batch in plan_batches(loaded, names):
        batch_names = [names[i] for i in batch]
        if len(batch) == 1:  # alone: the model itself, exactly as infer runs it
            if len(loaded) > 1:
                log.info(
                    f"sparkgnn: model batching: {batch_names[0]} cannot share an edge list with the others: runs alone"
                )
            model, parts = loaded[batch[0]], None
        else:
            batched = batch_models([loaded[i] for i in batch], batch_names)
            log.info(f"sparkgnn: model batching: {', '.join(batch_names)} run as one model")
            model, parts = batched.model, list(zip(batched.slices, batched.outputs, strict=True))
        job = infer(spark, graph, model, work_dir=root, **options)
        result = job.frame
        for n, i in enumerate(batch):
            frame = result if parts is None else split_result(result, *parts[n][0], parts[n][1] == "logits")
            frames[names[i]] = _write(spark, frame, targets[names[i]]) if out else frame
            reports[names[i]], plans[names[i]] = job.report, job.plan
    return JobResult(frames, reports, plans)


def _path(obj) -> str | None:
    return os.fspath(obj) if isinstance(obj, (str, os.PathLike)) else None
