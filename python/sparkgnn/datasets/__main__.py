"""`python -m sparkgnn.datasets cora|imdb|synthetic|lastfm|synthetic-mag ... --out DIR`: write a
dataset in the on-disk graph format (`--typed`: the typed format, for datasets that have one) and
print a one-line summary. Sub-commands and their options come from the registry."""

from __future__ import annotations

import argparse
import sys
import time

from sparkgnn.cliargs import positive_int, run_cli
from sparkgnn.datasets.registry import DATASETS
from sparkgnn.graph.typed import typed_summary
from sparkgnn.logs import install_cli_handler


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sparkgnn.datasets", description="Write a dataset as a sparkgnn graph directory."
    )
    sub = parser.add_subparsers(dest="dataset", required=True)
    for name, item in DATASETS.items():
        cmd = sub.add_parser(name, help=item.summary, description=item.summary)
        for option, (_, kind, default, text) in item.cli_options.items():
            cmd.add_argument(f"--{option}", type=kind, default=default, required=default is None, help=text)
        cmd.add_argument("--out", required=True, help="output graph directory")
        cmd.add_argument("--rows-per-file", type=positive_int, default=None, help="max rows per Parquet file")
        cmd.add_argument("--overwrite", action="store_true", help="replace a graph already in --out")
        for flag, (_, text) in item.cli_flags.items():
            cmd.add_argument(f"--{flag}", action="store_true", help=text)
        if item.write_typed is not None:
            typed_help = (
                "write the typed graph (the default: this dataset has only a typed form)"
                if item.write is None
                else "write the typed graph (vertices/<node type>/, edges/<src>__<rel>__<dst>/) instead of a flat one"
            )
            cmd.add_argument("--typed", action="store_true", help=typed_help)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_cli_handler()  # library progress lines (sparkgnn loggers) on stdout
    return run_cli("sparkgnn.datasets", lambda: _write(args))


def _write(args) -> int:
    item = DATASETS[args.dataset]
    kwargs = {kw: getattr(args, option.replace("-", "_")) for option, (kw, *_rest) in item.cli_options.items()}
    kwargs.update({kw: True for flag, (kw, _) in item.cli_flags.items() if getattr(args, flag.replace("-", "_"))})
    start = time.perf_counter()
    if getattr(args, "typed", False) or item.write is None:
        meta = item.write_typed(args.out, rows_per_file=args.rows_per_file, overwrite=args.overwrite, **kwargs)
        print(f"wrote {typed_summary(meta)} to {args.out} ({time.perf_counter() - start:.1f}s)")
        return 0
    meta = item.write(args.out, rows_per_file=args.rows_per_file, overwrite=args.overwrite, **kwargs)
    classes = f", {meta['num_classes']} classes" if meta.get("has_labels") else ""
    print(
        f"wrote {meta['name']} to {args.out}: {meta['num_vertices']} vertices, {meta['num_edges']} edges, "
        f"{meta['feature_dim']}-d features{classes}, fingerprint {meta['fingerprint']} "
        f"({time.perf_counter() - start:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
