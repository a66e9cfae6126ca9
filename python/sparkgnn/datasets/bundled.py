"""Locating the Parquet files bundled in the `graphdatascience==2.2` wheel.

Why not import graphdatascience: it pulls in neo4j drivers and more (it is installed with
--no-deps, so importing it may even fail). Only its data files are needed, so its folder is found
with importlib's spec machinery, which reads the package location without executing it.
Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import os

from sparkgnn.errors import SparkGNNError

PACKAGE = "graphdatascience"
INSTALL_HINT = "pip install --no-deps graphdatascience==2.2"


class DatasetUnavailable(SparkGNNError, ImportError):
    """A bundled dataset's files cannot be found (the package that ships them is missing)."""


def resource_path(dataset: str, filename: str) -> str:
    """Absolute path of graphdatascience/resources/<dataset>/<filename>."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        candidate = os.path.join(folder, "resources", dataset, filename)
        if os.path.exists(candidate):
            return candidate
    where = f" (looked in {locations})" if locations else ""
    raise DatasetUnavailable(
        f"dataset {dataset!r} needs {filename} from the {PACKAGE} wheel, which is not installed"
        f"{where}. Install it without its dependencies: `{INSTALL_HINT}`"
    )
