"""End to end, every supported model file against llama.cpp (llama-cpp-python) on the same file and ids.

Files: the tiny random models of every architecture (tests/tinymodels.py: llama, llama3, qwen2, qwen3,
qwen3moe, gemma3; each as F32, Q8_0 and llama.cpp's Q4_K_M), the real Gemma 3 270M Q4_K_M and the
default model's (SmolLM2-135M Q4_1's) re-quantizations (tests/model_files.py; the Q4_1 file itself is
tests/test_golden.py's). For each file and prompt,
llama.cpp (f32 KV cache, no flash attention) evaluates the prompt in one batch and then greedily
generates N_GEN tokens one at a time, keeping the logits of every step. Our engine (worker.engine.Engine,
the production path: float_activations off, f32 KV so only the weights' arithmetic differs) must:

1. test_logits_match: teacher-forced along llama.cpp's stream, give logits within TOLERANCE[format]
   of llama.cpp's at every step (`logit_spread`: the RMS over the vocabulary of the difference less its
   mean, in units of the std of llama.cpp's logits at that step, so one number serves files whose
   logits differ in scale; a mixture of experts may exceed it at ROUTER_FLIP_SHARE of its steps);
2. test_teacher_forced_argmax: at every step where llama.cpp's top-1 minus top-2 margin is clear
   (`clear_margin`: >= MARGIN = 0.25, or 3 std of the measured noise in a logit gap where that is more),
   have the same argmax;
3. test_greedy_ids: generating freely, produce llama.cpp's ids up to the first step that is not clear
   (after a near-tie either continuation is right, and the streams may part).

Why the noise term in clear_margin: on the 30-layer default model both engines' logits carry rounding
noise of 5-10% of their std (llama.cpp rounds every matrix product's activations to 8 bits; we round
too, differently), i.e. 0.2-0.3 logits per entry, so a gap of 0.25 is a coin toss. Measured: on
smollm2-135m-Q4_K_M, the second prompt, step 7, llama.cpp's margin is 0.99 for token 32 while our engine picks
472; tests/refmodel.py's float64 forward pass on the same file also picks 472 (by 0.18): llama.cpp was
the one 1.2 logits off, and our engine was nearer the float64 logits overall (RMS 0.065 std vs 0.089).

Tolerances. Both engines multiply quantized weights by activations rounded to 8 bits (Q8_0 / Q8_K
blocks), in a different summation order, rounding different intermediate values (attention, norms),
with different exp/tanh approximations; the spread is what that leaves. Measured on this machine with
`python tests/test_models.py` (it prints each file's worst step over the three prompts), load ~10:

    format    measured worst step (file)                         tolerance  reasoning
    F32       0 (five tiny archs), 0.00057 (tiny-gemma3: tanh)   0.002      float32 order only
    Q8_0      0.017-0.036 (tiny; worst tiny-qwen3moe)            0.07       + 8-bit activations
    (Q4_1     0.085 (the default model itself; not a case here: tests/test_golden.py))
    Q4_K_M    0.021-0.038 tiny, 0.074 gemma3-270m, 0.087 smollm2 0.18       Q8_K activations, 30 layers
    Q5_K_M    0.115 smollm2                                      0.23       as Q4_K_M
    Q6_K      0.090 smollm2                                      0.18       as Q4_K_M
    Q3_K_M    0.112 smollm2                                      0.23       as Q4_K_M
    Q2_K      0.106 smollm2                                      0.21       as Q4_K_M
    IQ4_XS    0.082 smollm2                                      0.16       as Q4_K_M
    Q5_0      0.059 smollm2                                      0.12       Q8_0 activations, 30 layers

On the 30-layer files most of the spread is llama.cpp's own: against tests/refmodel.py's float64 pass
on the same file, our logits are nearer (smollm2 Q4_K_M: 0.065 vs llama.cpp's 0.089; Q5_K_M: 0.065 vs
0.086); the two engines' independent roundings add up.

Each tolerance is about twice the worst step measured for the format: it fails any real error (a wrong
scale, a missing bias or norm, a wrong RoPE or window moves the logits by the order of their std, 1.0)
and not arithmetic noise.

Goldens (tests/goldens/models_<name>.json, written by tests/goldens/make_model_goldens.py with llama.cpp
only) record llama.cpp's greedy ids, margins and a digest of its logits for the real files: Gemma 3
270M and the default model's re-quantizations. test_goldens checks that today's llama.cpp still agrees
with them (at clear steps) and that our engine reproduces them. The tiny random files get no goldens:
their bytes depend on NumPy's generator and on llama.cpp's quantizer (for Q4_K_M), their logits on the
machine's float order, and random weights give many near-ties; the live comparison in the same run is
the check that means something for them.
"""

