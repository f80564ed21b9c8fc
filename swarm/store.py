"""Durable state of a kvswarm server: swarms, agents and jobs in SQLite.

An accepted job is written before SubmitJob returns, and a token reaches a
streaming client only after the transaction that records it has committed,
so a restarted server can resume every job from exactly what clients saw.

Writes are append-mostly so a busy swarm stays cheap to record: an agent's
snapshot (its messages, token history and running turn) is written when a
turn starts or ends; in between only the new tokens are appended, as chunks,
to `agent_tokens` and `job_tokens`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from swarm.errors import StoreFull

SCHEMA = """
CREATE TABLE IF NOT EXISTS swarms (
  name TEXT PRIMARY KEY, config TEXT NOT NULL, state TEXT NOT NULL, started REAL NOT NULL, error TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS agents (
  swarm TEXT NOT NULL, name TEXT NOT NULL, snapshot TEXT NOT NULL, PRIMARY KEY (swarm, name)
);
CREATE TABLE IF NOT EXISTS agent_tokens (
  swarm TEXT NOT NULL, agent TEXT NOT NULL, n INTEGER NOT NULL, tokens TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_tokens_by_agent ON agent_tokens (swarm, agent, n);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, swarm TEXT NOT NULL, agent TEXT NOT NULL, request TEXT NOT NULL, state TEXT NOT NULL,
  result TEXT NOT NULL, idempotency_key TEXT NOT NULL, created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (idempotency_key);
CREATE INDEX IF NOT EXISTS jobs_by_swarm ON jobs (swarm);
CREATE TABLE IF NOT EXISTS job_tokens (
  job TEXT NOT NULL, n INTEGER NOT NULL, tokens TEXT NOT NULL, pieces TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS job_tokens_by_job ON job_tokens (job, n);
"""


class Store:
    """One SQLite file (WAL); every method is one transaction and thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """All of `statements` or none. A full disk raises StoreFull; the error raised is always the first one
        (SQLite may have rolled back already: a second ROLLBACK would only say there is no transaction)."""
        if not statements:
            return
        with self._lock:
            try:
                self._db.execute("BEGIN")
                for sql, args in statements:
                    self._db.execute(sql, args)
                self._db.execute("COMMIT")
            except BaseException as e:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):  # the first error is the one to report
                        self._db.execute("ROLLBACK")
                full = self.full_error(e)
                if full is not None:
                    raise full from e
                raise

    def full_error(self, e: BaseException) -> StoreFull | None:
        """StoreFull when `e` says the disk holding the store is full, else None."""
        code = getattr(e, "sqlite_errorcode", None)
        if (isinstance(e, sqlite3.Error) and (code == sqlite3.SQLITE_FULL or "full" in str(e))) or (
            isinstance(e, OSError) and e.errno == errno.ENOSPC
        ):
            return StoreFull(f"the disk under --out ({self.path.parent}) is full ({e}): nothing more can be "
                             "recorded, so new jobs are refused. To fix: free space there; the server resumes "
                             "recording on its own")  # fmt: skip
        return None

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._db.execute(sql, args))

    # -- swarms ---------------------------------------------------------------------------------
    def put_swarm(self, name: str, config: dict[str, Any], state: str, started: float, error: str = "") -> None:
        self._tx([("INSERT OR REPLACE INTO swarms VALUES (?, ?, ?, ?, ?)",
                   (name, json.dumps(config), state, started, error))])  # fmt: skip

    def swarm_state(self, name: str) -> tuple[str, str] | None:
        rows = self._rows("SELECT state, error FROM swarms WHERE name = ?", (name,))
        return (rows[0][0], rows[0][1]) if rows else None

    def set_swarm_state(self, name: str, state: str, error: str = "") -> None:
        self._tx([("UPDATE swarms SET state = ?, error = ? WHERE name = ?", (state, error, name))])

    def swarms(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT name, config, state, started, error FROM swarms ORDER BY started")
        return [{"name": n, "config": json.loads(c), "state": s, "started": t, "error": e} for n, c, s, t, e in rows]

    def forget_swarm(self, name: str) -> None:
        """Drops a swarm's agents (a relaunch under the same name starts fresh); its jobs stay on record."""
        self._tx([("DELETE FROM agents WHERE swarm = ?", (name,)),
                  ("DELETE FROM agent_tokens WHERE swarm = ?", (name,))])  # fmt: skip

    # -- agents ---------------------------------------------------------------------------------
    def agent_statements(self, swarm: str, snapshots: dict[str, dict[str, Any]],
                         chunks: dict[str, list[int]]) -> list[tuple[str, tuple[Any, ...]]]:  # fmt: skip
        out: list[tuple[str, tuple[Any, ...]]] = []
        for name, snap in snapshots.items():  # a snapshot holds the whole history: earlier chunks go
            out.append(("INSERT OR REPLACE INTO agents VALUES (?, ?, ?)", (swarm, name, json.dumps(snap))))
            out.append(("DELETE FROM agent_tokens WHERE swarm = ? AND agent = ?", (swarm, name)))
        for name, toks in chunks.items():
            if toks:
                out.append(("INSERT INTO agent_tokens VALUES (?, ?, (SELECT COUNT(*) FROM agent_tokens WHERE "
                            "swarm = ? AND agent = ?), ?)", (swarm, name, swarm, name, json.dumps(toks))))  # fmt: skip
        return out

    def agents(self, swarm: str) -> dict[str, tuple[dict[str, Any], list[int]]]:
        """name -> (snapshot, tokens appended after it)."""
        out: dict[str, tuple[dict[str, Any], list[int]]] = {}
        for name, snap in self._rows("SELECT name, snapshot FROM agents WHERE swarm = ?", (swarm,)):
            extra: list[int] = []
            for (toks,) in self._rows("SELECT tokens FROM agent_tokens WHERE swarm = ? AND agent = ? ORDER BY n",
                                      (swarm, name)):  # fmt: skip
                extra += json.loads(toks)
            out[name] = (json.loads(snap), extra)
        return out

    # -- jobs -----------------------------------------------------------------------------------
    def add_jobs(self, jobs: list[dict[str, Any]]) -> None:
        self._tx([("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (j["id"], j["swarm"], j["agent"], json.dumps(j["request"]), j["state"], json.dumps(j["result"]),
                    j["idempotency_key"], j["created"])) for j in jobs])  # fmt: skip

    @staticmethod
    def job_statements(
        updates: dict[str, tuple[str, dict[str, Any]]], chunks: dict[str, tuple[list[int], list[str]]]
    ) -> list[tuple[str, tuple[Any, ...]]]:
        out: list[tuple[str, tuple[Any, ...]]] = []
        for job_id, (toks, pieces) in chunks.items():
            if toks:
                n = "(SELECT COUNT(*) FROM job_tokens WHERE job = ?)"
                out.append((f"INSERT INTO job_tokens VALUES (?, {n}, ?, ?)",
                            (job_id, job_id, json.dumps(toks), json.dumps(pieces))))  # fmt: skip
        for job_id, (state, result) in updates.items():
            out.append(("UPDATE jobs SET state = ?, result = ? WHERE id = ?", (state, json.dumps(result), job_id)))
        return out

    def commit(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._tx(statements)

    def jobs(self, swarm: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT id, swarm, agent, request, state, result, idempotency_key, created FROM jobs"
        rows = self._rows(sql + (" WHERE swarm = ?" if swarm else "") + " ORDER BY created", (swarm,) if swarm else ())
        out = []
        for i, s, a, req, st, res, key, created in rows:
            toks: list[int] = []
            pieces: list[str] = []
            for t, p in self._rows("SELECT tokens, pieces FROM job_tokens WHERE job = ? ORDER BY n", (i,)):
                toks += json.loads(t)
                pieces += json.loads(p)
            out.append({"id": i, "swarm": s, "agent": a, "request": json.loads(req), "state": st,
                        "result": json.loads(res), "idempotency_key": key, "created": created,
                        "token_ids": toks, "pieces": pieces})  # fmt: skip
        return out
