"""YAML text -> plain data plus a table of where every key and value stands.

PyYAML silently keeps the last of two duplicate keys and loses line numbers once
data is constructed. We compose the node tree ourselves, build plain Python
values, and record ``{key path: (line, column)}`` so that every later error can
name its file, line and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from gateway.errors import ConfigError, ConfigErrors, KeyPath


@dataclass(frozen=True, slots=True)
class Document:
    """A parsed configuration file."""

    file: str
    data: Any
    marks: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: KeyPath) -> tuple[int, int]:
        """The (line, column) of the value at ``path``, or of its nearest parent."""
        while True:
            mark = self.marks.get(path)
            if mark is not None:
                return mark
            if not path:
                return (0, 0)
            path = path[:-1]

    def error(self, path: KeyPath, message: str, *, at_key: bool = False) -> ConfigError:
        mark = self.key_marks.get(path) if at_key else None
        line, column = mark or self.where(path)
        return ConfigError(message, file=self.file, line=line, column=column, path=path)


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.marks: dict[KeyPath, tuple[int, int]] = {}
        self.key_marks: dict[KeyPath, tuple[int, int]] = {}
        self.errors: list[ConfigError] = []
        self._constructor = yaml.SafeLoader("")  # used only to construct scalars

    def _mark(self, path: KeyPath, node: yaml.Node) -> None:
        self.marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)

    def _fail(self, path: KeyPath, node: yaml.Node, message: str) -> None:
        self.errors.append(
            ConfigError(
                message,
                file=self.file,
                line=node.start_mark.line + 1,
                column=node.start_mark.column + 1,
                path=path,
            )
        )

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self._mark(path, node)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self._fail(path, key_node, "YAML merge keys (<<) are not supported")
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    self._fail(path, key_node, "a key must be a plain string")
                    continue
                key = str(key_node.value)
                if key in out:
                    self._fail(path + (key,), key_node, f"duplicate key {key!r}")
                    continue
                self.key_marks[path + (key,)] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                out[key] = self.build(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self._fail(path, node, f"invalid value: {exc}")
            return None


def parse_yaml(text: str, file: str) -> Document:
    """Parse one YAML document; raise ``ConfigErrors`` naming file and line on failure."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        problem = exc.problem or str(exc)
        if exc.context:
            problem = f"{problem} ({exc.context})"
        raise ConfigErrors(
            [ConfigError(f"YAML syntax error: {problem}", file=file, line=line, column=column)]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigErrors([ConfigError(f"YAML error: {exc}", file=file)]) from None
    if root is None:
        return Document(file=file, data={}, marks={(): (1, 1)})
    builder = _Builder(file)
    data = builder.build(root, ())
    if builder.errors:
        raise ConfigErrors(builder.errors)
    return Document(file=file, data=data, marks=builder.marks, key_marks=builder.key_marks)


def read_document(path: str) -> Document:
    """Read and parse a configuration file."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigErrors([ConfigError(f"cannot read file: {exc.strerror}", file=path)]) from None
    except UnicodeDecodeError as exc:
        raise ConfigErrors([ConfigError(f"file is not UTF-8: {exc.reason}", file=path)]) from None
    return parse_yaml(text, path)
