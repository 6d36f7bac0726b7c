"""YAML text -> plain data plus a table of where every key and value stands.

PyYAML silently keeps the last of two duplicate keys and loses line numbers once
data is constructed. We compose the node tree ourselves (``compose.py``), build
plain Python values, and record ``{key path: (line, column)}`` so that every
later error can name its file, line and key.

A configuration file is input we must survive whoever wrote it, so loading is
bounded: a file over ``MAX_FILE_BYTES`` is refused before parsing, and so is one that
is not a regular file (a FIFO, a device: ``gateway/files.py``); nesting stops
at ``compose.MAX_DEPTH`` levels; and the values built, counting every pass through an
alias (``*a``), stop at ``compose.MAX_VALUES``, so ten lines of nested aliases (a
"billion laughs") are an error naming the line where the bound was crossed,
not gigabytes and minutes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gateway.config.compose import MAX_DEPTH, ComposeLimit, compose
from gateway.config.teardown import release
from gateway.errors import ConfigError, ConfigErrors, KeyPath
from gateway.files import FileTooLarge, read_bounded

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_ERRORS = 100  # past this, one more error says so and the rest are dropped: 50000 lines help no one

# What YAML 1.1 allows in a stream (PyYAML's and libyaml's readers refuse the rest).
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_CHAR_NAMES = {0: "NUL", 0x1B: "ESC", 0x7F: "DEL", 0xFEFF: "BOM"}


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

    def discard(self) -> None:
        """Empty the document a little at a time (from a worker thread: see ``teardown.py``)."""
        for table in (self.marks, self.key_marks):
            while table:
                table.popitem()
        if isinstance(self.data, (dict, list)):
            children: list[object] = list(self.data.values() if isinstance(self.data, dict) else self.data)
            self.data.clear()
            release(children)


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.marks: dict[KeyPath, tuple[int, int]] = {}
        self.key_marks: dict[KeyPath, tuple[int, int]] = {}
        self.errors: list[ConfigError] = []
        self.collections: list[yaml.Node | None] = []  # every mapping and sequence, parents first
        self._constructor = yaml.constructor.SafeConstructor()  # used only to construct scalars

    def free_nodes(self) -> None:
        """Drop the node tree one collection at a time, parents first (see ``teardown.py``)."""
        nodes = self.collections
        for index in range(len(nodes)):
            nodes[index] = None
        scalars = self._constructor.constructed_objects  # the constructor's cache: node -> value
        while scalars:
            scalars.popitem()

    def _mark(self, path: KeyPath, node: yaml.Node) -> None:
        self.marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)

    def _fail(self, path: KeyPath, node: yaml.Node, message: str) -> None:
        if len(self.errors) > MAX_ERRORS:
            return
        if len(self.errors) == MAX_ERRORS:
            message = f"more than {MAX_ERRORS} errors: the rest are not shown"
        self.errors.append(self._error(path, node, message))

    def _error(self, path: KeyPath, node: yaml.Node, message: str) -> ConfigError:
        mark = node.start_mark
        return ConfigError(message, file=self.file, line=mark.line + 1, column=mark.column + 1, path=path)

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        # The composer bounded the calls made here, each pass through an alias included.
        self._mark(path, node)
        if isinstance(node, yaml.CollectionNode):
            self.collections.append(node)
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
        except yaml.MarkedYAMLError as exc:
            self._fail(path, node, f"invalid value: {exc.problem or exc}")
        except yaml.YAMLError as exc:
            self._fail(path, node, f"invalid value: {exc}")
        except (ValueError, OverflowError) as exc:
            # an int of over 4300 digits, a date such as 2024-13-45: Python refuses to build it
            shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
            self._fail(path, node, f"invalid value {shown!r}: {_reason(exc)}")
        return None


def _reason(exc: Exception) -> str:
    text = str(exc)
    if "digits" in text:
        return "too many digits"
    return text


def parse_yaml(text: str, file: str) -> Document:
    """Parse one YAML document; raise ``ConfigErrors`` naming file and line on failure."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigErrors([ConfigError(f"the file is larger than {_MIB} MiB; refusing to parse it", file=file)])
    bad = _NOT_PRINTABLE.search(text)
    if bad is not None:
        line, column = line_column(text, bad.start())
        code = ord(bad.group())
        name = f" ({_CHAR_NAMES[code]})" if code in _CHAR_NAMES else ""
        raise ConfigErrors(
            [
                ConfigError(
                    f"unacceptable character #x{code:04x}{name}: YAML allows no control characters",
                    file=file,
                    line=line,
                    column=column,
                )
            ]
        )
    try:
        root = compose(text)
    except ComposeLimit as exc:
        raise ConfigErrors([ConfigError(exc.message, file=file, line=exc.line, column=exc.column)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        problem = exc.problem or str(exc)
        if "maximum nesting depth" in problem:
            # libyaml's own bound (1,000 flow levels, newer libyaml only): its scanner looks ahead
            # through a flow collection, so it can stop before the composer reaches ours
            message = f"the document nests deeper than {MAX_DEPTH} levels"
            raise ConfigErrors([ConfigError(message, file=file, line=line, column=column)]) from None
        if exc.context:
            problem = f"{problem} ({exc.context})"
        raise ConfigErrors(
            [ConfigError(f"YAML syntax error: {problem}", file=file, line=line, column=column)]
        ) from None
    except yaml.reader.ReaderError as exc:  # the check above should leave none; keep the position anyway
        line, column = line_column(text, exc.position)
        raise ConfigErrors([ConfigError(f"YAML error: {exc.reason}", file=file, line=line, column=column)]) from None
    except yaml.YAMLError as exc:
        raise ConfigErrors([ConfigError(f"YAML error: {exc}", file=file)]) from None
    if root is None:
        return Document(file=file, data={}, marks={(): (1, 1)})
    builder = _Builder(file)
    data = builder.build(root, ())
    del root
    builder.free_nodes()
    if builder.errors:
        raise ConfigErrors(builder.errors)
    return Document(file=file, data=data, marks=builder.marks, key_marks=builder.key_marks)


_MIB = MAX_FILE_BYTES // (1024 * 1024)


def line_column(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset``, counting line breaks as YAML does."""
    offset = max(0, min(offset, len(text)))
    line, start = 1, 0
    for brk in _LINE_BREAK.finditer(text, 0, offset):
        line += 1
        start = brk.end()
    return line, offset - start + 1


def read_document(path: str) -> Document:
    """Read and parse a configuration file (refusing one over ``MAX_FILE_BYTES``)."""
    try:
        raw = read_bounded(path, MAX_FILE_BYTES)  # a regular file: a FIFO or a device is refused unopened
    except FileTooLarge:
        message = f"the file is larger than {_MIB} MiB; refusing to parse it"
        raise ConfigErrors([ConfigError(message, file=path)]) from None
    except OSError as exc:
        raise ConfigErrors([ConfigError(f"cannot read file: {exc.strerror}", file=path)]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        good = raw[: exc.start].decode("utf-8")
        line, column = line_column(good, len(good))
        raise ConfigErrors(
            [ConfigError(f"file is not UTF-8: {exc.reason}", file=path, line=line, column=column)]
        ) from None
    return parse_yaml(text, path)
