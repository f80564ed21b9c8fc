"""Python face of the native engine: sequences, steps, text generation.

This module (with the rest of `worker/`) is the only place that imports the
compiled `worker._native` module. The pure vocabulary it speaks lives in the
dependency-free floor beside it: `worker.formats` (KV formats, pair names),
`worker.sampling` (`Sampling`), `worker.settings` (`EngineSettings`, the
defaults below) and `worker.stops` (the stop-string filter).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from worker import _native
from worker.formats import KV_FORMATS
from worker.models import resolve_model
from worker.sampling import Sampling
from worker.settings import DEFAULT_ENGINE
from worker.stops import StopFilter
from worker.tokenizer import Tokenizer

KvBudgetError = _native.KvBudgetError


def native_sampling(s: Sampling) -> Any:
    """The engine's SamplingParams for a Sampling: the same fields, by name (tests/test_formats.py)."""
    values = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    values["stop_tokens"] = list(s.stop_tokens)
    return _native.SamplingParams(**values)


@dataclass
class Completion:
    """The result of one `Engine.generate` call."""

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop_token", "stop_string", "max_tokens", "context", "kv_budget"
    prefill_s: float
    decode_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tokens_per_s(self) -> float:
        # The first token comes out of the prefill; the rest are decode steps.
        n = len(self.token_ids) - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0


