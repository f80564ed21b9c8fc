"""The park store: idle sessions' KV snapshots in host RAM or in files on disk (no compiled module).

A parked session is a `ParkedKV`: the engine's snapshot of its sequence (`Engine.export_kv`, which
carries the KV rows in the pool's own format and the token history) plus, outside it, what the
worker checks before it trusts the snapshot: the model it belongs to, its KV formats and its
tokens. The same bytes (`ParkedKV.to_bytes`) are a park file and a shipped session.

Park file (one per session, `<name>-<hash>.park` in the store's directory, written to a temporary
name and renamed into place, so a killed worker leaves a whole file or none):

    offset  size  field
    0       8     magic b"KVSPARK\\0"
    8       4     version (u32, little-endian), FILE_VERSION
    12      4     header length H (u32)
    16      H     header, UTF-8 JSON: session, model_digest, kv_k, kv_v, n_tokens, payload_bytes,
                  sha256 (hex, of the token and payload bytes), parked_at (unix seconds)
    16+H    4*n   the token ids, int32 little-endian (n = n_tokens)
    ...     P     payload: the engine's snapshot (P = payload_bytes)

A file whose magic, version, header, length, checksum or model digest is wrong is refused with a
log line and removed: its session is re-prefilled from its tokens, never restored from bad bytes.
The disk tier is bounded by `disk_bytes` (the oldest parked file is removed first), the RAM tier
by `ram_bytes` (a snapshot that does not fit is not taken: the policy then tries disk, or drops).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"KVSPARK\x00"
FILE_VERSION = 1
_PREFIX = struct.Struct("<8sII")  # magic, version, header length
# A header is a few hundred bytes; anything past this is not a park file.
MAX_HEADER_BYTES = 1 << 16
SUFFIX = ".park"


class ParkFileError(ValueError):
    """A park file or shipped snapshot that cannot be trusted (corrupt, truncated, stale)."""


@dataclass(frozen=True)
class ParkedKV:
    """One session's snapshot and the facts that say whether it may be restored here."""

    session: str
    tokens: tuple[int, ...]  # the session's whole token history (those without KV included)
    kv_k: str
    kv_v: str
    model_digest: str  # worker.calibrate's identity of the model file
    payload: bytes  # Engine.export_kv's snapshot
    parked_at: float  # unix seconds

    @property
    def nbytes(self) -> int:
        return len(self.payload) + 4 * len(self.tokens)

    def to_bytes(self) -> bytes:
        toks = struct.pack(f"<{len(self.tokens)}i", *self.tokens)
        digest = hashlib.sha256(toks)
        digest.update(self.payload)
        header = json.dumps({"session": self.session, "model_digest": self.model_digest, "kv_k": self.kv_k,
                             "kv_v": self.kv_v, "n_tokens": len(self.tokens), "payload_bytes": len(self.payload),
                             "sha256": digest.hexdigest(), "parked_at": self.parked_at}).encode()  # fmt: skip
        return _PREFIX.pack(MAGIC, FILE_VERSION, len(header)) + header + toks + self.payload

    @staticmethod
    def from_bytes(data: bytes, model_digest: str) -> ParkedKV:
        """Checks every field against the bytes and the expected model; ParkFileError says what is wrong."""
        header, start = _parse_header(data[: _PREFIX.size + MAX_HEADER_BYTES], model_digest)
        n, p = header["n_tokens"], header["payload_bytes"]
        if len(data) != start + 4 * n + p:
            raise ParkFileError(f"truncated or padded: {len(data):,} bytes, the header says {start + 4 * n + p:,}")
        body = memoryview(data)[start:]
        if hashlib.sha256(body).hexdigest() != header["sha256"]:
            raise ParkFileError("checksum mismatch: the tokens or the KV payload are corrupt")
        tokens = struct.unpack(f"<{n}i", body[: 4 * n])
        return ParkedKV(header["session"], tuple(tokens), header["kv_k"], header["kv_v"], header["model_digest"],
                        bytes(body[4 * n :]), float(header["parked_at"]))  # fmt: skip


