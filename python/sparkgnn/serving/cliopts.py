"""argparse types of the serving command lines that sparkgnn.cliargs does not have (yet).

WHY: the evaluate CLI and the streaming job both take SRPE's budget `--gamma`, and a mode spec
(srpe@0.05/qer) carries one too; all three must refuse the same values in the same words instead
of int()/float() tracebacks or a ModeError deep inside the engine after the graph was loaded.
"""

from __future__ import annotations

import argparse
import math


def check_gamma(text) -> float:
    """SRPE's recomputation budget: a number in (0, 1]; ValueError saying why not."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number in (0, 1], got {text!r}") from None
    if math.isnan(value) or not 0.0 < value <= 1.0:
        raise ValueError(f"must be in (0, 1] (the fraction of candidates recomputed), got {text!r}")
    return value


def gamma_type(text: str) -> float:
    """argparse type for --gamma."""
    try:
        return check_gamma(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (e.g. seconds between micro-batches, 0 = none)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
