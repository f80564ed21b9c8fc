"""Planned moves ship KV: a drained worker's idle agents go to the other worker with their KV through Ray's object
store, and the destination restores it instead of re-prefilling; the resumed tokens equal an uninterrupted run's.
Across formats (f16 -> q8_0) the destination converts on arrival. A ship that cannot happen falls back to
re-prefill. Real local Ray, real engines on the default model, a real gRPC server on loopback.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

os.environ["RAY_AUTH_MODE"] = "disabled"

grpc = pytest.importorskip("grpc")

from swarm_harness import SYSTEM, WAIT_S, finish, two_worker_config, until  # noqa: E402 (tests/)

from swarm import scheduler  # noqa: E402
from swarm.client import SwarmClient  # noqa: E402
from swarm.server import serve  # noqa: E402
from worker.service import WorkerSpec  # noqa: E402

TOKEN = "ship-token"
ASK = [("user", "Name three colors.")]
AGAIN = [("user", "Now name three animals.")]
MAX_NEW = 12
CONFIG = two_worker_config("shp", MAX_NEW)


@pytest.fixture(scope="module")
def conn():  # type: ignore[no-untyped-def]
    c = scheduler.connect(None, kv_bytes=8 * 10**9)
    yield c
    scheduler.disconnect(c)


def _turn(c: SwarmClient, agents: list[str], messages: list[tuple[str, str]]) -> dict[str, list[int]]:
    """One job per agent, submitted together; their tokens once every one is done."""
    jobs = {a: c.submit("shp", agent=a, messages=messages, max_tokens=MAX_NEW)[0] for a in agents}
    out = {}
    for a, j in jobs.items():
        toks, end = finish(c, j.id)
        assert end.state == "done", end
        out[a] = toks
    return out


def _sessions(c: SwarmClient) -> dict[str, tuple[str, Any]]:
    """{agent: (worker, SessionState)} from GetPlacement."""
    return {s.agent: (w.worker, s) for w in c.placement("shp").workers for s in w.sessions}


def test_a_drain_ships_idle_agents_kv_and_the_destination_restores_it(conn: scheduler.Connection,
                                                                     tmp_path: Path) -> None:  # fmt: skip
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(CONFIG)
            agents = ["helper-0", "helper-1"]
            first = _turn(c, agents, ASK)
            assert first["helper-0"] == first["helper-1"]  # the same conversation, greedy
            # GetPlacement over gRPC: each agent's session idle between turns, its KV in its worker's pool
            idle = until(lambda: (s := _sessions(c)) and all(a in s and s[a][1].state == "idle" for a in agents)
                          and s, "both sessions idle")  # fmt: skip
            on = {a: idle[a][0] for a in agents}
            assert sorted(on.values()) == ["a", "b"], on  # one agent per worker
            for a in agents:
                st = idle[a][1]
                assert (st.where, st.tokens > 0, st.kv_bytes > 0) == ("pool", True, True), st
            p = c.placement("shp")
            for w in p.workers:
                assert w.lifecycle.policy == "measured" and w.lifecycle.idle == 1 and w.lifecycle.active == 0, w
                assert w.lifecycle.idle_bytes == next(s.kv_bytes for s in w.sessions), w
            moved = next(a for a in agents if on[a] == "a")
            stays = next(a for a in agents if on[a] == "b")
            history = idle[moved][1].tokens

            run = srv.hub.swarm("shp")
            run.drain("a")  # a planned move: every agent goes to b, with its KV
            shipped = [e for e in run.events if e["event"] == "shipped"]
            assert [(e["agent"], e["src"], e["dst"]) for e in shipped] == [(moved, "a", "b")], run.events[-6:]
            assert shipped[0]["bytes"] > 0 and shipped[0]["tokens"] == history
            assert not [e for e in run.events if e["event"] == "ship_failed"]
            after = _sessions(c)
            assert after[moved][0] == "b" and after[moved][1].state == "parked" and after[moved][1].where == "ram"
            assert [w.worker for w in c.placement("shp").workers] == ["b"]

            second = _turn(c, agents, AGAIN)
            # the moved agent resumed from its shipped KV: the same tokens as the one that never moved
            assert second[moved] == second[stays]
            life = next(w.lifecycle for w in c.placement("shp").workers if w.worker == "b")
            assert life.ships_in == 1 and life.restores == 1, life  # the moved agent; the other stayed resident
            assert life.reprefill_tokens == 0, life  # nothing of the moved agent's history was computed again
            assert life.reprefill_tokens_saved >= history, life
            moves = run.kv_moves()
            assert moves["moves"] == 1 and moves["shipped"] == 1 and moves["ship_failed"] == 0, moves
            assert moves["shipped_tokens"] == history and moves["reprefilled_after_moves_tokens"] == 0, moves
    finally:
        srv.stop()


def test_a_ship_the_destination_refuses_falls_back_to_re_prefill_and_no_job_is_lost(conn: scheduler.Connection,
                                                                                   tmp_path: Path) -> None:  # fmt: skip
    # park tiers of one byte: the destination has nowhere to keep a shipped snapshot, so it refuses it
    tiny = CONFIG.replace("name: shp", "name: shq") + "lifecycle:\n  park_ram_bytes: 1\n  park_disk_bytes: 1\n"
    srv = serve(conn=conn, port=0, token=TOKEN, out_root=tmp_path, echo=lambda m: None)
    try:
        with SwarmClient(srv.target, token=TOKEN) as c:
            c.launch(tiny)
            agents = ["helper-0", "helper-1"]
            jobs = {a: c.submit("shq", agent=a, messages=ASK, max_tokens=MAX_NEW)[0] for a in agents}
            first = {a: finish(c, j.id)[0] for a, j in jobs.items()}
            assert first["helper-0"] == first["helper-1"]
            run = srv.hub.swarm("shq")
            until(lambda: all(a.turn is None for a in run.agents.values()), "both turns to end")
            on = {a: run.agents[a].worker for a in agents}
            moved = next(a for a in agents if on[a] == "a")
            history = len(run.agents[moved].history)
            run.drain("a")
            failed = [e for e in run.events if e["event"] == "ship_failed"]
            assert [(e["agent"], e["src"], e["dst"]) for e in failed] == [(moved, "a", "b")], run.events[-6:]
            assert "fit neither" in failed[0]["why"] and "re-prefills" in failed[0]["why"], failed
            assert not [e for e in run.events if e["event"] == "shipped"]
            jobs = {a: c.submit("shq", agent=a, messages=AGAIN, max_tokens=MAX_NEW)[0] for a in agents}
            ends = {a: finish(c, j.id) for a, j in jobs.items()}
            assert all(end.state == "done" for _, end in ends.values()), ends
            # re-prefilled from its history on b: the same tokens as the agent that never moved
            assert ends["helper-0"][0] == ends["helper-1"][0]
            states = run.sched.states()
            assert states["b"]["lifecycle"]["ships"]["in"] == 0  # type: ignore[index]
            moves = run.kv_moves()
            assert (moves["shipped"], moves["ship_failed"], moves["moves"]) == (0, 1, 1), moves
            assert moves["reprefilled_after_moves_tokens"] == history, moves  # its whole history at the move
    finally:
        srv.stop()


# -- the ship itself, worker to worker (with and without a format change) --------------------------------


def _spec(name: str, fmt: str) -> tuple[WorkerSpec, int]:
    spec = WorkerSpec(name=name, kind="virtual", device="x86-host", model="default", kv_k=fmt, kv_v=fmt,
                      kv_budget_bytes=64 << 20, threads=1, swarm="shipfmt")  # fmt: skip
    return spec, 400 << 20


def _run_turn(sched: scheduler.Scheduler, w: str, session: str, turn: int, tokens: list[int], fresh: bool,
              stops: tuple[int, ...]) -> list[int]:  # fmt: skip
    sched.submit(w, session, turn, tokens, {"temperature": 0.0, "max_new_tokens": MAX_NEW, "stop_tokens": stops},
                 fresh)  # fmt: skip
    out: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ev = sched.drain_all()[w]
        assert not isinstance(ev, Exception), ev
        if session in ev:
            assert ev[session]["turn"] == turn and ev[session]["reason"] != "error", ev[session]
            out += ev[session]["tokens"]
            if ev[session]["done"]:
                return out
        time.sleep(0.05)
    raise AssertionError(f"turn {turn} of {session} on {w} did not finish")


@pytest.mark.parametrize(("src_fmt", "dst_fmt"), [("q8_0", "q8_0"), ("f16", "q8_0")])
def test_a_session_shipped_between_workers_resumes_as_an_uninterrupted_run(
    conn: scheduler.Connection, src_fmt: str, dst_fmt: str
) -> None:
    from worker.engine import load_tokenizer
    from worker.models import default_model_path

    tok = load_tokenizer(default_model_path())
    stops = tuple(sorted(tok.eot_ids))
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK[0][1]}]
    prompt = tok.encode_chat(msgs, add_generation_prompt=True)
    sched = scheduler.Scheduler(f"shipfmt-{src_fmt}", conn)
    try:
        sched.start_workers([_spec("src", src_fmt), _spec("dst", dst_fmt), _spec("ref", dst_fmt)])
        reply = _run_turn(sched, "src", "s", 0, prompt, True, stops)
        more = tok.encode("\nNow name three animals.", add_bos=False)
        history = prompt + reply

        export = sched.export_ref("src", "s")
        assert sched.wait_exports([export]) == {export}
        got = sched.ship("dst", "s", export)
        assert got["imported"] is True and got["bytes"] > 0, got
        resumed = _run_turn(sched, "dst", "s", 1, history + more, True, stops)

        # The reference: the same history re-prefilled in the destination's format (a fresh run there).
        # Same format: the shipped rows are the pool's own bytes, so this is the uninterrupted run bit for bit.
        # f16 -> q8_0: the destination quantizes the f16 rows with its own q8_0 code; the rule (docs/
        # RELIABILITY.md) is that greedy tokens equal a fresh run in the destination format.
        want = _run_turn(sched, "ref", "s", 1, history + more, True, stops)
        assert resumed == want
        states = sched.states()
        life = states["dst"]["lifecycle"]  # type: ignore[index]
        assert life["ships"]["in"] == 1 and life["reprefilled_tokens"] == 0, life
        ref_life = states["ref"]["lifecycle"]  # type: ignore[index]
        assert ref_life["ships"]["in"] == 0
        if src_fmt == dst_fmt:  # once: the lifecycle numbers on Ray's Prometheus endpoint
            want = {("dst", "kvswarm_ships_in"): 1, ("dst", "kvswarm_restores"): 1, ("src", "kvswarm_ships_out"): 1}
            metrics = _metrics(sched, "dst", want)
            assert _value(metrics, "kvswarm_ships_in", "dst") == 1 and _value(metrics, "kvswarm_restores", "dst") == 1
            assert _value(metrics, "kvswarm_ships_out", "src") == 1
            assert _value(metrics, "kvswarm_reprefill_tokens_saved", "dst") >= len(history)
            assert _value(metrics, "kvswarm_kv_parked_bytes", "dst", 'tier="ram"') == 0  # restored: in the pool
            assert _value(metrics, "kvswarm_kv_idle_bytes", "dst") > 0
    finally:
        sched.shutdown()


def _metric_lines(text: str, name: str, worker: str, extra: str = "") -> list[str]:
    """Prometheus sample lines of metric `name` (Ray may prefix "ray_", a counter may end "_total") for a worker."""
    pattern = re.compile(rf"(ray_)?{name}(_total)?")
    return [ln for ln in text.splitlines() if not ln.startswith("#") and pattern.fullmatch(ln.split("{")[0])
            and f'worker="{worker}"' in ln and extra in ln]  # fmt: skip


def _value(text: str, name: str, worker: str, extra: str = "") -> float:
    lines = _metric_lines(text, name, worker, extra)
    assert len(lines) == 1, (name, worker, lines)
    return float(lines[0].rsplit(" ", 1)[1])


def _metrics(sched: scheduler.Scheduler, worker: str, want: dict[tuple[str, str], float]) -> str:
    """The worker's node's /metrics once every wanted (worker, counter) reached its value (Ray exports every few
    seconds)."""
    import urllib.request

    import ray

    node = sched.workers[worker].node_id
    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["NodeID"] == node)
    deadline, text = time.monotonic() + 90, ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        lines = {k: _metric_lines(text, k[1], k[0]) for k in want}
        if all(ls and float(ls[0].rsplit(" ", 1)[1]) >= want[k] for k, ls in lines.items()):
            return text
        time.sleep(2)
    raise AssertionError(f"the lifecycle metrics of {worker} never reached {want} on /metrics")


def test_a_ship_with_nothing_to_ship_says_so_and_the_next_turn_re_prefills(conn: scheduler.Connection) -> None:
    from worker.engine import load_tokenizer
    from worker.models import default_model_path

    tok = load_tokenizer(default_model_path())
    stops = tuple(sorted(tok.eot_ids))
    prompt = tok.encode_chat([{"role": "user", "content": ASK[0][1]}], add_generation_prompt=True)
    sched = scheduler.Scheduler("shipnone", conn)
    try:
        sched.start_workers([_spec("src", "q8_0"), _spec("dst", "q8_0")])
        export = sched.export_ref("src", "never-ran")  # the source holds no such session
        assert sched.wait_exports([export]) == {export}
        got = sched.ship("dst", "never-ran", export)
        assert got["imported"] is False and "no KV" in got["why"], got
        a = _run_turn(sched, "dst", "never-ran", 0, prompt, True, stops)
        b = _run_turn(sched, "src", "other", 0, prompt, True, stops)
        assert a == b and a
    finally:
        sched.shutdown()
