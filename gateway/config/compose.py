"""YAML events -> a node tree, with bounds an untrusted file cannot get past.

PyYAML's own composers are unsafe for files we did not write: the pure Python
one recurses once per nesting level (``[[[[...`` a thousand deep is a
``RecursionError``), the libyaml one recurses in C (deep nesting is a segfault),
and both register an anchor before its node is complete, so ``&a [*a]`` is a
node that contains itself. This composer reads the parser's event stream (from
libyaml when PyYAML was built with it: the scanner and parser are the slow part
in pure Python, 5 to 7 times slower) and:

* stops past ``MAX_DEPTH`` levels of nesting;
* stops past ``MAX_VALUES`` values, where an alias counts as many values as
  its node holds (the builder in ``source.py`` walks the node again for each
  alias): a "billion laughs" stops at the alias that crosses the bound, in time
  linear in the file;
* counts the depth an alias reaches the same way;
* makes an anchor visible only once its node is complete, so an alias can never
  point at a node that contains it (``&a [*a]`` is "undefined alias").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import yaml
from yaml.error import Mark

MAX_DEPTH = 64
MAX_VALUES = 100_000

_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = (
    yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader
)


class ComposeLimit(Exception):
    """A bound was crossed at (1-based) ``line`` and ``column``."""

    def __init__(self, message: str, mark: Mark) -> None:
        super().__init__(message)
        self.message = message
        self.line = mark.line + 1
        self.column = mark.column + 1


def _start(event: yaml.Event) -> Mark:
    # libyaml's marks are a class of their own with the same fields
    return cast(Mark, event.start_mark)


def _end(event: yaml.Event) -> Mark:
    return cast(Mark, event.end_mark)


def compose(text: str) -> yaml.Node | None:
    """The single document in ``text`` as a node tree (None when empty).

    Raises ``yaml.YAMLError`` for syntax errors and ``ComposeLimit`` past a bound.
    """
    return _Composer(yaml.parse(text, Loader=_LOADER)).document()


@dataclass(frozen=True, slots=True)
class _Anchored:
    node: yaml.Node
    values: int  # what building it costs
    height: int  # levels below it


class _Composer:
    def __init__(self, events: Iterator[yaml.Event]) -> None:
        self.events = events
        self.anchors: dict[str, _Anchored] = {}
        self.resolver = yaml.resolver.Resolver()
        self.values = 0  # values built so far, an alias counting as all the values of its node
        self.reach = 0  # the deepest level reached so far in the node being composed

    def document(self) -> yaml.Node | None:
        first = self._next()  # StreamStartEvent
        assert isinstance(first, yaml.StreamStartEvent)
        event = self._next()
        if isinstance(event, yaml.StreamEndEvent):
            return None
        assert isinstance(event, yaml.DocumentStartEvent)
        root = self._node(self._next(), 1)
        self._next()  # DocumentEndEvent
        event = self._next()
        if not isinstance(event, yaml.StreamEndEvent):
            raise yaml.composer.ComposerError(
                "expected a single document in the stream",
                root.start_mark,
                "but found another document",
                _start(event),
            )
        return root

    def _next(self) -> yaml.Event:
        return next(self.events)

    def _node(self, event: yaml.Event, depth: int, *, is_key: bool = False) -> yaml.Node:
        if isinstance(event, yaml.AliasEvent):
            return self._alias(event, depth, is_key)
        values_before = self.values
        self._count(1, event, is_key)
        if depth > MAX_DEPTH:
            raise ComposeLimit(f"the document nests deeper than {MAX_DEPTH} levels", _start(event))
        outer_reach, self.reach = self.reach, depth
        node: yaml.Node
        if isinstance(event, yaml.ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = self.resolver.resolve(  # type: ignore[no-untyped-call]
                    yaml.ScalarNode, event.value, event.implicit
                )
            node = yaml.ScalarNode(tag, event.value, _start(event), _end(event), style=event.style)
        elif isinstance(event, yaml.SequenceStartEvent):
            node = self._sequence(event, depth)
        elif isinstance(event, yaml.MappingStartEvent):
            node = self._mapping(event, depth)
        else:  # the parser never sends anything else here
            raise yaml.composer.ComposerError(None, None, f"unexpected {type(event).__name__}", _start(event))
        if event.anchor is not None:
            # registered only now: an alias inside the node itself is "undefined"
            self.anchors[str(event.anchor)] = _Anchored(node, self.values - values_before, self.reach - depth)
        self.reach = max(outer_reach, self.reach)
        return node

    def _alias(self, event: yaml.AliasEvent, depth: int, is_key: bool) -> yaml.Node:
        anchored = self.anchors.get(str(event.anchor))
        if anchored is None:
            raise yaml.composer.ComposerError(None, None, f"found undefined alias {event.anchor!r}", _start(event))
        # the builder walks an alias's node again: it costs what the node costs, at this depth
        self._count(anchored.values, event, is_key, via_alias=True)
        if depth + anchored.height > MAX_DEPTH:
            raise ComposeLimit(f"the document nests deeper than {MAX_DEPTH} levels (nested aliases?)", _start(event))
        self.reach = max(self.reach, depth + anchored.height)
        return anchored.node

    def _count(self, values: int, event: yaml.Event, is_key: bool, *, via_alias: bool = False) -> None:
        if is_key:  # a key always comes with a value: counting values bounds both
            return
        self.values += values
        if self.values > MAX_VALUES:
            why = " (nested aliases?)" if via_alias else ""
            raise ComposeLimit(f"the document expands to more than {MAX_VALUES} values{why}", _start(event))

    def _tag(self, event: yaml.CollectionStartEvent, kind: type[yaml.Node]) -> str:
        tag = event.tag
        if tag is None or tag == "!":
            tag = self.resolver.resolve(  # type: ignore[no-untyped-call]
                kind, None, event.implicit
            )
        return str(tag)

    def _sequence(self, start: yaml.SequenceStartEvent, depth: int) -> yaml.SequenceNode:
        items: list[yaml.Node] = []
        node = yaml.SequenceNode(
            self._tag(start, yaml.SequenceNode), items, _start(start), None, flow_style=start.flow_style
        )
        event = self._next()
        while not isinstance(event, yaml.SequenceEndEvent):
            items.append(self._node(event, depth + 1))
            event = self._next()
        node.end_mark = _end(event)
        return node

    def _mapping(self, start: yaml.MappingStartEvent, depth: int) -> yaml.MappingNode:
        pairs: list[tuple[yaml.Node, yaml.Node]] = []
        node = yaml.MappingNode(
            self._tag(start, yaml.MappingNode), pairs, _start(start), None, flow_style=start.flow_style
        )
        event = self._next()
        while not isinstance(event, yaml.MappingEndEvent):
            key = self._node(event, depth + 1, is_key=True)
            value = self._node(self._next(), depth + 1)
            pairs.append((key, value))
            event = self._next()
        node.end_mark = _end(event)
        return node
