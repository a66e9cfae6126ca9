"""Saving, loading and fingerprinting models.

Layout: a directory with
  model.json   {"format", "version", "spec", "weights_file", "weights_sha256", "fingerprint"}
  weights.pt   torch.save(state_dict) -- tensors only

WHY this layout: workers load models by fingerprint from a shared store, possibly written by
someone else, so loading must never execute code: the structure comes from JSON (a closed
vocabulary of layer kinds and node ops) and the tensors from `torch.load(weights_only=True)`.
The checksum and fingerprint in model.json make a corrupted or tampered weights file, or a spec
edited after saving, a clear ModelLoadError instead of a silently different model.

The fingerprint is sha256 over the canonical spec JSON and every state_dict tensor (name, dtype,
shape, raw bytes) in sorted-name order: same model -> same string, in any process.

Where: any path sparkgnn.files reaches (local, s3://, hdfs://); both files are read and written
whole through pyarrow.fs (each write atomic: a put on an object store, temp + rename on a disk) and
model.json goes last, so it is the commit record: a directory without it holds no model, and the
weights it names are complete (their checksum is in it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Sequence

import torch

from sparkgnn import files
from sparkgnn.errors import ModelLoadError, UnsupportedModelError
from sparkgnn.layers.generic import allowed_modules

MANIFEST = "model.json"
WEIGHTS = "weights.pt"
MANIFEST_FORMAT = "sparkgnn-model"
MANIFEST_VERSION = 1


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


FINGERPRINT_HEX_DIGITS = 64  # sha256


def check_fingerprint(value, source: str = "model fingerprint") -> str:
    """`value` if it is a model fingerprint (64 lower-case hex digits), else ModelLoadError.
    Fingerprints become path parts (the model store, PE stores): one from a task header or a
    manifest must not name `../` or an absolute path."""
    if not isinstance(value, str) or len(value) != FINGERPRINT_HEX_DIGITS or value.strip("0123456789abcdef"):
        raise ModelLoadError(
            f"{source} {str(value)[:80]!r} is not a model fingerprint ({FINGERPRINT_HEX_DIGITS} lower-case hex digits)"
        )
    return value


def fingerprint(model) -> str:
    h = hashlib.sha256()
    h.update(b"sparkgnn-model-fingerprint-v1\0")
    h.update(canonical_json(model.spec))
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def save_model(model, path, unique_weights: bool = False) -> None:
    """weights, then model.json (the commit record). `unique_weights`: name the weights file after
    its checksum (`weights-<sha256[:16]>.pt`) instead of weights.pt, so that two processes saving
    the same model into one object-store directory at once (no rename there) can never leave a
    model.json naming the other's weights (torch.save's bytes differ between saves)."""
    path = os.fspath(path)
    files.makedirs(path)
    buf = io.BytesIO()
    torch.save({k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    weights = f"weights-{digest[:16]}.pt" if unique_weights else WEIGHTS
    files.write_bytes_atomic(files.join(path, weights), data)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "spec": model.spec,
        "weights_file": weights,
        "weights_sha256": digest,
        "fingerprint": fingerprint(model),
    }
    files.write_bytes_atomic(files.join(path, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True).encode())


def load_model(cls, path, allow_modules: Sequence[str] = ()):
    """The model saved at `path`. `allow_modules`: packages besides torch_geometric.nn.conv whose
    conv classes a generic layer may name (layers/generic.py): importing one runs its code, so only
    the loader can allow it, never the saved file."""
    path = os.fspath(path).rstrip("/") or "/"
    if path.rpartition("/")[2] == MANIFEST and files.kind(path) == "file":
        path = files.parent(path)
    mpath = files.join(path, MANIFEST)
    try:
        text = files.read_bytes(mpath)
    except FileNotFoundError:
        raise ModelLoadError(f"no saved model at {path}: {MANIFEST} is missing") from None
    try:
        manifest = json.loads(text)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{mpath} is not valid JSON: {e}") from e
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != MANIFEST_FORMAT
        or manifest.get("version") != MANIFEST_VERSION
    ):
        raise ModelLoadError(f"{mpath} is not a {MANIFEST_FORMAT} v{MANIFEST_VERSION} manifest")
    for key in ("spec", "weights_file", "weights_sha256", "fingerprint"):
        if key not in manifest:
            raise ModelLoadError(f"{mpath} lacks {key!r}")
    wname = str(manifest["weights_file"])
    if os.sep in wname or (os.altsep and os.altsep in wname) or wname in ("", ".", ".."):
        raise ModelLoadError(f"{mpath}: weights_file must be a plain file name, got {wname!r}")
    wpath = files.join(path, wname)
    try:
        data = files.read_bytes(wpath)
    except FileNotFoundError:
        raise ModelLoadError(f"weights file {wpath} is missing") from None
    if hashlib.sha256(data).hexdigest() != manifest["weights_sha256"]:
        raise ModelLoadError(
            f"weights file {wpath} does not match the checksum in {mpath} (corrupt or modified after saving)"
        )
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for bad archives
        raise ModelLoadError(f"cannot read weights file {wpath}: {e}") from e
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ModelLoadError(f"weights file {wpath} does not hold a state_dict of tensors")
    try:
        with allowed_modules(allow_modules):
            model = cls(manifest["spec"])
    except Exception as e:
        raise ModelLoadError(f"invalid model spec in {mpath}: {e}") from e
    try:
        model.load_state_dict(state, strict=True)
    except Exception as e:
        raise ModelLoadError(f"weights in {wpath} do not match the spec in {mpath}: {e}") from e
    for conv in model.layers:
        verify = getattr(conv, "verify", None)  # generic layers: the rebuilt conv must reproduce the saved one
        if verify is not None:
            try:
                verify()
            except UnsupportedModelError as e:
                raise ModelLoadError(f"model at {path}: {e}") from e
    if fingerprint(model) != manifest["fingerprint"]:
        raise ModelLoadError(
            f"model loaded from {path} has fingerprint {fingerprint(model)}, "
            f"manifest says {manifest['fingerprint']} (spec edited after saving?)"
        )
    return model