from __future__ import annotations

import functools
import gc
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import model_files  # noqa: E402
import tinymodels  # noqa: E402

from worker.engine import Engine, Sampling  # noqa: E402

MARGIN = 0.25  # logits; the least llama.cpp top-1 minus top-2 margin at which we must agree (see clear_margin)
NOISE_SIGMAS = 3.0  # a step is clear when its margin exceeds 3 std of the engines' difference in a logit gap
N_GEN = 24  # greedy tokens per prompt
# In a mixture of experts a token whose router scores for its k-th and (k+1)-th expert nearly tie goes to
# different experts in the two engines (a discrete choice flipped by rounding), and that step's logits
# differ by O(std): measured on tiny-qwen3moe-Q4_K_M, 1 step in 72 at 0.98 std, 3 more at 0.07-0.09,
# the rest <= 0.06. Of a routed file's steps this share may exceed the tolerance (and their margins are
# excused by clear_margin's noise term); the rest must not.
ROUTER_FLIP_SHARE = 0.1
GOLDENS = Path(__file__).parent / "goldens"

# {format: most RMS(ours - llama.cpp, centered) / std(llama.cpp's logits) at any step} (the table above)
TOLERANCE: dict[str, float] = {
    "F32": 0.002,
    "Q8_0": 0.07,
    "Q4_K_M": 0.18,
    "Q5_K_M": 0.23,
    "Q6_K": 0.18,
    "Q3_K_M": 0.23,
    "Q2_K": 0.21,
    "IQ4_XS": 0.16,
    "Q5_0": 0.12,
}

# Prompts: short, one long enough (with the generated tokens) to pass the tiny Gemma's 32-token window.
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old clockmaker who mended every clock",
)


@dataclass(frozen=True)
class ModelCase:
    """One file to compare: `name` is what a failure shows (file family and format)."""

    name: str  # e.g. "tiny-qwen3-Q8_0", "gemma3-270m-Q4_K_M", "smollm2-135m-IQ4_XS"
    fmt: str  # TOLERANCE key
    path: Callable[[], Path]
    golden: str = ""  # tests/goldens/models_<golden>.json ("" = none)
    routed: bool = False  # a mixture of experts: see ROUTER_FLIP_SHARE


def _tiny(family: str, fmt: str) -> ModelCase:
    path = functools.partial(tinymodels.tiny_model, family, fmt)
    return ModelCase(f"tiny-{family}-{fmt}", fmt, path, routed=tinymodels.TINY_SPECS[family].n_expert > 0)


def _requant(fmt: str) -> ModelCase:
    return ModelCase(
        f"smollm2-135m-{fmt}",
        fmt,
        functools.partial(model_files.requantized_default, fmt),
        golden=f"smollm2_{fmt.lower()}",
    )


CASES: list[ModelCase] = [
    *(_tiny(family, fmt) for family in tinymodels.TINY_SPECS for fmt in ("F32", "Q8_0", "Q4_K_M")),
    ModelCase("gemma3-270m-Q4_K_M", "Q4_K_M", model_files.gemma3_270m, golden="gemma3_270m_q4_k_m"),
    *(_requant(fmt) for fmt in model_files.REQUANT_TYPES),
]


# ---------------------------------------------------------------------------
# llama.cpp's side
# ---------------------------------------------------------------------------

