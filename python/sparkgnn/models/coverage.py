"""Which convs of torch_geometric.nn.conv sparkgnn runs: the README's coverage table, generated.

    python -m sparkgnn.models.coverage            print the Markdown table
    python -m sparkgnn.models.coverage --write    rewrite README.md's table in place
    python -m sparkgnn.models.coverage --check    exit 1 when README.md's table is stale

Every class in `torch_geometric.nn.conv.__all__` (except the MessagePassing base class) gets one
row, read from the conversion registries (models/pyg_convs.py): "native" when CONV_CONVERTERS has
a converter for the exact class (the details are the converter's docstring: what it maps to and
which options it refuses), "refused" with the reason from REJECTED, and for a conv in neither what
the generic fallback (layers/generic.py) makes of it, found by running it: the conv is built with
its defaults and PROBE_ARGUMENTS for the constructor arguments it requires, and converted;
"generic" when the locality probe and the rebuild check pass, else "refused" with the generic
path's reason, or "not supported yet" when it cannot be built from PROBE_ARGUMENTS alone.
WHY generated: the registries are what `Model.from_pyg` consults, so a
table derived from them cannot claim a conv that does not convert, and a conv registered later
shows up without editing the README by hand (tests/models/test_coverage.py checks it is current).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import pathlib
import sys

from sparkgnn.models.pyg_common import class_name
from sparkgnn.models.pyg_convs import CONV_CONVERTERS, REJECTED, ensure_registered

START = "<!-- conv-coverage:start -->"
END = "<!-- conv-coverage:end -->"
NOT_YET = "not supported yet"
README = pathlib.Path(__file__).resolve().parents[3] / "README.md"

log = logging.getLogger(__name__)

#: Values for the constructor arguments a conv requires, when the table builds one to probe it.
PROBE_ARGUMENTS = {"in_channels": 8, "out_channels": 8, "channels": 8, "K": 2, "alpha": 0.1, "num_layers": 2}
PROBE_WIDTH = 8


@functools.cache
def generic_status(cls) -> tuple[str, str]:
    """("generic" | "refused", details) for a conv class with no native converter: what the
    generic fallback does with an instance built from PROBE_ARGUMENTS and defaults."""
    import torch

    from sparkgnn.errors import UnsupportedModelError
    from sparkgnn.models.pyg_convs import generic_layer
    from sparkgnn.models.pyg_multihop import UnsizedConv

    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = [name for name in required if name not in PROBE_ARGUMENTS]
    if missing:
        return "refused", f"{NOT_YET} (its constructor needs {', '.join(missing)}; not probed)"
    torch.manual_seed(0)
    try:
        conv = cls(**{name: PROBE_ARGUMENTS[name] for name in required})
    except Exception as e:  # noqa: BLE001 - a conv may need optional libraries; reported by name
        return "refused", f"{NOT_YET} (cannot be built here: {type(e).__name__})"
    try:
        layer = generic_layer(conv, cls.__name__)
        if isinstance(layer, UnsizedConv):
            layer = layer.build(PROBE_WIDTH)
    except UnsupportedModelError as e:
        why = str(e).split(": ", 1)[-1]
        if "not local" in why:
            why = "not local (the locality probe's run on partitions of destinations differs from the whole graph)"
        return "refused", f"generic fallback: {why}"
    built = ", ".join(f"{name}={PROBE_ARGUMENTS[name]}" for name in required) or "its defaults"
    return "generic", (
        f"the module itself on whole in-edge neighbourhoods (replicate; no PE store, refresh or state-reading "
        f"serving); probe passed as built with {built}, other options are probed at conversion"
    )


def coverage_rows() -> list[tuple[str, str, str]]:
    """(PyG class name, "native" | "generic" | "refused", details) for every conv class PyG
    exports, in PyG's order."""
    import torch_geometric.nn.conv as convs

    ensure_registered()
    rows = []
    for name in convs.__all__:
        cls = getattr(convs, name)
        if cls is convs.MessagePassing:
            continue
        key = class_name(cls)
        if key in CONV_CONVERTERS:
            doc = inspect.getdoc(CONV_CONVERTERS[key]) or ""
            rows.append((name, "native", " ".join(doc.split())))
        elif key in REJECTED:
            rows.append((name, "refused", " ".join(REJECTED[key].split())))
        else:
            status, details = generic_status(cls)
            rows.append((name, status, " ".join(details.split())))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The table as the README holds it between the markers (no trailing newline)."""
    rows = coverage_rows()
    native = sum(1 for _, status, _ in rows if status == "native")
    generic = sum(1 for _, status, _ in rows if status == "generic")
    lines = [
        f"{native} of {len(rows)} conv classes of torch_geometric.nn.conv run natively and {generic} through the "
        "generic fallback (generated by `python -m sparkgnn.models.coverage --write`).",
        "",
        "| PyG conv | sparkgnn | details |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {name} | {status} | {_cell(details)} |" for name, status, details in rows]
    return "\n".join(lines)


def replace_section(text: str, table: str) -> str:
    """`text` with the part between the START and END markers replaced by `table`; a text
    without exactly one START followed by one END is refused."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"README must hold one {START} ... {END} section")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def section(text: str) -> str:
    """What `text` holds between the markers (the table as written)."""
    if START not in text or END not in text:
        raise ValueError(f"README must hold one {START} ... {END} section")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkgnn.models.coverage", description=__doc__.split("\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="rewrite the table in README.md")
    what.add_argument("--check", action="store_true", help="exit 1 when README.md's table is not current")
    parser.add_argument("--readme", type=pathlib.Path, default=README, help="the README to read or write")
    args = parser.parse_args(argv)
    table = markdown_table()
    if not (args.write or args.check):
        sys.stdout.write(table + "\n")
        return 0
    try:
        text = args.readme.read_text()
        if args.check:
            if section(text) != table:
                log.error(
                    "%s: the conv coverage table is stale; run python -m sparkgnn.models.coverage --write", args.readme
                )
                return 1
            return 0
        args.readme.write_text(replace_section(text, table))
    except (OSError, ValueError) as e:
        parser.error(f"{args.readme}: {e}")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    raise SystemExit(main())