class Engine:
    """One model, one paged KV pool, many sequences.

    float_activations=True multiplies quantized weights in float32 instead of with
    8-bit activation blocks: slower, free of activation rounding (for measuring
    what a KV format alone costs).

    prefix_sharing=True (the default) lets a new sequence hold the full KV blocks
    another live sequence computed for the same first tokens (a shared system
    prompt is stored once); outputs are the same either way.

    backend="vulkan" (with device=N, an index of `swarm devices`) runs the forward on a GPU
    through Vulkan: weights, activations and the KV pool's bytes live on the device, sampling
    stays on the host; the KV budget and memory() accounting are the CPU pool's. "cpu-ops" runs
    that same forward over the CPU backend's ops (the device path's reference; slow).

    huge_pages=True (the default) lets the CPU backend copy the model's bytes into transparent
    huge pages where the host offers them and the copy fits in half the available memory
    (memory()["weights_huge_pages"] says whether it did); a decode step streams every weight,
    and 4 KB pages slow that stream. The copy's matrices of the types the kernels have a tile body for
    (memory()["weight_tile_types"], GGML type ids: Q4_0 / Q4_1 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K on
    AVX2 and AVX-512) are packed as 16-row tiles (memory()["weight_tile_bytes"]).
    False keeps the file mapped, its pages shared with other processes that map the same file,
    and the rows. Outputs are the same either way.

    Low-level: `add_sequence`, `append`, `step`, `finish`, `free`, `score`, `memory`.
    High-level: `generate` / `stream` for one prompt (text or token ids).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        kv_k: str = "f16",
        kv_v: str = "f16",
        kv_budget_bytes: int = 0,
        threads: int = DEFAULT_ENGINE.threads,
        block_tokens: int = DEFAULT_ENGINE.block_tokens,
        max_batch_tokens: int = DEFAULT_ENGINE.max_batch_tokens,
        isa: str = "",
        float_activations: bool = False,
        prefix_sharing: bool = True,
        backend: str = "cpu",
        device: int = 0,
        huge_pages: bool = True,
    ) -> None:
        for name, fmt in (("kv_k", kv_k), ("kv_v", kv_v)):
            if fmt not in KV_FORMATS:
                raise ValueError(f"{name}: unknown KV format '{fmt}'. To fix: use one of {', '.join(KV_FORMATS)}")
        if kv_budget_bytes < 0:
            raise ValueError("kv_budget_bytes must be >= 0 (0 means no budget)")
        self.model_path = resolve_model(model)
        self.kv_k, self.kv_v = kv_k, kv_v
        self._native = _native.Engine(
            str(self.model_path),
            kv_k=kv_k,
            kv_v=kv_v,
            kv_budget_bytes=kv_budget_bytes,
            threads=threads,
            block_tokens=block_tokens,
            max_batch_tokens=max_batch_tokens,
            isa=isa,
            float_activations=float_activations,
            prefix_sharing=prefix_sharing,
            backend=backend,
            device=device,
            huge_pages=huge_pages,
        )
        self.config: dict[str, Any] = dict(self._native.config)
        self._tokenizer: Tokenizer | None = None

    # -- model facts ---------------------------------------------------------
    @property
    def isa(self) -> str:
        return str(self._native.isa)

    @property
    def backend(self) -> str:
        """Where the forward runs: "cpu", "cpu-ops" or "vulkan:<device name>"."""
        return str(self._native.backend)

    @property
    def dot_path(self) -> str:
        """How quantized weights are multiplied: "integer dot" (activations quantized to 8-bit blocks, as the CPU
        engine does; a Vulkan device with shaderIntegerDotProduct) or "float" (float_activations, a device
        without integer dots, or KVSWARM_VULKAN_INTDOT=0)."""
        return str(self._native.dot_path)

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            meta = _native.read_gguf(str(self.model_path))["metadata"]
            self._tokenizer = Tokenizer.from_gguf_metadata(meta)
        return self._tokenizer

    # -- low level -----------------------------------------------------------
    def add_sequence(self, tokens: Sequence[int], sampling: Sampling | None = None, generate: bool = True) -> int:
        return int(self._native.add_sequence(list(tokens), native_sampling(sampling or Sampling()), generate))

    def append(
        self, seq_id: int, tokens: Sequence[int], sampling: Sampling | None = None, generate: bool = True
    ) -> None:
        self._native.append(seq_id, list(tokens), native_sampling(sampling or Sampling()), generate)

    def step(self) -> dict[int, int]:
        """Advance every active sequence by one token: {sequence id: sampled token}."""
        return dict(self._native.step())

    def busy(self) -> bool:
        return bool(self._native.busy())

    def finish(self, seq_id: int) -> None:
        self._native.finish(seq_id)

    def set_token_mask(self, seq_id: int, bits: Sequence[int] | np.ndarray) -> None:
        """Constrains the sequence's next samples to the allowed tokens: bit t % 32 of word t // 32, as
        (ceil(n_vocab / 32),) unsigned 32-bit words (the layout of llguidance's bitmask). Kept until replaced."""
        words = np.asarray(bits).astype(np.uint32, copy=False).ravel()
        self._native.set_token_mask(seq_id, words.tolist())

    def clear_token_mask(self, seq_id: int) -> None:
        self._native.clear_token_mask(seq_id)

    def free(self, seq_id: int) -> None:
        self._native.free(seq_id)

    def sequence_ids(self) -> list[int]:
        return [int(i) for i in self._native.sequence_ids()]

    def score(self, seq_id: int, tokens: Sequence[int]) -> np.ndarray:
        """Teacher-forced logits (n, vocab) after each of the sequence's queued tokens and `tokens`."""
        return np.asarray(self._native.score(seq_id, list(tokens)))

    def last_logits(self) -> np.ndarray:
        """The last forward's logits (R, vocab): after `step`, one row per sequence it returned, in order."""
        return np.asarray(self._native.last_logits())

    def fill_kv(self, seq_id: int, n: int, seed: int = 0) -> None:
        """Calibration aid: append n synthetic positions with random K/V (no model run)."""
        self._native.fill_kv(seq_id, n, seed)

    # -- KV snapshots (issue 18; the blob format is in native/kv_transfer.h) --
    def export_kv(self, seq_id: int) -> bytes:
        """The sequence's tokens and K/V rows (this pool's formats, position order, checksummed).

        Import it with `import_kv` into an engine of the same model: any block_tokens, any KV format
        (rows are converted on arrival). ValueError for a sequence holding fill_kv's synthetic rows."""
        return bytes(self._native.export_kv(seq_id))

    def kv_export_bytes(self, seq_id: int) -> int:
        """len(export_kv(seq_id)), without building the blob."""
        return int(self._native.kv_export_bytes(seq_id))

    def import_kv(
        self, blob: bytes | bytearray | memoryview, sampling: Sampling | None = None, generate: bool = False
    ) -> int:
        """A new sequence whose KV is the snapshot's; returns its id.

        Tokens without KV are queued for prefill (a lazy tail stays lazy until `append`); with
        generate=True it continues generating as `add_sequence(..., generate=True)` would. ValueError
        for a truncated, corrupt, other-version or other-model blob; KvBudgetError (holding nothing)
        when its blocks do not fit."""
        return int(self._native.import_kv(blob, native_sampling(sampling or Sampling()), generate))

    def set_timers(self, on: bool) -> None:
        """Roofline timers on or off (off costs one branch per part of a step)."""
        self._native.set_timers(on)

    def timers(self, reset: bool = True) -> dict[str, float]:
        """Sums since the last reset: steps, tokens, total_s = weights_s + attention_s + other_s,
        weight_bytes (weight rows streamed) and kv_bytes (K/V rows read). reset: start new sums."""
        return dict(self._native.timers(reset))

    def reset_timers(self) -> None:
        self._native.reset_timers()

    def info(self, seq_id: int) -> dict[str, Any]:
        return dict(self._native.info(seq_id))

    def tokens(self, seq_id: int) -> list[int]:
        return list(self._native.tokens(seq_id))

    def memory(self) -> dict[str, int]:
        return dict(self._native.memory())

    def set_kv_budget(self, budget_bytes: int) -> None:
        """Moves the KV byte budget; KvBudgetError if it is below the blocks in use."""
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0 (0 means no budget)")
        self._native.set_kv_budget(budget_bytes)

    # -- text ----------------------------------------------------------------
    def encode_prompt(self, prompt: str | Sequence[int], *, chat: bool = False, system: str | None = None) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            return self.tokenizer.encode_chat(messages, add_generation_prompt=True)
        return self.tokenizer.encode(prompt)

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stop: Sequence[str] = (),
        chat: bool = False,
        system: str | None = None,
        stop_at_eos: bool = True,
    ) -> Generator[tuple[int, str], None, Completion]:
        """Yields (token id, text piece) as tokens are made; returns the Completion."""
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        prompt_ids = self.encode_prompt(prompt, chat=chat, system=system)
        if not prompt_ids:
            raise ValueError("the prompt is empty. To fix: give at least one token of text")
        base = sampling or Sampling()
        stop_tokens = tuple(base.stop_tokens)
        if stop_at_eos:
            stop_tokens += tuple(sorted(self.tokenizer.eot_ids))
        sp = dataclasses.replace(base, max_new_tokens=max_tokens, stop_tokens=stop_tokens)
        decoder = self.tokenizer.stream_decoder(skip_special=True)
        t0 = time.perf_counter()
        seq = self.add_sequence(prompt_ids, sp, generate=max_tokens > 0)
        out: list[int] = []
        reason = "max_tokens"
        t_first = t0
        output = StopFilter(stop)  # yields only what cannot start a stop string
        try:
            while max_tokens > 0:
                produced = self.step()
                if seq in produced:
                    tok = produced[seq]
                    if not out:
                        t_first = time.perf_counter()
                    out.append(tok)
                    piece = output.push(decoder.push(tok))
                    if output.stopped:
                        if piece:
                            yield tok, piece
                        reason = "stop_string"
                        self.finish(seq)
                        break
                    yield tok, piece
                info = self.info(seq)
                if not info["generating"]:
                    reason = info["finish_reason"] or reason
                    break
            if reason != "stop_string":
                output.end(decoder.flush())
                rest = output.release()
                if rest:
                    yield (out[-1] if out else -1), rest
        finally:
            self.free(seq)
        t_end = time.perf_counter()
        return Completion(
            prompt_ids=prompt_ids,
            token_ids=out,
            text=output.text,
            finish_reason=reason,
            prefill_s=t_first - t0,
            decode_s=t_end - t_first,
        )

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Completion:
        """Generate to completion; same arguments as `stream`."""
        it = self.stream(prompt, **kwargs)
        while True:
            try:
                next(it)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


def isa_levels() -> list[str]:
    return list(_native.isa_levels())


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer stored in a GGUF file's metadata."""
    return Tokenizer.from_gguf_metadata(_native.read_gguf(str(path))["metadata"])


def read_gguf(path: str | Path) -> dict[str, Any]:
    """Parse and validate a GGUF file: version, alignment, metadata, tensor table."""
    return dict(_native.read_gguf(str(path)))