# Everything that affects llama.cpp's numbers (the goldens script uses the same).
LLAMA_KWARGS: dict[str, Any] = {
    "n_ctx": 128,
    "n_batch": 128,
    "n_ubatch": 128,
    "n_threads": 2,
    "n_threads_batch": 2,
    "n_gpu_layers": 0,
    "logits_all": True,
    "flash_attn": False,
    "type_k": 0,  # GGML_TYPE_F32
    "type_v": 0,
    "seed": 0,
    "verbose": False,
}


@dataclass
class Reference:
    """llama.cpp's greedy run of one prompt."""

    prompt: str
    prompt_ids: list[int]
    ids: list[int]  # (N_GEN,) greedy ids
    logits: np.ndarray  # (N_GEN, V) float32: row i is what produced ids[i]
    margins: np.ndarray  # (N_GEN,) top-1 minus top-2 of each row


def llama_cpp_greedy(llm: Any, prompt: str, n_gen: int = N_GEN) -> Reference:
    """Prompt in one batch, then one token per eval; next id = argmax of the logits (no sampler)."""
    prompt_ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)  # BOS only where the vocab adds one
    llm.reset()
    llm.eval(prompt_ids)
    rows = [np.array(llm.scores[len(prompt_ids) - 1], dtype=np.float32)]
    ids = [int(np.argmax(rows[0]))]
    while len(ids) < n_gen:
        llm.eval([ids[-1]])
        rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        ids.append(int(np.argmax(rows[-1])))
    logits = np.stack(rows)
    top2 = np.sort(logits, axis=1)[:, -2:]
    return Reference(prompt, list(prompt_ids), ids, logits, top2[:, 1] - top2[:, 0])


def llama_cpp_references(path: Path) -> list[Reference]:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), **LLAMA_KWARGS)
    try:
        return [llama_cpp_greedy(llm, p) for p in PROMPTS]
    finally:
        llm.close()
        del llm
        gc.collect()


# ---------------------------------------------------------------------------
# Our side
# ---------------------------------------------------------------------------


def our_teacher_forced(engine: Engine, ref: Reference) -> np.ndarray:
    """(N_GEN, V) our logits along llama.cpp's stream."""
    seq = engine.add_sequence([], generate=False)
    try:
        return engine.score(seq, ref.prompt_ids + ref.ids[:-1])[len(ref.prompt_ids) - 1 :]
    finally:
        engine.free(seq)


def our_greedy(engine: Engine, prompt_ids: list[int], n_gen: int = N_GEN) -> list[int]:
    seq = engine.add_sequence(prompt_ids, Sampling(max_new_tokens=n_gen))
    out: list[int] = []
    try:
        while engine.busy():
            out += [t for s, t in engine.step().items() if s == seq]
    finally:
        engine.free(seq)
    return out


