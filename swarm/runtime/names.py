"""Agent names: their sort order and the compact form workers and placement groups are labelled with."""

from __future__ import annotations

from collections.abc import Sequence


def agent_key(name: str) -> tuple[str, int]:
    """'researcher-10' sorts after 'researcher-9': (base, index), index -1 for a name with no index."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def compact_names(names: Sequence[str]) -> str:
    """'researcher-0', 'researcher-1', 'researcher-2', 'critic-0' -> 'researcher[0-2] critic[0]'."""
    parts: list[str] = []
    prev_base: str | None = None
    start, last = -1, -1
    for n in [*names, None]:
        base: str | None = None
        idx = -1
        if n is not None:
            head, _, tail = n.rpartition("-")
            base, idx = (head, int(tail)) if head and tail.isdigit() else (n, -1)
        if base == prev_base and idx >= 0 and idx == last + 1:
            last = idx
            continue
        if prev_base is not None:
            parts.append(prev_base if start < 0 else f"{prev_base}[{start}]" if start == last else
                         f"{prev_base}[{start}-{last}]")  # fmt: skip
        prev_base, start, last = base, idx, idx
    return " ".join(parts)


def expand_names(compact: str) -> list[str]:
    """The inverse of compact_names."""
    out: list[str] = []
    for part in compact.split():
        if part.endswith("]") and "[" in part:
            base, rng = part[:-1].split("[", 1)
            a, _, b = rng.partition("-")
            out += [f"{base}-{i}" for i in range(int(a), int(b or a) + 1)]
        else:
            out.append(part)
    return out
