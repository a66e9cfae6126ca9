"""Models addressed by fingerprint.

Why: a DL worker may be a separate process (or machine) that receives only a model fingerprint in a
task header. It loads `<store>/<fingerprint>/` with weights_only loading and refuses a fingerprint
it does not hold, or a directory whose content hashes to something else (no silent wrong model).

The store is any path sparkgnn.files reaches. On a local disk an entry is saved into a staging
directory and renamed into place (a reader sees a whole entry or none). Elsewhere (s3://, where
there is no rename; HDFS too) an entry is committed by its model.json, written last: a directory
without one is not an entry yet, and its weights file is named after its checksum, so two
processes registering the same model at once leave a model.json that names complete weights.
"""

from __future__ import annotations

import os
import threading

from sparkgnn import files
from sparkgnn.errors import ModelLoadError


def model_dir(store: str, fingerprint: str) -> str:
    """`<store>/<fingerprint>`; a local store (path or file: URI) as a plain absolute path. A
    fingerprint that is not 64 hex digits (`../x` from a task header) is a ModelLoadError."""
    from sparkgnn.models.serialization import check_fingerprint

    check_fingerprint(fingerprint, "model store: fingerprint")
    store = files.filesystem(store)[1] if files.is_local(store) else str(store)
    return files.join(store, fingerprint)


def _committed(target: str) -> bool:
    from sparkgnn.models.serialization import MANIFEST

    return files.kind(files.join(target, MANIFEST)) == "file"


def register(model, store: str) -> str:
    """Save `model` under its fingerprint in `store` (idempotent) and return the fingerprint."""
    fingerprint = model.fingerprint()
    target = model_dir(store, fingerprint)
    if not files.is_local(store):
        if not _committed(target):
            from sparkgnn.models.serialization import save_model

            save_model(model, target, unique_weights=True)
        return fingerprint
    if not os.path.isdir(target):
        os.makedirs(files.parent(target), exist_ok=True)
        staging = f"{target}.tmp-{os.getpid()}-{threading.get_ident()}"
        model.save(staging)
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.isdir(target):  # lost a race only if someone else created it
                raise
    return fingerprint


class ModelRegistry:
    """Process-wide cache of loaded models, keyed by fingerprint."""

    def __init__(self, store: str, device: str = "cpu"):
        self.store = store
        self.device = device
        self._models: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, fingerprint: str):
        from sparkgnn.models.serialization import check_fingerprint

        check_fingerprint(fingerprint, "task header: model fingerprint")  # a path part below
        with self._lock:
            model = self._models.get(fingerprint)
            if model is None:
                model = self._load(fingerprint)
                self._models[fingerprint] = model
            return model

    def _load(self, fingerprint: str):
        from sparkgnn.models import Model

        path = model_dir(self.store, fingerprint)
        if not (os.path.isdir(path) if files.is_local(path) else _committed(path)):
            raise ModelLoadError(f"unknown model fingerprint {fingerprint!r}: not in model store {self.store!r}")
        model = Model.load(path)
        actual = model.fingerprint()
        if actual != fingerprint:
            raise ModelLoadError(
                f"model store entry {path!r} hashes to {actual!r}, not the requested {fingerprint!r}; refusing it"
            )
        return model.to(self.device)
