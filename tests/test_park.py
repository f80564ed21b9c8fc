"""Parking and restoring sessions on a real EngineWorker (worker/park.py, worker/service.py).

Every expected reply is the same worker's (or a fresh worker's) uninterrupted run of the same turns:
greedy decoding, so a restored session must give exactly those tokens, and a refused park file must
fall back to re-prefilling and still give them. Policy decisions use explicit costs (park_costs),
never a live calibration.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.formats import KV_FORMATS
from worker.park import MAGIC, ParkedKV, ParkFileError, ParkStore, file_name
from worker.service import EngineWorker, WorkerSpec

OPS = ("park_ram", "restore_ram", "park_disk", "restore_disk")
# Parking and restoring cost 1 ns a token in RAM, 2 on disk, re-prefilling 1 ms: every parked session is
# restored, and pressure parks to RAM.
RESTORE_WINS: dict[str, Any] = {op: {"fixed_ns": 0, "per_token_ns": 2 if "disk" in op else 1} for op in OPS} | {
    "reprefill": {"fixed_ns": 0, "per_token_ns": 1e6}
}
# Re-prefilling is free: every parked session is re-prefilled (the measured crossover says so).
REPREFILL_WINS: dict[str, Any] = {op: {"fixed_ns": 1e9, "per_token_ns": 1e6} for op in OPS} | {
    "reprefill": {"fixed_ns": 0, "per_token_ns": 0}
}
PROMPT = [(5 + 11 * i) % 257 for i in range(37)]  # odd lengths: a block's tail is partly filled
FOLLOW = [(9 + 7 * i) % 257 for i in range(19)]
NEW = 6  # tokens generated per turn


@pytest.fixture(scope="module")
def tiny(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["F32"]


def spec(model: Path, park: Path, **kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {"name": "w", "kind": "virtual", "device": "x86-host", "model": str(model),
                            "kv_k": "f16", "kv_v": "f16", "kv_budget_bytes": 8 << 20, "threads": 1,
                            "park_dir": str(park), "park_costs": RESTORE_WINS}  # fmt: skip
    return WorkerSpec(**(base | kw))


def run_turn(w: EngineWorker, session: str, turn: int, tokens: list[int], fresh: bool, n: int = NEW) -> list[int]:
    """Submits one greedy turn and waits for its tokens."""
    w.submit(session, turn, tokens, {"max_new_tokens": n}, fresh)
    got: list[int] = []
    deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
    while time.monotonic() < deadline:
        ev = w.drain().get(session)
        if ev:
            got += ev["tokens"]
            if ev["done"]:
                assert ev["reason"] == "max_tokens", ev
                return got
        time.sleep(0.001)
    raise AssertionError(f"turn {turn} of {session} did not finish")


def reference(model: Path, tmp: Path, kv: str, turns: list[list[int]]) -> list[list[int]]:
    """Replies of one session running `turns` uninterrupted on a fresh worker."""
    w = EngineWorker(spec(model, tmp / "ref-park", kv_k=kv, kv_v=kv))
    try:
        return [run_turn(w, "ref", i, t, i == 0) for i, t in enumerate(turns)]
    finally:
        w.stop()


def lc(w: EngineWorker) -> dict[str, Any]:
    return w.state()["lifecycle"]


@pytest.mark.parametrize("kv", KV_FORMATS)
def test_park_and_restore_is_bit_exact(tiny: Path, tmp_path: Path, kv: str) -> None:
    want = reference(tiny, tmp_path, kv, [PROMPT, FOLLOW, [3, 4, 5]])
    w = EngineWorker(spec(tiny, tmp_path / "park", kv_k=kv, kv_v=kv))
    try:
        for name, where in (("s-ram", "ram"), ("s-disk", "disk")):
            assert run_turn(w, name, 0, PROMPT, True) == want[0]
            assert w.park(name, where) == where
            st = w.state()["sessions"][name]
            assert (st["state"], st["where"], st["tokens"]) == ("parked", where, len(PROMPT) + NEW)
            assert w.state()["kv_bytes_reserved"] == 0  # the pool blocks are freed
            assert run_turn(w, name, 1, FOLLOW, False) == want[1]  # restored, then the new tokens
            assert w.park(name, where) == where
            assert run_turn(w, name, 2, [3, 4, 5], False) == want[2]
            w.end(name)
        s = lc(w)
        assert s["restores"] == {"ram": 2, "disk": 2} and s["parks"] == {"ram": 2, "disk": 2}
        assert s["reprefilled_tokens"] == 0 and s["restore_failures"] == 0
        h1, h2 = len(PROMPT) + NEW, len(PROMPT) + NEW + len(FOLLOW) + NEW
        assert s["reprefill_tokens_saved"] == 2 * (h1 + h2)
        assert not list((tmp_path / "park").glob("*.park"))  # end() removed the files
    finally:
        w.stop()


def test_crossover_says_reprefill_and_a_dropped_session_reprefills(tiny: Path, tmp_path: Path) -> None:
    want = reference(tiny, tmp_path, "f16", [PROMPT, FOLLOW])
    w = EngineWorker(spec(tiny, tmp_path / "park", park_costs=REPREFILL_WINS))
    try:
        run_turn(w, "a", 0, PROMPT, True)
        run_turn(w, "b", 0, PROMPT, True)
        w.park("a", "disk")
        w.park("b", "none")  # dropped: only its tokens are kept
        assert w.state()["sessions"]["b"] == {"state": "dropped", "where": "none", "kv_bytes": 0,
                                              "tokens": len(PROMPT) + NEW}  # fmt: skip
        assert run_turn(w, "a", 1, FOLLOW, False) == want[1]
        assert run_turn(w, "b", 1, FOLLOW, False) == want[1]
        s = lc(w)
        assert s["restores"] == {"ram": 0, "disk": 0}
        assert s["reprefilled_tokens"] == 2 * (len(PROMPT) + NEW)
        assert any(d["action"] == "reprefill" and d["session"] == "a" for d in s["decisions"])
    finally:
        w.stop()


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _other_model(path: Path) -> None:
    p = ParkedKV.from_bytes(path.read_bytes(), _digest_of(path))
    path.write_bytes(dataclasses.replace(p, model_digest="0" * 16).to_bytes())


def _bad_magic(path: Path) -> None:
    path.write_bytes(b"NOTAPARK" + path.read_bytes()[8:])


def _digest_of(path: Path) -> str:
    import json

    head = path.read_bytes()
    (hlen,) = struct.unpack_from("<I", head, 12)
    return str(json.loads(head[16 : 16 + hlen])["model_digest"])


DAMAGE = {"flipped": _flip_payload_byte, "truncated": _truncate, "other_model": _other_model, "magic": _bad_magic}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_bad_park_file_falls_back_to_reprefill(tiny: Path, tmp_path: Path, damage: str) -> None:
    want = reference(tiny, tmp_path, "q8_0", [PROMPT, FOLLOW, [7, 8]])
    w = EngineWorker(spec(tiny, tmp_path / "park", kv_k="q8_0", kv_v="q8_0"))
    try:
        got0 = run_turn(w, "s", 0, PROMPT, True)
        w.park("s", "disk")
        (path,) = (tmp_path / "park").glob("*.park")
        DAMAGE[damage](path)
        assert run_turn(w, "s", 1, FOLLOW, False) == want[1]  # the worker's own copy of the tokens
        s = lc(w)
        assert s["restores"]["disk"] == 0 and s["restore_failures"] == 1 and s["park_files_refused"] == 1
        assert s["reprefilled_tokens"] == len(PROMPT) + NEW
        # the same file damaged before a restart: the new worker refuses it (at its index or its restore)
        got1 = want[1]
        w.park("s", "disk")
    finally:
        w.stop()
    DAMAGE[damage](path)
    w2 = EngineWorker(spec(tiny, tmp_path / "park", kv_k="q8_0", kv_v="q8_0"))
    try:
        history = PROMPT + got0 + FOLLOW + got1 + [7, 8]
        assert run_turn(w2, "s", 2, history, True) == want[2]
        s = lc(w2)
        assert s["restores"]["disk"] == 0 and s["park_files_refused"] == 1
        assert not list((tmp_path / "park").glob("*.park"))
    finally:
        w2.stop()


def test_a_restarted_worker_restores_a_disk_parked_session(tiny: Path, tmp_path: Path) -> None:
    want = reference(tiny, tmp_path, "q4_0", [PROMPT, FOLLOW])
    w = EngineWorker(spec(tiny, tmp_path / "park", kv_k="q4_0", kv_v="q4_0"))
    got0 = run_turn(w, "researcher-0", 0, PROMPT, True)
    w.park("researcher-0", "disk")
    w.stop()  # the process's memory is gone; the file stays
    w2 = EngineWorker(spec(tiny, tmp_path / "park", kv_k="q4_0", kv_v="q4_0"))
    try:
        assert w2.state()["sessions"]["researcher-0"]["where"] == "disk"
        assert "parked 1" in repr(w2)
        # the runtime resends a moved or restarted agent's whole history (fresh)
        assert run_turn(w2, "researcher-0", 1, PROMPT + got0 + FOLLOW, True) == want[1]
        s = lc(w2)
        assert s["restores"]["disk"] == 1 and s["reprefill_tokens_saved"] == len(PROMPT) + NEW
        assert s["reprefilled_tokens"] == 0
    finally:
        w2.stop()


def test_the_disk_budget_drops_the_oldest_first(tiny: Path, tmp_path: Path) -> None:
    w = EngineWorker(spec(tiny, tmp_path / "park"))
    try:
        for name in ("a", "b", "c"):
            run_turn(w, name, 0, PROMPT, True)
        w.park("a", "disk")
        one = lc(w)["parked_disk_bytes"]
    finally:
        w.stop()
    # room for two files of this size, not three
    w = EngineWorker(spec(tiny, tmp_path / "park2", park_disk_bytes=2 * one + one // 2))
    try:
        want = None
        for name in ("a", "b", "c"):
            got = run_turn(w, name, 0, PROMPT, True)
            want = want or got
        for name in ("a", "b", "c"):
            assert w.park(name, "disk") == "disk"
        states = {k: (v["state"], v["where"]) for k, v in w.state()["sessions"].items()}
        assert states == {"a": ("dropped", "none"), "b": ("parked", "disk"), "c": ("parked", "disk")}
        files = list((tmp_path / "park2").glob("*.park"))
        assert len(files) == 2 and lc(w)["parked_disk_bytes"] == sum(f.stat().st_size for f in files)
        want1 = run_turn(w, "b", 1, FOLLOW, False)
        assert run_turn(w, "a", 1, FOLLOW, False) == want1  # a re-prefills, b restored: the same tokens
        assert lc(w)["restores"]["disk"] == 1 and lc(w)["reprefilled_tokens"] == len(PROMPT) + NEW
    finally:
        w.stop()


@pytest.mark.parametrize("policy", ["measured", "drop"])
def test_memory_pressure_evicts_idle_sessions(tiny: Path, tmp_path: Path, policy: str) -> None:
    names = ("a-0", "a-1", "a-2")
    # a different first token per session: no KV block is shared between them
    turns = {n: [[k + 1, *PROMPT[1:]], FOLLOW, [3, 4, 5, 6]] for k, n in enumerate(names)}
    want = {n: reference(tiny, tmp_path / n, "f16", t) for n, t in turns.items()}
    # f16, 2 layers x 2 KV heads x 32 dims x 2 bytes x (K, V) = 512 bytes a token, 8 KiB a 16-token block;
    # a session's 3 turns reach 37 + 6 + 19 + 6 + 4 + 6 = 78 tokens = 5 blocks: 6 blocks hold one, not two
    w = EngineWorker(spec(tiny, tmp_path / "park", kv_budget_bytes=6 * 8192, lifecycle=policy))
    try:
        got: dict[str, list[list[int]]] = {n: [] for n in names}
        for i in range(3):
            for n in names:
                got[n].append(run_turn(w, n, i, turns[n][i], i == 0))
        assert got == want
        s = lc(w)
        if policy == "drop":
            assert s["drops"] > 0 and s["parks"] == {"ram": 0, "disk": 0} and s["reprefilled_tokens"] > 0
        else:
            assert s["parks"]["ram"] > 0 and s["restores"]["ram"] > 0 and s["reprefilled_tokens"] == 0
            assert all(d["reason"] for d in s["decisions"])
        assert s["counts"]["idle"] + s["counts"]["parked"] + s["counts"]["dropped"] == 3
    finally:
        w.stop()


def test_ship_between_workers(tiny: Path, tmp_path: Path) -> None:
    want = reference(tiny, tmp_path, "f16", [PROMPT, FOLLOW])
    src = EngineWorker(spec(tiny, tmp_path / "src"))
    dst = EngineWorker(spec(tiny, tmp_path / "dst", name="w2"))
    conv = EngineWorker(spec(tiny, tmp_path / "conv", name="w3", kv_k="q8_0", kv_v="q8_0"))
    try:
        got0 = run_turn(src, "s", 0, PROMPT, True)
        blob = src.export_session("s")
        assert blob is not None and blob.startswith(MAGIC)
        assert src.export_session("nobody") is None
        r = dst.import_session("s", blob)
        assert r["accepted"] and r["where"] == "ram" and r["tokens"] == len(PROMPT) + NEW
        assert dst.state()["sessions"]["s"]["state"] == "parked"
        assert run_turn(dst, "s", 1, PROMPT + got0 + FOLLOW, True) == want[1]
        assert lc(dst)["ships"] == {"in": 1, "out": 0} and lc(dst)["restores"]["ram"] == 1
        assert lc(src)["ships"] == {"in": 0, "out": 1}
        # f16 -> q8_0: the engine converts on restore (the tokens follow the format rule: not compared here)
        r = conv.import_session("s", blob)
        assert r["accepted"] and r["kv_format"] == "f16"
        assert len(run_turn(conv, "s", 1, PROMPT + got0 + FOLLOW, True)) == NEW
        assert lc(conv)["restores"]["ram"] == 1
        # a corrupt blob is refused with a reason; the next turn re-prefills
        bad = conv.import_session("t", blob[:-3])
        assert not bad["accepted"] and "truncated" in bad["reason"]
    finally:
        for w in (src, dst, conv):
            w.stop()


def test_park_file_format(tmp_path: Path) -> None:
    p = ParkedKV("researcher[3]", (1, 2, 300), "q8_0", "f16", "abc", b"\x00snapshot\xff", 1234.5)
    data = p.to_bytes()
    assert data[:8] == MAGIC and struct.unpack_from("<I", data, 8)[0] == 1
    assert ParkedKV.from_bytes(data, "abc") == p
    with pytest.raises(ParkFileError, match="stale"):
        ParkedKV.from_bytes(data, "other")
    with pytest.raises(ParkFileError, match="truncated"):
        ParkedKV.from_bytes(data[:-1], "abc")
    with pytest.raises(ParkFileError, match="checksum"):
        ParkedKV.from_bytes(data[:-1] + b"\x00", "abc")
    with pytest.raises(ParkFileError, match="prefix"):
        ParkedKV.from_bytes(data[:5], "abc")
    assert file_name("researcher[3]").startswith("researcher_3_-") and file_name("a/b") != file_name("a_b")
    store = ParkStore(tmp_path, "abc", ram_bytes=0, disk_bytes=1 << 20, log=lambda _m: None)
    assert store.put(p, "ram") is None  # RAM budget 0: does not fit
    assert store.put(p, "disk") == "disk"
    (tmp_path / ".leftover.park.123.tmp").write_bytes(b"half a file")
    again = ParkStore(tmp_path, "abc", ram_bytes=0, disk_bytes=1 << 20, log=lambda _m: None)
    assert again.index() == ["researcher[3]"] and again.tokens("researcher[3]") == (1, 2, 300)
    assert again.tokens("researcher[3]", trusted=True) is None  # the header is checked only on restore
    assert again.take("researcher[3]") == p
    assert not list(tmp_path.iterdir())  # taken: the file and the leftover are gone


# -- property: any sequence of turns, parks, pressure and restarts gives the uninterrupted tokens -----

STEP = st.tuples(
    st.integers(0, 2),  # session
    st.integers(1, 9),  # new tokens this turn
    st.sampled_from(["none", "ram", "disk", "drop", "restart"]),  # what happens after the turn
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(STEP, min_size=3, max_size=8),
    policy=st.sampled_from(["measured", "drop"]),
    costs=st.sampled_from([RESTORE_WINS, REPREFILL_WINS]),
    ram=st.sampled_from([1 << 30, 1]),  # 1 byte: no snapshot fits in RAM, so pressure parks to disk
)
def test_any_lifecycle_gives_the_uninterrupted_tokens(
    tiny: Path,
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[int, int, str]],
    policy: str,
    costs: dict[str, Any],
    ram: int,
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    names = ["agent-0", "agent-1", "agent-2"]
    turns: dict[str, list[list[int]]] = {n: [] for n in names}
    for k, (who, n_new, _) in enumerate(steps):
        first = not turns[names[who]]
        base = [(3 + 17 * who + i) % 257 for i in range(11)] if first else []
        turns[names[who]].append(base + [(k * 31 + 5 * i + who) % 257 for i in range(n_new)])
    # uninterrupted: one worker per session with room for everything
    want: dict[str, list[list[int]]] = {}
    ref = EngineWorker(spec(tiny, tmp / "ref"))
    try:
        for n in names:
            want[n] = [run_turn(ref, n, i, t, i == 0, n=4) for i, t in enumerate(turns[n])]
            ref.end(n)
    finally:
        ref.stop()
    # the worker under test (a session reaches 11 + 8 * (9 + 4) = 115 tokens = 8 blocks at most, so
    # the budget is 8 blocks of 8 KiB: one long session fills it, so the others are evicted under pressure)
    s = spec(tiny, tmp / "park", kv_budget_bytes=8 * 8192, lifecycle=policy, park_costs=costs, park_ram_bytes=ram)
    w = EngineWorker(s)
    history: dict[str, list[int]] = {n: [] for n in names}
    done = dict.fromkeys(names, 0)
    restarted = set(names)  # sessions whose next turn resends the whole history (first turn, or after a restart)
    try:
        for who, _, then in steps:
            n = names[who]
            i = done[n]
            new = turns[n][i]
            fresh = n in restarted
            got = run_turn(w, n, i, history[n] + new if fresh else new, fresh, n=4)
            assert got == want[n][i], (n, i, steps)
            history[n] += new + got
            done[n] += 1
            restarted.discard(n)
            if then in ("ram", "disk", "drop") and w.state()["sessions"][n]["where"] == "pool":
                w.park(n, "none" if then == "drop" else then)
            elif then == "restart":
                w.stop()
                w = EngineWorker(s)
                restarted = set(names)
        assert sum(done.values()) == len(steps)  # every accepted turn ran to its end
    finally:
        w.stop()


def test_park_calibration_shape_and_cache(tiny: Path, tmp_path: Path) -> None:
    from worker.calibrate_park import OPS as CAL_OPS
    from worker.calibrate_park import ParkCalibrationOptions, calibrate_park
    from worker.lifecycle import ParkCosts

    opts = ParkCalibrationOptions(pairs=(("f16", "f16"), ("q4_0", "q8_0")), threads=1)
    cal = calibrate_park(tiny, opts, work_dir=tmp_path / "work")
    assert cal["source"] == "measured" and set(cal["formats"]) == {"f16", "q4_0/q8_0"}
    for ops in cal["formats"].values():
        assert set(ops) == set(CAL_OPS)
        for v in ops.values():
            lo, hi = v["per_token_ns_interval"]
            assert lo <= v["per_token_ns"] <= hi
            assert len(v["samples"]) == opts.repeats and all(len(r) == len(opts.sizes) for r in v["samples"])
            assert all(ns > 0 for r in v["samples"] for _, ns in r)  # every timed operation took time
        ParkCosts.from_dict(ops)  # the policy reads it as it is
    assert not list((tmp_path / "work").iterdir())  # the timing files are gone
    assert calibrate_park(tiny, opts) == cal  # the second call is the cached entry
    with pytest.raises(ValueError, match="repeats"):
        calibrate_park(tiny, dataclasses.replace(opts, repeats=2))


@pytest.mark.parametrize("family", ["gemma3", "qwen3moe"])
def test_other_families_park_under_pressure(tiny_arch_models: dict[str, Path], tmp_path: Path, family: str) -> None:
    """gemma3: sliding layers (window 32) hold only the window, so a 70-token history parks and restores
    across it; qwen3moe: experts. Two sessions whose budget holds one: each turn evicts the other."""
    model = tiny_arch_models[family]
    names = ("b-0", "b-1")
    turns = {n: [[k + 1, *PROMPT[1:]], FOLLOW, [3, 4, 5, 6]] for k, n in enumerate(names)}
    want = {n: reference(model, tmp_path / n, "f16", t) for n, t in turns.items()}
    probe = EngineWorker(spec(model, tmp_path / "probe"))
    try:
        run_turn(probe, "p", 0, [1, *PROMPT[1:]] + FOLLOW + [3, 4, 5, 6] + [0] * 12, True, n=1)
        one = probe.state()["kv_bytes_reserved"]  # the pool bytes of one session's whole run, after it
        # a step holds up to two more sliding blocks than it keeps (the window before and after the chunk)
        peak = one + 2 * probe.engine.memory()["swa_block_bytes"]
    finally:
        probe.stop()
    w = EngineWorker(spec(model, tmp_path / "park", kv_budget_bytes=peak))
    try:
        got: dict[str, list[list[int]]] = {n: [] for n in names}
        for i in range(3):
            for n in names:
                got[n].append(run_turn(w, n, i, turns[n][i], i == 0))
        assert got == want
        s = lc(w)
        assert s["parks"]["ram"] > 0 and s["restores"]["ram"] > 0 and s["reprefilled_tokens"] == 0
    finally:
        w.stop()


def test_a_smaller_budget_parks_idle_sessions_first(tiny: Path, tmp_path: Path) -> None:
    turns = {n: [[k + 1, *PROMPT[1:]], FOLLOW] for k, n in enumerate(("a", "b"))}
    want = {n: reference(tiny, tmp_path / n, "f16", t) for n, t in turns.items()}
    w = EngineWorker(spec(tiny, tmp_path / "park"))
    try:
        for n, t in turns.items():
            assert run_turn(w, n, 0, t[0], True) == want[n][0]
        reserved = w.state()["kv_bytes_reserved"]  # two sessions of 43 tokens: 3 blocks each
        w.set_budget(reserved // 2)  # room for one: the other is parked, not refused
        s = w.state()
        assert s["kv_budget_bytes"] == reserved // 2 and s["kv_bytes_reserved"] <= reserved // 2
        assert sorted(v["state"] for v in s["sessions"].values()) == ["idle", "parked"]
        w.set_budget(8 << 20)
        for n, t in turns.items():
            assert run_turn(w, n, 1, t[1], False) == want[n][1]
    finally:
        w.stop()


def test_default_model_restores_from_disk_bit_exact(default_model: Path, tmp_path: Path) -> None:
    """The real default model (q8_0 KV): a chat turn, parked to disk, then the next turn equals an uninterrupted run."""
    from worker.engine import load_tokenizer

    tok = load_tokenizer(default_model)
    first = tok.encode_chat([{"role": "user", "content": "Name three colours."}], add_generation_prompt=True)
    follow = tok.encode("<|im_end|>\n<|im_start|>user\nAnd three animals?<|im_end|>\n<|im_start|>assistant\n")
    want = reference(default_model, tmp_path, "q8_0", [first, follow])
    w = EngineWorker(spec(default_model, tmp_path / "park", kv_k="q8_0", kv_v="q8_0", threads=2))
    try:
        assert run_turn(w, "s", 0, first, True) == want[0]
        assert w.park("s", "disk") == "disk"
        assert run_turn(w, "s", 1, follow, False) == want[1]
        assert lc(w)["restores"]["disk"] == 1 and lc(w)["reprefilled_tokens"] == 0
    finally:
        w.stop()


KILLED_WORKER = """
import json, sys, time
sys.path.insert(0, {tests!r})
import test_park as T
from pathlib import Path
w = T.EngineWorker(T.spec(Path({model!r}), Path({park!r}), kv_k="q8_0", kv_v="q8_0"))
got = T.run_turn(w, "s", 0, T.PROMPT, True)
w.park("s", "disk")
print(json.dumps(got), flush=True)
time.sleep(600)  # killed here, the session parked on disk
"""


def test_a_sigkilled_worker_process_leaves_a_restorable_park_file(tiny: Path, tmp_path: Path) -> None:
    import json
    import signal
    import subprocess
    import sys

    want = reference(tiny, tmp_path, "q8_0", [PROMPT, FOLLOW])
    code = KILLED_WORKER.format(tests=str(Path(__file__).parent), model=str(tiny), park=str(tmp_path / "park"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        got0 = json.loads(proc.stdout.readline())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and got0 == want[0]
    w = EngineWorker(spec(tiny, tmp_path / "park", kv_k="q8_0", kv_v="q8_0"))
    try:
        assert run_turn(w, "s", 1, PROMPT + got0 + FOLLOW, True) == want[1]
        assert lc(w)["restores"]["disk"] == 1
    finally:
        w.stop()


def test_a_worker_measures_its_park_costs_once(tiny: Path, tmp_path: Path) -> None:
    w = EngineWorker(spec(tiny, tmp_path / "park", park_costs=None, kv_k="q8_0", kv_v="q8_0"))
    try:
        costs = w.park_costs()
        assert costs is not None and costs["source"] == "measured"
        assert w.state()["lifecycle"]["costs"] == costs and w.park_costs() == costs
    finally:
        w.stop()
    drop = EngineWorker(spec(tiny, tmp_path / "park2", park_costs=None, lifecycle="drop"))
    try:
        assert drop.park_costs() is None  # the baseline never measures
    finally:
        drop.stop()


def run_together(w: EngineWorker, turns: dict[str, tuple[int, list[int], bool]]) -> dict[str, list[int]]:
    """Submits every session's turn at once and waits for all of them."""
    for name, (turn, tokens, fresh) in turns.items():
        w.submit(name, turn, tokens, {"max_new_tokens": NEW}, fresh)
    got: dict[str, list[int]] = {n: [] for n in turns}
    ends: dict[str, str] = {}
    deadline = time.monotonic() + 120  # a hang guard, not a timing assertion
    while len(ends) < len(turns) and time.monotonic() < deadline:
        for name, ev in w.drain().items():
            got[name] += ev["tokens"]
            if ev["done"]:
                ends[name] = ev["reason"]
        time.sleep(0.001)
    assert ends == dict.fromkeys(turns, "max_tokens")
    return got


@pytest.mark.parametrize("policy", ["measured", "drop"])
def test_turns_that_do_not_fit_wait_instead_of_failing(tiny: Path, tmp_path: Path, policy: str) -> None:
    names = ("c-0", "c-1", "c-2")
    turns = {n: [[k + 1, *PROMPT[1:]], FOLLOW] for k, n in enumerate(names)}
    want = {n: reference(tiny, tmp_path / n, "f16", t) for n, t in turns.items()}
    # 8 KiB blocks (f16, see above); a session's two turns reach 37 + 6 + 19 + 6 = 68 tokens = 5 blocks: 6 blocks
    # run one session at a time, so the other turns wait for it (and then evict it) rather than fail
    w = EngineWorker(spec(tiny, tmp_path / "park", kv_budget_bytes=6 * 8192, lifecycle=policy))
    try:
        first = run_together(w, {n: (0, t[0], True) for n, t in turns.items()})
        assert first == {n: want[n][0] for n in names}
        second = run_together(w, {n: (1, t[1], False) for n, t in turns.items()})
        assert second == {n: want[n][1] for n in names}
    finally:
        w.stop()