def _parse_header(head: bytes, model_digest: str) -> tuple[dict[str, Any], int]:
    """(header, offset of the token ids) from a park file's first bytes."""
    if len(head) < _PREFIX.size:
        raise ParkFileError(f"{len(head)} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, version, hlen = _PREFIX.unpack_from(head)
    if magic != MAGIC:
        raise ParkFileError(f"bad magic {magic!r} (not a park file)")
    if version != FILE_VERSION:
        raise ParkFileError(f"park file version {version}, this worker reads version {FILE_VERSION}")
    if hlen > MAX_HEADER_BYTES or _PREFIX.size + hlen > len(head):
        raise ParkFileError(f"header of {hlen} bytes runs past the data")
    try:
        header = json.loads(head[_PREFIX.size : _PREFIX.size + hlen])
        fields: dict[str, type | tuple[type, ...]] = {"session": str, "model_digest": str, "kv_k": str,
                  "kv_v": str, "n_tokens": int, "payload_bytes": int, "sha256": str,
                  "parked_at": (int, float)}  # fmt: skip
        bad = [k for k, t in fields.items() if not isinstance(header.get(k), t)]
    except (ValueError, AttributeError) as e:  # json.JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise ParkFileError(f"unreadable header ({type(e).__name__})") from e
    if bad:
        raise ParkFileError(f"header lacks or mistypes {bad}")
    if header["n_tokens"] < 0 or header["payload_bytes"] < 0:
        raise ParkFileError("negative token count or payload length")
    if header["model_digest"] != model_digest:
        raise ParkFileError(f"stale: parked for model {header['model_digest']}, this worker runs {model_digest}")
    return header, _PREFIX.size + hlen


def file_name(session: str) -> str:
    """A file name for any session name: readable part plus a hash of the whole name (unique, safe)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", session)[:64]
    return f"{safe}-{hashlib.sha256(session.encode()).hexdigest()[:12]}{SUFFIX}"


@dataclass(frozen=True)
class DiskEntry:
    """What the index keeps of a park file: enough to match a turn's tokens without reading the KV."""

    session: str
    path: Path
    tokens: tuple[int, ...]
    kv_k: str
    kv_v: str
    nbytes: int  # the file's size
    parked_at: float
    trusted: bool  # the tokens came from this process's memory (put), not from a header still unchecked (index)


def _log(message: str) -> None:
    print(f"kvswarm: {message}", file=sys.stderr)


class ParkStore:
    """Parked snapshots by session: a RAM tier and a disk tier, each under its byte budget.

    Not thread-safe: the worker calls it under its own lock. A session is in at most one tier.
    """

    def __init__(
        self,
        directory: Path,
        model_digest: str,
        *,
        ram_bytes: int,
        disk_bytes: int,
        log: Callable[[str], None] = _log,
        on_evict: Callable[[str, tuple[int, ...]], None] | None = None,
    ) -> None:
        if ram_bytes < 0 or disk_bytes < 0:
            raise ValueError(f"park budgets must be >= 0, got ram {ram_bytes}, disk {disk_bytes}")
        self.directory = Path(directory)
        self.model_digest = model_digest
        self.ram_budget, self.disk_budget = ram_bytes, disk_bytes
        self.log = log
        self.on_evict = on_evict  # (session, tokens) of a snapshot the disk budget removed
        self.ram: dict[str, ParkedKV] = {}  # insertion order: oldest first
        self.disk: dict[str, DiskEntry] = {}  # oldest first
        self.refused = 0  # files refused (corrupt, truncated, stale) since start

    # -- sizes --------------------------------------------------------------------------
    @property
    def ram_used(self) -> int:
        return sum(p.nbytes for p in self.ram.values())

    @property
    def disk_used(self) -> int:
        return sum(e.nbytes for e in self.disk.values())

    def room(self) -> dict[str, int]:
        """{"ram": bytes free, "disk": bytes free if the oldest files were removed}."""
        return {"ram": self.ram_budget - self.ram_used, "disk": self.disk_budget}

    def where(self, session: str) -> str | None:
        return "ram" if session in self.ram else "disk" if session in self.disk else None

    def tokens(self, session: str, trusted: bool = False) -> tuple[int, ...] | None:
        """The parked session's token history; trusted=True: only tokens already checked (RAM, or a file this
        process wrote), never a header whose checksum is checked only when the file is restored."""
        if session in self.ram:
            return self.ram[session].tokens
        entry = self.disk.get(session)
        return entry.tokens if entry and (entry.trusted or not trusted) else None

    def nbytes(self, session: str) -> int:
        if session in self.ram:
            return self.ram[session].nbytes
        entry = self.disk.get(session)
        return entry.nbytes if entry else 0

    def sessions(self) -> list[str]:
        return [*self.ram, *self.disk]

    # -- writing ------------------------------------------------------------------------
    def put(self, parked: ParkedKV, tier: str) -> str | None:
        """Stores a snapshot in `tier` ("ram" or "disk"); the tier it went to, or None when it does not fit."""
        self.drop(parked.session)
        if tier == "ram":
            if parked.nbytes > self.ram_budget - self.ram_used:
                return None
            self.ram[parked.session] = parked
            return "ram"
        if tier != "disk":
            raise ValueError(f"park tier must be 'ram' or 'disk', got {tier!r}")
        data = parked.to_bytes()
        if len(data) > self.disk_budget:
            return None
        while self.disk and self.disk_used + len(data) > self.disk_budget:
            oldest = next(iter(self.disk.values()))
            self.log(f"park disk budget {self.disk_budget:,} bytes: dropping the oldest parked session "
                     f"{oldest.session!r} ({oldest.nbytes:,} bytes)")  # fmt: skip
            self.drop(oldest.session)
            if self.on_evict is not None:
                self.on_evict(oldest.session, oldest.tokens)
        path = self.directory / file_name(parked.session)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            tmp.replace(path)
        except OSError as e:  # a full or read-only disk: the session is dropped instead
            self.log(f"could not write park file {path} ({type(e).__name__}: {e}); the session will be re-prefilled")
            tmp.unlink(missing_ok=True)
            return None
        self.disk[parked.session] = DiskEntry(parked.session, path, parked.tokens, parked.kv_k, parked.kv_v,
                                              len(data), parked.parked_at, trusted=True)  # fmt: skip
        return "disk"

    def drop(self, session: str) -> None:
        """Forgets a session's snapshot in either tier (removing its file)."""
        self.ram.pop(session, None)
        entry = self.disk.pop(session, None)
        if entry is not None:
            entry.path.unlink(missing_ok=True)

    # -- reading ------------------------------------------------------------------------
    def get(self, session: str) -> ParkedKV | None:
        """The session's snapshot, checked (a disk file is read and verified); None, with a log line and the
        file removed, when it cannot be trusted. The snapshot stays parked."""
        if session in self.ram:
            return self.ram[session]
        entry = self.disk.get(session)
        if entry is None:
            return None
        try:
            parked = ParkedKV.from_bytes(entry.path.read_bytes(), self.model_digest)
            if parked.session != session:
                raise ParkFileError(f"the file is session {parked.session!r}'s")
            return parked
        except (OSError, ParkFileError) as e:
            self._refuse(entry.path, e)
            self.disk.pop(session, None)
            return None

    def take(self, session: str) -> ParkedKV | None:
        """get, then forget the snapshot (it is being restored into the pool)."""
        parked = self.get(session)
        self.drop(session)
        return parked

    def index(self) -> list[str]:
        """Indexes the directory's park files (a restarted worker's parked sessions), oldest first.

        Headers and lengths are checked here; checksums when a file is restored. A file that fails is
        refused (logged, removed); leftover temporary files of a killed write are removed."""
        if not self.directory.is_dir():
            return []
        found: list[DiskEntry] = []
        for path in sorted(self.directory.iterdir()):
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(SUFFIX):
                continue
            try:
                size = path.stat().st_size
                with path.open("rb") as f:
                    head = f.read(_PREFIX.size + MAX_HEADER_BYTES)
                    header, start = _parse_header(head, self.model_digest)
                    n = header["n_tokens"]
                    if size != start + 4 * n + header["payload_bytes"]:
                        raise ParkFileError(f"truncated or padded: {size:,} bytes, the header says "
                                            f"{start + 4 * n + header['payload_bytes']:,}")  # fmt: skip
                    f.seek(start)
                    raw = f.read(4 * n)
                if len(raw) != 4 * n:
                    raise ParkFileError("truncated token ids")
                tokens = struct.unpack(f"<{n}i", raw)
                found.append(DiskEntry(header["session"], path, tuple(tokens), header["kv_k"], header["kv_v"], size,
                                       float(header["parked_at"]), trusted=False))  # fmt: skip
            except (OSError, ParkFileError) as e:
                self._refuse(path, e)
        for entry in sorted(found, key=lambda e: e.parked_at):
            old = self.disk.pop(entry.session, None)
            if old is not None and old.path != entry.path:
                old.path.unlink(missing_ok=True)
            self.disk[entry.session] = entry
        while self.disk and self.disk_used > self.disk_budget:  # a smaller budget than the last run's
            oldest = next(iter(self.disk.values()))
            self.log(f"park disk budget {self.disk_budget:,} bytes: dropping the oldest parked session "
                     f"{oldest.session!r}")  # fmt: skip
            self.drop(oldest.session)
        return list(self.disk)

    def _refuse(self, path: Path, e: BaseException) -> None:
        self.refused += 1
        self.log(f"refusing park file {path.name}: {e}; removed, the session will be re-prefilled")
        path.unlink(missing_ok=True)
