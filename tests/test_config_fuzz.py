"""Any document, however wrong, is refused with a ConfigError naming a field path, never anything else."""

from __future__ import annotations

import copy
import os
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.config import load_config, parse_config
from swarm.errors import ConfigError

EXAMPLES = int(os.environ.get("KVSWARM_FUZZ_EXAMPLES", "300"))  # more for a longer hunt
BASE: dict[str, Any] = {
    "name": "fuzz",
    "model": {"path": "default"},
    "agents": [
        {"name": "a", "count": 2, "context": 256, "system_prompt": "hi", "tasks": ["x"], "max_new_tokens": 8,
         "sampling": {"temperature": 0.5, "top_k": 4, "top_p": 0.9, "repetition_penalty": 1.1, "seed": 3},
         "min_quality": {"max_kl": 0.1}},
        {"name": "b", "count": 1, "context": 512, "inputs_from": "a"},
    ],
    "workers": [{"name": "w", "kind": "virtual", "device": "rk3588", "memory": "2GiB", "calibration": "catalog"}],
    "policy": {"formats": ["q8_0", "f16"], "pairs": ["q8_0/f16"], "objective": "throughput"},
    "engine": {"block_tokens": 16, "max_batch_tokens": 256, "threads": 2},
    "output_dir": "runs",
}  # fmt: skip

scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["2GiB", "-1", "1e9", "q4_0", "local", "cluster", "a", "w", "12 MB"])
)  # fmt: skip
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                      max_leaves=12)  # fmt: skip


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["set", "delete", "add"]))
        if action == "set":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(values)
    return doc


def _check(fn: Any) -> None:
    try:
        fn()
    except ConfigError as e:
        assert e.path and str(e).startswith(e.path), str(e)
        assert "To fix:" in str(e)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=mutated())
def test_mutated_configs_raise_only_config_errors(doc: Any) -> None:
    _check(lambda: load_config(doc) if isinstance(doc, dict) else parse_config(yaml.safe_dump(doc)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(doc=values)
def test_arbitrary_documents_raise_only_config_errors(doc: Any) -> None:
    _check(lambda: parse_config(yaml.safe_dump(doc)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(text=st.text(max_size=200))
def test_arbitrary_text_raises_only_config_errors(text: str) -> None:
    _check(lambda: parse_config(text))


def test_the_base_document_is_valid() -> None:
    assert load_config(copy.deepcopy(BASE)).name == "fuzz"
