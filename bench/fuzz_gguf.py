"""Coverage-guided fuzzing of the GGUF readers with atheris (libFuzzer for Python).

Every input is written to a file (model files are read from disk) and given
to the pure-Python header reader (`swarm.gguf_header.read_geometry`, which the
planner uses, instrumented for coverage) and the native reader
(`worker._native.read_gguf`). The only acceptable outcomes are a result or
the readers' documented errors; any other exception, a crash or a hang is a
finding (libFuzzer writes the input to crash-*/timeout-*).

    .venv/bin/python bench/fuzz_gguf.py -max_total_time=600 /tmp/gguf-corpus   # a longer hunt
    tests/test_fuzz_gguf.py runs it for a few thousand inputs in CI

Seeds (written to the corpus directory when it is empty): tiny generated
models of every weight type and the first 256 KiB of the default model.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import atheris

from swarm import gguf_header
from swarm.errors import ModelFileError
from worker import _native

NATIVE_ERRORS = (RuntimeError, ValueError, KeyError, MemoryError, OSError)
SCRATCH = Path(os.environ.get("KVSWARM_FUZZ_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()))
PATH = str(SCRATCH / f"kvswarm-fuzz-{os.getpid()}.gguf")


def one_input(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)
    with contextlib.suppress(ModelFileError):
        gguf_header.read_geometry(PATH)
    with contextlib.suppress(*NATIVE_ERRORS):
        _native.read_gguf(PATH)


def seed(corpus: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import refmodel

    from worker.models import default_model_path

    corpus.mkdir(parents=True, exist_ok=True)
    if any(corpus.iterdir()):
        return
    for wt in refmodel.WEIGHT_TYPES:
        refmodel.write_tiny_llama(corpus / f"tiny_{wt}.gguf", weight_type=wt, n_layer=1, seed=5)
    with open(default_model_path(), "rb") as f:
        (corpus / "default_head.gguf").write_bytes(f.read(256 << 10))


def main() -> None:
    dirs = [a for a in sys.argv[1:] if not a.startswith("-")]
    for d in dirs[:1]:
        seed(Path(d))
    try:
        atheris.instrument_func(gguf_header.read_geometry)
        for name in dir(gguf_header._Reader):
            fn = getattr(gguf_header._Reader, name)
            if callable(fn) and getattr(fn, "__module__", "") == gguf_header.__name__:
                atheris.instrument_func(fn)
        atheris.Setup(sys.argv, one_input)
        atheris.Fuzz()
    finally:
        if os.path.exists(PATH):
            os.unlink(PATH)


if __name__ == "__main__":
    main()
