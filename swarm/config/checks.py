"""Checks across fields: names, repeats, feeds between groups, devices against the catalog, K/V pairs."""

from __future__ import annotations

import difflib
import re

from swarm.config.definition import LIMITS, SwarmConfig, Worker, show
from swarm.errors import ConfigError
from worker.formats import KV_FORMATS

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def _check_name(value: str, path: str) -> None:
    """Names become Ray actor and placement-group names and file names: no spaces, slashes or brackets."""
    if not NAME.fullmatch(value) or value.endswith(".prefix"):
        raise ConfigError(
            path,
            f"{show(value)} is not a usable name",
            "use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit",
        )


def _check_backend(w: Worker, p: str) -> None:
    """What a config alone can tell about a worker's backend (the devices themselves: swarm.planning)."""
    if w.backend == "vulkan" and w.kind == "virtual":
        raise ConfigError(
            f"{p}.backend", "vulkan is set on a virtual worker (a catalog device emulated on this CPU)",
            "use kind: local with backend: vulkan to run on this host's GPU, or drop backend",
        )  # fmt: skip
    if w.kind == "local" and w.backend == "vulkan" and w.device is not None and not isinstance(w.device, int):
        raise ConfigError(
            f"{p}.device", f"{show(w.device)} is not a Vulkan device index",
            "give the index `swarm devices` lists (vulkan:<index>), e.g. device: 0",
        )  # fmt: skip


def cross_check(cfg: SwarmConfig) -> None:
    from swarm.devices import load_catalog

    _check_name(cfg.name, "name")
    for i, g in enumerate(cfg.agents):
        _check_name(g.name, f"agents[{i}].name")
    for i, w in enumerate(cfg.workers):
        _check_name(w.name, f"workers[{i}].name")

    total = sum(g.count for g in cfg.agents)
    if total > LIMITS.max_agents:
        raise ConfigError(
            "agents",
            f"has {total:,} agents in all, more than the limit of {LIMITS.max_agents:,}",
            "use fewer or smaller groups, or split the work over several swarms",
        )
    for key in ("formats", "pairs"):
        values = getattr(cfg.policy, key)
        for i, v in enumerate(values):
            if v in values[:i]:
                raise ConfigError(f"policy.{key}[{i}]", f"{show(v)} repeats", "list each once")
    names = [g.name for g in cfg.agents]
    for i, g in enumerate(cfg.agents):
        if g.name in names[:i]:
            raise ConfigError(f"agents[{i}].name", f"'{g.name}' repeats", "give every group a unique name")
        if g.inputs_from is not None and g.inputs_from not in names:
            raise ConfigError(
                f"agents[{i}].inputs_from",
                f"{show(g.inputs_from)} is not a group",
                f"use one of {', '.join(names[:16])}",
            )
        if g.inputs_from == g.name:
            raise ConfigError(f"agents[{i}].inputs_from", "names the group itself", "feed from another group")
    feeds = {g.name: g.inputs_from for g in cfg.agents}
    for i, g in enumerate(cfg.agents):
        seen, cur = [g.name], g.inputs_from
        while cur is not None:
            if cur in seen:
                raise ConfigError(
                    f"agents[{i}].inputs_from",
                    f"makes a cycle ({' <- '.join(seen + [cur])})",
                    "let at least one group in the chain work from its own tasks",
                )
            seen.append(cur)
            cur = feeds.get(cur)
    catalog = load_catalog()
    wnames = [w.name for w in cfg.workers]
    for i, w in enumerate(cfg.workers):
        p = f"workers[{i}]"
        if w.name in wnames[:i]:
            raise ConfigError(f"{p}.name", f"'{w.name}' repeats", "give every worker a unique name")
        _check_backend(w, p)
        if w.kind == "local" and w.device is not None and w.backend == "cpu":
            raise ConfigError(f"{p}.device", "is set on a local worker", "drop it, or use kind: virtual")
        if w.kind != "local":
            if isinstance(w.device, int):
                raise ConfigError(
                    f"{p}.device", f"{w.device} is a Vulkan device index; a {w.kind} worker names a catalog device",
                    f"name one of {', '.join(catalog)}, or use kind: local with backend: vulkan",
                )  # fmt: skip
            if w.device is None:
                raise ConfigError(f"{p}.device", "is missing", f"name a catalog device: {', '.join(catalog)}")
            if w.device not in catalog:
                close = difflib.get_close_matches(w.device[:64], catalog, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"use one of {', '.join(catalog)}"
                raise ConfigError(f"{p}.device", f"{show(w.device)} is not in configs/devices.yaml", hint)
            if w.memory is not None and w.memory > catalog[w.device].usable_bytes:
                raise ConfigError(
                    f"{p}.memory",
                    f"{w.memory:,} bytes is more than {w.device}'s usable {catalog[w.device].usable_bytes:,}",
                    "lower the cap or pick a bigger device",
                )
    for i, pair in enumerate(cfg.policy.pairs):
        parts = pair.split("/")
        if len(parts) != 2 or any(x not in KV_FORMATS for x in parts):
            raise ConfigError(
                f"policy.pairs[{i}]", f"{show(pair)} is not K/V", f"write e.g. q8_0/f16 from {KV_FORMATS}"
            )
