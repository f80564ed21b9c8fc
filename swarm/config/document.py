"""YAML text -> plain data, within LIMITS: size, depth and alias expansion are bounded while composing."""

from __future__ import annotations

from typing import Any

import yaml

from swarm.config.definition import LIMITS, show
from swarm.errors import ConfigError


class _DocumentTooBig(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document past LIMITS while composing it, before any value is built.

    Each composed node's size after alias expansion is derived from its children's (an alias reuses its
    anchor's numbers), so a billion-laughs document is refused in time linear in its text.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        # {id(node): (nodes, scalar characters, depth)} after alias expansion; a node is in it once composed
        self._size: dict[int, tuple[int, int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor  # type: ignore[no-untyped-call]  # PyYAML's own annotation gap
            target = self.anchors.get(anchor)
            if target is not None and id(target) not in self._size:
                raise _DocumentTooBig(f"alias *{show(anchor, 32)} refers to a node that contains it (a cycle)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > LIMITS.max_depth:
            raise _DocumentTooBig(f"nests deeper than {LIMITS.max_depth} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        assert node is not None  # compose_node returns None only at the end of the stream
        if isinstance(node, yaml.ScalarNode):
            size = (1, len(node.value), 1)
        else:
            kids = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else node.value
            sizes = [self._size[id(k)] for k in kids]
            size = (
                1 + sum(n for n, _, _ in sizes),
                sum(c for _, c, _ in sizes),
                1 + max((d for *_, d in sizes), default=0),
            )
        self._size[id(node)] = size
        n, chars, depth = size
        if depth > LIMITS.max_depth:
            raise _DocumentTooBig(f"nests deeper than {LIMITS.max_depth} levels once its aliases are expanded")
        if n > LIMITS.max_nodes:
            raise _DocumentTooBig(f"has more than {LIMITS.max_nodes:,} values once its aliases are expanded")
        if chars > LIMITS.max_expanded_chars:
            raise _DocumentTooBig(
                f"holds more than {LIMITS.max_expanded_chars:,} characters of text once its aliases are expanded"
            )
        return node


def parse_document(text: str, origin: str = "config") -> Any:
    """YAML text -> plain data, within LIMITS (size, depth, alias expansion); ConfigError otherwise.

    The text is always the document itself: a document that is a string is a string, never a path.
    """
    if not isinstance(text, str):
        raise ConfigError(origin, f"expected YAML text, got {type(text).__name__}", "send the document as text")
    if len(text.encode("utf-8", "surrogatepass")) > LIMITS.max_document_bytes:
        raise ConfigError(
            origin,
            f"is more than {LIMITS.max_document_bytes:,} bytes",
            "shorten it (use agent groups with count rather than listing agents)",
        )
    loader = None
    try:
        loader = _BoundedLoader(text)  # the reader checks the characters here
        return loader.get_single_data()
    except _DocumentTooBig as e:
        raise ConfigError(origin, str(e), "write the values out with fewer aliases and less nesting") from e
    except yaml.YAMLError as e:
        raise ConfigError(origin, f"is not valid YAML ({show(str(e), 300)})", "fix the YAML syntax") from e
    except (ValueError, OverflowError, TypeError, RecursionError) as e:  # int('9' x 5000), 2001-13-45
        raise ConfigError(origin, f"holds a value YAML cannot build ({show(str(e), 200)})", "quote it") from e
    finally:
        if loader is not None:
            loader.dispose()