def logit_spread(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """(steps,) RMS over the vocabulary of (ours - ref) less its mean, / std of ref's logits, per step.

    The mean is taken out because a constant shift of a step's logits changes no probability (the two
    engines' logits do differ by such shifts, up to ~1 logit on the 30-layer default model); RMS rather
    than max because the max over 50k-260k entries of noise is a tail statistic that grows with the
    vocabulary.
    """
    d = ours.astype(np.float64) - ref.astype(np.float64)
    d -= d.mean(axis=1, keepdims=True)
    return np.sqrt(np.mean(d * d, axis=1)) / np.std(ref.astype(np.float64), axis=1)  # type: ignore[no-any-return]


def clear_margin(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """(steps,) the llama.cpp margin above which our argmax must equal llama.cpp's, per step.

    At least MARGIN; more where the two engines' measured difference at that step makes a gap of MARGIN
    a coin toss: the centered difference has RMS sigma (logits) per entry, a gap between two entries then
    differs by ~sigma*sqrt(2), and we require agreement from NOISE_SIGMAS such standard deviations up.
    test_logits_match bounds sigma by TOLERANCE[format], so this cannot excuse a real error.
    """
    d = ours.astype(np.float64) - ref.astype(np.float64)
    d -= d.mean(axis=1, keepdims=True)
    sigma = np.sqrt(np.mean(d * d, axis=1))
    return np.maximum(MARGIN, NOISE_SIGMAS * np.sqrt(2.0) * sigma)  # type: ignore[no-any-return]


@dataclass
class CaseRun:
    case: ModelCase
    path: Path
    refs: list[Reference]
    engine: Engine
    forced: list[np.ndarray]  # per prompt (N_GEN, V)
    clear: list[np.ndarray]  # per prompt (N_GEN,) clear_margin


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def run(request: pytest.FixtureRequest) -> Iterator[CaseRun]:
    """One file's llama.cpp references and our engine (module scope: pytest runs a file's tests together)."""
    case: ModelCase = request.param
    path = case.path()
    refs = llama_cpp_references(path)
    engine = Engine(path, kv_k="f32", kv_v="f32", threads=2, float_activations=False)
    forced = [our_teacher_forced(engine, r) for r in refs]
    clear = [clear_margin(f, r.logits) for f, r in zip(forced, refs, strict=True)]
    yield CaseRun(case, path, refs, engine, forced, clear)
    del engine, forced, refs
    gc.collect()


def _where(r: CaseRun, ref: Reference) -> str:
    return f"{r.case.name} ({r.path.name}), prompt {ref.prompt!r}"


def test_logits_match(run: CaseRun) -> None:
    tol = TOLERANCE[run.case.fmt]
    allowed = int(ROUTER_FLIP_SHARE * N_GEN * len(run.refs)) if run.case.routed else 0
    over: list[str] = []  # "prompt p step i: spread" for every step beyond the tolerance
    for p, (ref, ours) in enumerate(zip(run.refs, run.forced, strict=True)):
        assert ours.shape == ref.logits.shape, f"{_where(run, ref)}: logits shape {ours.shape} != {ref.logits.shape}"
        assert np.all(np.isfinite(ours)), f"{_where(run, ref)}: non-finite logits"
        spread = logit_spread(ours, ref.logits)
        over += [f"prompt {p} step {i}: {spread[i]:.4f}" for i in range(N_GEN) if spread[i] > tol]
    assert len(over) <= allowed, (
        f"{run.case.name} ({run.path.name}): RMS(ours - llama.cpp, centered) / std above the {run.case.fmt} "
        f"tolerance {tol} at {len(over)} steps (allowed {allowed}): {over}"
    )


def test_teacher_forced_argmax(run: CaseRun) -> None:
    for ref, ours, need in zip(run.refs, run.forced, run.clear, strict=True):
        arg = np.argmax(ours, axis=1)
        wrong = [i for i in range(N_GEN) if ref.margins[i] >= need[i] and arg[i] != ref.ids[i]]
        report = [
            f"step {i:2d} llama.cpp {ref.ids[i]:6d} ours {int(arg[i]):6d} margin {ref.margins[i]:.3f} "
            f"(clear from {need[i]:.3f})"
            for i in wrong
        ]
        assert not wrong, f"{_where(run, ref)}: argmax differs at clear steps {wrong}\n" + "\n".join(report)


def test_greedy_ids(run: CaseRun) -> None:
    for ref, need in zip(run.refs, run.clear, strict=True):
        first_tie = next((i for i in range(N_GEN) if ref.margins[i] < need[i]), N_GEN)
        out = our_greedy(run.engine, ref.prompt_ids)
        assert len(out) == N_GEN, f"{_where(run, ref)}: generated {len(out)} tokens, expected {N_GEN}"
        assert out[:first_tie] == ref.ids[:first_tie], (
            f"{_where(run, ref)}: greedy ids differ before the first near-tie (step {first_tie}); "
            f"first difference at step {next(i for i in range(first_tie) if out[i] != ref.ids[i])}:\n"
            f"ours      {out}\nllama.cpp {ref.ids}"
        )


# ---------------------------------------------------------------------------
# Goldens (real files only; see the module docstring)
# ---------------------------------------------------------------------------


def load_golden(name: str) -> dict[str, Any]:
    return json.loads((GOLDENS / f"models_{name}.json").read_text())  # type: ignore[no-any-return]


def test_goldens(run: CaseRun) -> None:
    if not run.case.golden:
        pytest.skip(f"{run.case.name}: a tiny random file has no golden (see the module docstring)")
    golden = load_golden(run.case.golden)
    if golden["model_sha256"] != model_files.sha256_file(run.path):
        pytest.skip(
            f"{run.case.name}: {run.path.name} is not the file the golden was made from (another llama.cpp "
            f"quantizer?). To fix: rerun tests/goldens/make_model_goldens.py"
        )
    assert [c["prompt"] for c in golden["cases"]] == list(PROMPTS)
    assert golden["settings"]["llama_kwargs"] == LLAMA_KWARGS and golden["settings"]["n_generate"] == N_GEN
    # llama.cpp picks its kernels from the CPU's features: on an AVX-512 host its K-quant streams left these
    # AVX2-made goldens at clear steps (Q6_K's second prompt at step 1, margin 0.70; five files of eight). Where
    # the features differ, today's llama.cpp may leave the golden; our engine is then checked up to where it
    # does, and against today's llama.cpp by the tests above.
    import llama_cpp

    same_kernels = golden["system_info"] == llama_cpp.llama_print_system_info().decode()
    for ref, ours, need, g in zip(run.refs, run.forced, run.clear, golden["cases"], strict=True):
        where = f"{_where(run, ref)} vs golden models_{run.case.golden}.json"
        assert ref.prompt_ids == g["prompt_ids"], f"{where}: llama.cpp's tokenization changed"
        margins = g["top1_minus_top2_logit"]
        # llama.cpp against itself (another machine's float order, another build): MARGIN
        clear = [i for i, m in enumerate(margins) if m >= MARGIN]
        assert len(clear) >= N_GEN // 2, f"{where}: too few clear steps for the check to mean anything"
        live = [i for i in clear if ref.ids[i] != g["generated_ids"][i]]
        if same_kernels:
            assert not live, f"{where}: today's llama.cpp disagrees with the golden at clear steps {live}"
        # our engine: the stream is the golden's only up to the first step today's llama.cpp left it
        same = next((i for i in range(N_GEN) if ref.ids[i] != g["generated_ids"][i]), N_GEN)
        arg = np.argmax(ours, axis=1)
        wrong = [i for i in range(same) if margins[i] >= need[i] and arg[i] != g["generated_ids"][i]]
        assert not wrong, f"{where}: our argmax differs from the golden at clear steps {wrong}"


def test_cases_cover_every_architecture_and_format() -> None:
    archs = {tinymodels.TINY_SPECS[c.name.split("-")[1]].arch for c in CASES if c.name.startswith("tiny-")}
    assert archs == {"llama", "qwen2", "qwen3", "qwen3moe", "gemma3"}
    assert {c.fmt for c in CASES} == set(TOLERANCE)
    assert len({c.name for c in CASES}) == len(CASES)


if __name__ == "__main__":  # measure the spread per file: python tests/test_models.py [NAME-SUBSTRING ...]
    wanted = sys.argv[1:]
    for case in CASES:
        if wanted and not any(w in case.name for w in wanted):
            continue
        try:
            p = case.path()
            refs = llama_cpp_references(p)
            eng = Engine(p, kv_k="f32", kv_v="f32", threads=2)
            worst = 0.0
            agree = []
            for ref in refs:
                ours = our_teacher_forced(eng, ref)
                worst = max(worst, float(np.max(logit_spread(ours, ref.logits))))
                arg = np.argmax(ours, axis=1)
                clear = ref.margins >= clear_margin(ours, ref.logits)
                agree.append(f"{int(np.sum(arg[clear] == np.array(ref.ids)[clear]))}/{int(np.sum(clear))}")
            print(f"{case.name:24s} {case.fmt:7s} worst spread {worst:.5f} std; clear-step argmax agree {agree}")
            del eng
        except Exception as e:  # a measurement run reports every file, failing or not
            print(f"{case.name:24s} {case.fmt:7s} ERROR {type(e).__name__}: {str(e)[:200]}")
