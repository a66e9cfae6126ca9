"""The cost model this work dir's past runs measured: observations stored with the work dir,
refit (planner.calibration.fit) before every plan.

Why in the work dir: it is where a team's jobs on one cluster already share prepared layouts and
models, so the measurements of one job improve the next job's plan (strategy and estimates) on
the same machines. Observations are keyed by the cluster's core count (a plan for 2 cores says
nothing about 64) and capped to the most recent MAX_OBSERVATIONS per key, so the model follows
the machine as it changes. Runs whose routed rows travel through files (engine.exchange) are kept
under their own key ("2/files"): Spark's shuffle and a memory-mapped file move the same bytes at
rates an order of magnitude apart, so one fit over both would predict neither. A file that cannot
be read is reported and left alone (the job plans with the prior constants and records nothing):
nothing here overwrites what it did not write.
"""

from __future__ import annotations

import logging
import threading

from sparkgnn import files
from sparkgnn.planner import CostModel
from sparkgnn.planner.calibration import Observation, fit

CALIBRATION_FILE = "calibration.json"
MAX_OBSERVATIONS = 64
VERSION = 1
log = logging.getLogger(__name__)
# record() reads, extends and replaces the file: jobs finishing side by side on driver threads (a
# typed round's relation jobs) take turns, so none drops another's observations.
_RECORDING = threading.Lock()

# The constants a plan starts from before this work dir has measured anything, by exchange. Files:
# the "shuffle" term is an IPC write plus a memory-mapped read, the pipe term placing rows by id
# and building the DL tables, a pass one Spark task launch without the Arrow stream set-up, the
# per-edge term the sparse products. Refit (planner.calibration.fit, ridge weight 0.05 towards the
# previous prior) on six cold layers measured on this 2-core machine with the code of 2026-11-23,
# each layer charged as the plan costs it (RunReport.seconds_by_plan_layer): 8M edges / P=2
# (7.6 s with the first step, 3.6 s), 32M / P=4 (35.2, 16.2 s), 100M / P=4 one task at a time
# (109.4, 74.4 s); their predictions are within -20% / +29% (8M: -20% / +12%). The previous prior
# (1.5 GB/s, 1.5 GB/s, 0.3 s, 0.35 us) predicted 8M's layers 1.73x / 0.78x of the measured once
# the first step was charged to layer 0.
PRIORS = {
    "shuffle": CostModel(),
    "files": CostModel(shuffle_Bps=1.46e9, python_Bps=0.75e9, pass_overhead_s=0.33, per_edge_s=0.157e-6),
}


def _path(work_dir: str) -> str:
    return files.join(work_dir, CALIBRATION_FILE)


def _read(work_dir: str) -> dict:
    """The stored observations by core count; {} when there is no file yet. Raises ValueError
    naming the file when it exists but is not a calibration file this version wrote."""
    path = _path(work_dir)
    if not files.exists(path):
        return {}
    try:
        data = files.read_json(path)
        if data.get("version") != VERSION or not isinstance(data.get("by_cores"), dict):
            raise ValueError("unknown layout")
        return {key: [Observation(**item) for item in items] for key, items in data["by_cores"].items()}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"calibration file {path} is unreadable ({exc})") from exc


def _key(cores: int, exchange: str) -> str:
    return str(int(cores)) if exchange == "shuffle" else f"{int(cores)}/{exchange}"


def load(
    work_dir: str,
    cores: int,
    target_edges: float | None = None,
    exchange: str = "shuffle",
    *,
    warn_unreadable: bool = True,
) -> tuple[CostModel, int]:
    """The refit cost model for `cores` and `exchange` (for a graph of `target_edges` edges:
    planner.calibration weights layers of other sizes down) and how many observations it rests
    on (0: the prior). An unreadable file is a warning (the job plans with the prior);
    `warn_unreadable=False` leaves it to another load of the same job to say so once."""
    prior = PRIORS[exchange]
    try:
        observations = _read(work_dir).get(_key(cores, exchange), [])
    except ValueError as exc:
        if warn_unreadable:
            log.warning(f"sparkgnn: {exc}; planning with the default cost model")
        return prior, 0
    return fit(observations, prior=prior, target_edges=target_edges), len(observations)


def record(work_dir: str, cores: int, plan, seconds_by_layer: dict[int, float], exchange: str = "shuffle") -> int:
    """Append this run's layers (planner quantities + measured seconds) and return how many
    observations the key now holds. Written atomically (files.write_json_atomic: temp file + rename
    in the work dir, one put on an object store); the read and the write under a process-wide lock
    (jobs on several driver threads of one process record in turn)."""
    fresh = [
        Observation.from_estimates(layer.estimates, seconds_by_layer[index])
        for index, layer in enumerate(plan.layers)
        if seconds_by_layer.get(index, 0) > 0 and "shuffle_bytes" in layer.estimates
    ]
    if not fresh:
        return 0
    with _RECORDING:
        try:
            stored = _read(work_dir)
        except ValueError as exc:
            log.warning(f"sparkgnn: {exc}; this run's timings are not recorded")
            return 0
        key = _key(cores, exchange)
        stored[key] = (stored.get(key, []) + fresh)[-MAX_OBSERVATIONS:]
        content = {"version": VERSION, "by_cores": {k: [o.to_dict() for o in v] for k, v in stored.items()}}
        files.write_json_atomic(_path(work_dir), content)
        return len(stored[key])


def summary(model: CostModel, observations: int, work_dir: str) -> str:
    """One line for the job log: which constants the plan was costed with."""
    if not observations:
        return "sparkgnn: cost model: default constants (no measured layers in this work dir yet)"
    return (
        f"sparkgnn: cost model refit from {observations} measured layers in {_path(work_dir)}: "
        f"shuffle {model.shuffle_Bps / 1e9:.3f} GB/s, python pipe {model.python_Bps / 1e9:.3f} GB/s, "
        f"{model.pass_overhead_s:.2f} s per pass, {model.per_edge_s * 1e6:.3f} us per edge"
    )
