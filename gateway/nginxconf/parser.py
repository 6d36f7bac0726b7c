"""nginx's configuration grammar: words, quotes, escapes, ``#`` comments, ``{}`` blocks, ``;``.

Follows ``ngx_conf_read_token`` (nginx 1.22), state for state:

- a word ends at whitespace (space, tab, CR, LF), ``;`` or ``{``; a ``}`` ends a
  directive's block only where a word could start (``a}b`` is one word);
- ``"..."`` and ``'...'`` are one word, which must be followed by whitespace, ``;``,
  ``{`` or ``)``: a ``)`` starts the next word (``if ($a = 'x')`` gives ``'x'`` and ``)``);
- a backslash keeps the next character in the word, whatever it is; then ``\\"``,
  ``\\'``, ``\\\\``, ``\\t``, ``\\r``, ``\\n`` are unescaped (any other ``\\x`` stays as
  written);
- ``#`` starts a comment only where a word could start (``a#b`` is one word);
- ``{`` right after ``$`` stays in the word (``${name}``);
- nginx reads the file through a 4096-byte buffer, and a word (or comment) that
  fills it is refused: "too long parameter" (``_check_length`` says exactly when).

``include`` is followed here, with globs, relative to the main file's directory (or the
nearest directory above it that has the file: nginx reads includes from its configuration
directory, and the file imported may be a site under it; an absolute path not on this machine
is looked for by its last components there too). A missing file nginx ships (``mime.types``,
``fastcgi_params``...) counts as empty.
All of it within one
budget for the whole import (``_Budget``): ``MAX_FILES`` files read, ``MAX_TOTAL_BYTES`` bytes
read, ``MAX_DIRECTIVES`` directives, ``MAX_GLOB_MATCHES`` paths matched by globs, and
``MAX_SECONDS`` of time; each file is
a regular file of at most ``MAX_FILE_BYTES`` (a FIFO or a device is refused unopened, so it
cannot block: ``gateway/files.py``). A glob with wildcards in more than ``MAX_GLOB_WILDCARD_PARTS``
path components (``include /*/*/*/*;``) is refused before anything is listed: it walks a
directory tree, which no real configuration needs (they include ``conf.d/*.conf``,
``sites-enabled/*``). nginx has none of these bounds; a configuration within them imports as
before, and one past them is refused with the file and line of the ``include``.
"""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass, field

from gateway.files import MIB, FileRefused, FileTooLarge, read_bounded, size_text

_SPACE = " \t\r\n"
_WORD_END = _SPACE + ";{"
_UNESCAPE = {'"': '"', "'": "'", "\\": "\\", "t": "\t", "r": "\r", "n": "\n"}
MAX_INCLUDE_DEPTH = 32
MAX_FILES = 1_000  # files read in all (the main one included): a glob including itself fans out
MAX_BLOCK_DEPTH = 64  # nested blocks (nginx configs nest a handful)
MAX_FILE_BYTES = 16 * MIB  # one file
MAX_TOTAL_BYTES = 16 * MIB  # every file read, counting a file included twice twice
MAX_DIRECTIVES = 250_000  # in all, each some 300 bytes in memory (a 100,000-line geo or map block fits)
MAX_GLOB_MATCHES = 10_000  # paths matched by all the globs
MAX_GLOB_WILDCARD_PARTS = 2  # path components with a wildcard in one glob (conf.d/*/*.conf)
MAX_SECONDS = 30.0  # the whole parse
CONF_BUFFER = 4096  # NGX_CONF_BUFFER
MAX_CONF_DIR_UP = 4  # how far above the main file a relative include is looked for
# files that come with nginx, holding only types and *_param lines: an import without them loses nothing
NGINX_SHIPPED = ("mime.types", "fastcgi_params", "fastcgi.conf", "uwsgi_params", "scgi_params", "koi-utf",
                 "koi-win", "win-utf")  # fmt: skip


class ParseError(ValueError):
    def __init__(self, file: str, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = file
        self.line = line


@dataclass(slots=True)
class Directive:
    name: str
    args: list[str]
    file: str
    line: int
    block: list[Directive] | None = None  # None: a simple directive ending in ";"
    end_line: int = 0
    quoted: frozenset[int] = frozenset()  # the indexes of the arguments written in quotes

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def text(self) -> str:
        """The directive as nginx would print it (one line, block contents elided)."""
        words = [self.name, *(_quote(a, i in self.quoted) for i, a in enumerate(self.args))]
        if len(words) > 2 and words[-1] == ")" and (len(self.args) - 2) in self.quoted:
            words[-2:] = [words[-2] + ")"]  # if ($a = 'x'): the ")" was written right after the quote
        return " ".join(words) + (" { ... }" if self.block is not None else ";")


def _quote(word: str, quoted: bool = False) -> str:
    if word and not quoted and not any(c in word for c in " \t\r\n;{}\"'#\\"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _unescape(raw: str) -> str:
    """A word's source text as nginx stores it: only \\" \\' \\\\ \\t \\r \\n are unescaped."""
    if "\\" not in raw:
        return raw
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        ch = raw[i]
        if ch == "\\" and i + 1 < n and raw[i + 1] in _UNESCAPE:
            out.append(_UNESCAPE[raw[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@dataclass(slots=True)
class _Token:
    value: str
    line: int
    kind: str = "word"  # "word", or the punctuation itself: ";", "{", "}"
    quoted: bool = False


@dataclass(slots=True)
class _Lexer:
    text: str
    file: str
    pos: int = 0
    line: int = 1
    tokens: list[_Token] = field(default_factory=list)

    def run(self) -> list[_Token]:
        text, n = self.text, len(self.text)
        while self.pos < n:
            ch = text[self.pos]
            if ch == "\n":
                self.line += 1
                self.pos += 1
            elif ch in " \t\r":
                self.pos += 1
            elif ch == "#":
                end = text.find("\n", self.pos)
                end = n if end < 0 else end
                self._check_length(self.pos, end, -1 if end == n else 0)  # a comment ends at the newline
                self.pos = end
            elif ch in ";{}":
                self.tokens.append(_Token(ch, self.line, ch))
                self.pos += 1
            elif ch in "\"'":
                self._quoted(ch)
                if self.pos < n and text[self.pos] == ")":
                    self._word()  # nginx lets ")" follow a quoted word, and starts a word with it
                elif self.pos < n and text[self.pos] not in _WORD_END:
                    raise ParseError(self.file, self.line, f'unexpected "{text[self.pos]}" after a quoted string')
            else:
                self._word()
        return self.tokens

    def _skip_escaped(self) -> None:
        """Past the backslash at ``pos`` and the character it keeps (nginx's ``quoted`` state)."""
        if self.pos + 1 < len(self.text) and self.text[self.pos + 1] == "\n":
            self.line += 1
        self.pos += 2

    def _quoted(self, quote: str) -> None:
        text, n = self.text, len(self.text)
        start_line = self.line
        self.pos += 1
        start = self.pos
        while True:
            if self.pos >= n:
                raise ParseError(self.file, start_line, "unexpected end of file, expecting a closing quote")
            ch = text[self.pos]
            if ch == "\\":
                self._skip_escaped()
                continue
            if ch == quote:
                break
            if ch == "\n":
                self.line += 1
            self.pos += 1
        after = text[self.pos + 1] if self.pos + 1 < n else ""
        self._check_length(start, self.pos, 2 if after and after in _SPACE else 1)
        self.tokens.append(_Token(_unescape(text[start : self.pos]), start_line, quoted=True))
        self.pos += 1

    def _word(self) -> None:
        text, n = self.text, len(self.text)
        start, start_line = self.pos, self.line
        variable = False  # the previous character was "$": a "{" stays in the word
        while self.pos < n:
            ch = text[self.pos]
            if ch == "{" and variable:
                self.pos += 1
                continue
            variable = ch == "$"
            if ch == "\\":
                self._skip_escaped()
                continue
            if ch in _WORD_END:
                break
            self.pos += 1
        end = min(self.pos, n)
        self._check_length(start, end, 1 if end < n and text[end] in _SPACE else 0)
        self.tokens.append(_Token(_unescape(text[start:end]), start_line))

    def _check_length(self, start: int, end: int, extra: int) -> None:
        """Refuse a word nginx cannot hold in its 4096-byte read buffer.

        nginx keeps the bytes from a word's start (after an opening quote) in the buffer
        until the next word may start: through a closing quote and one whitespace byte
        after the word. It fails when those fill the buffer and one more byte must be
        read; ``extra`` is how many bytes after ``end`` are held (closing quote, space),
        -1 for a comment that ends the file (nothing more to read).
        """
        if (end - start) * 4 + extra < CONF_BUFFER - 8:
            return  # short even in UTF-8's widest bytes
        held = len(self.text[start:end].encode("utf-8", "surrogateescape")) + extra
        if held >= CONF_BUFFER:
            line = self.text.count("\n", 0, start) + 1
            raise ParseError(self.file, line, f'too long parameter "{self.text[start : start + 10]}..." started')


@dataclass(slots=True)
class _Budget:
    """What one import may read in all; ``spend_*`` raise ``ParseError`` at ``file:line`` past it."""

    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)
    files: int = 0
    bytes_left: int = MAX_TOTAL_BYTES
    directives: int = 0
    matches: int = 0

    def check_time(self, file: str, line: int) -> None:
        if time.monotonic() > self.deadline:
            raise ParseError(file, line, f"the import took longer than {MAX_SECONDS:g} s (includes fanning out?)")

    def spend_file(self, file: str, line: int) -> int:
        """Count one more file; the bytes it may hold."""
        self.check_time(file, line)
        self.files += 1
        if self.files > MAX_FILES:
            raise ParseError(file, line, f"more than {MAX_FILES} included files (an include fanning out?)")
        if self.bytes_left <= 0:
            raise ParseError(file, line, f"the files read come to more than {size_text(MAX_TOTAL_BYTES)}")
        return min(MAX_FILE_BYTES, self.bytes_left)

    def spend_bytes(self, count: int) -> None:
        self.bytes_left -= count

    def spend_directive(self, file: str, line: int) -> None:
        self.directives += 1
        if self.directives > MAX_DIRECTIVES:
            raise ParseError(file, line, f"more than {MAX_DIRECTIVES} directives in all")
        if self.directives % 4096 == 0:
            self.check_time(file, line)

    def spend_match(self, file: str, line: int) -> None:
        self.matches += 1
        if self.matches > MAX_GLOB_MATCHES:
            raise ParseError(file, line, f"the globs match more than {MAX_GLOB_MATCHES} paths")
        if self.matches % 256 == 0:
            self.check_time(file, line)


def _directive(words: list[_Token], file: str) -> Directive:
    quoted = frozenset(i for i, w in enumerate(words[1:]) if w.quoted)
    return Directive(words[0].value, [w.value for w in words[1:]], file, words[0].line, quoted=quoted)


@dataclass(slots=True)
class _Builder:
    base_dir: str
    notes: list[str] = field(default_factory=list)  # includes found elsewhere than nginx would read them
    depth: int = 0
    blocks: int = 0
    budget: _Budget = field(default_factory=_Budget)

    def parse_file(self, path: str, shown: str, where: tuple[str, int] | None = None) -> list[Directive]:
        """``where``: the file and line of the ``include`` that names ``path`` (None: the main file)."""
        at_file, at_line = where or (shown, 0)
        limit = self.budget.spend_file(at_file, at_line)
        try:
            raw = read_bounded(path, limit)  # a regular file: a FIFO or a device is refused unopened
        except FileTooLarge:
            if limit < MAX_FILE_BYTES:
                message = f"the files read come to more than {size_text(MAX_TOTAL_BYTES)}"
                raise ParseError(at_file, at_line, message) from None
            raise ParseError(shown, 0, f"larger than {size_text(MAX_FILE_BYTES)}") from None
        except FileRefused as exc:
            raise ParseError(at_file, at_line, f"{shown}: {exc.strerror}" if where else str(exc.strerror)) from None
        except OSError as exc:
            raise ParseError(shown, 0, f"cannot read: {exc.strerror or exc}") from None
        self.budget.spend_bytes(len(raw))
        tokens = _Lexer(raw.decode("utf-8", "surrogateescape"), shown).run()
        directives, pos = self._block(tokens, 0, shown, top=True)
        assert pos == len(tokens)
        return directives

    def _block(self, tokens: list[_Token], pos: int, file: str, top: bool) -> tuple[list[Directive], int]:
        out: list[Directive] = []
        words: list[_Token] = []
        while pos < len(tokens):
            tok = tokens[pos]
            pos += 1
            if tok.kind == ";":
                if not words:
                    raise ParseError(file, tok.line, 'unexpected ";"')
                self.budget.spend_directive(file, words[0].line)
                d = _directive(words, file)
                d.end_line = tok.line
                out.extend(self._include(d) if d.name == "include" else [d])
                words = []
            elif tok.kind == "{":
                if not words:
                    raise ParseError(file, tok.line, 'unexpected "{"')
                self.budget.spend_directive(file, words[0].line)
                self.blocks += 1
                if self.blocks > MAX_BLOCK_DEPTH:
                    raise ParseError(file, tok.line, f"blocks nested deeper than {MAX_BLOCK_DEPTH}")
                inner, pos = self._block(tokens, pos, file, top=False)
                self.blocks -= 1
                d = _directive(words, file)
                d.block = inner
                d.end_line = tokens[pos - 1].line
                out.append(d)
                words = []
            elif tok.kind == "}":
                if top or words:
                    raise ParseError(file, tok.line, 'unexpected "}"')
                return out, pos
            else:
                words.append(tok)
        if words:
            raise ParseError(file, words[-1].line, 'unexpected end of file, expecting ";" or "}"')
        if not top:
            raise ParseError(file, tokens[-1].line if tokens else 1, 'unexpected end of file, expecting "}"')
        return out, pos

    def _include(self, d: Directive) -> list[Directive]:
        if len(d.args) != 1:
            raise ParseError(d.file, d.line, 'invalid number of arguments in "include" directive')
        pattern = d.args[0]
        refuse_walking_glob(pattern, d)  # before _find globs anything
        full = self._find(pattern)
        if glob.has_magic(full):
            paths = self._glob(full, d)
        else:
            if not os.path.exists(full):
                if os.path.basename(full) in NGINX_SHIPPED:
                    return []  # nginx's own mime.types, fastcgi_params...: types and fastcgi_param only
                raise ParseError(d.file, d.line, f'open() "{full}" failed (No such file or directory)')
            paths = [full]
        if self.depth >= MAX_INCLUDE_DEPTH:
            raise ParseError(d.file, d.line, f"includes nested deeper than {MAX_INCLUDE_DEPTH} (a loop?)")
        self.depth += 1
        try:
            out: list[Directive] = []
            for path in paths:
                shown = os.path.relpath(path, self.base_dir) if not os.path.isabs(pattern) else path
                out.extend(self.parse_file(path, shown, (d.file, d.line)))
            return out
        finally:
            self.depth -= 1

    def _find(self, pattern: str) -> str:
        """Where ``pattern`` is: nginx reads a relative include from its configuration directory,
        which for a file imported from sites-available/ or conf.d/ is a directory above it. An
        absolute path that is not on this machine (a configuration copied from its host) is looked
        for by its last components beside the main file or above it; what was found is noted."""
        if os.path.isabs(pattern):
            if os.path.exists(pattern) or glob.has_magic(pattern):
                return pattern
            parts = pattern.strip("/").split("/")
            tails = ["/".join(parts[i:]) for i in range(len(parts))]
        else:
            tails = [pattern]
        for tail in tails:
            directory = self.base_dir
            for _ in range(MAX_CONF_DIR_UP):
                candidate = os.path.join(directory, tail)
                if (
                    next(glob.iglob(candidate), None) is not None
                    if glob.has_magic(candidate)
                    else os.path.exists(candidate)
                ):
                    if os.path.isabs(pattern):
                        self.notes.append(f"include {pattern}: read {os.path.relpath(candidate, self.base_dir)}")
                    return candidate
                directory = os.path.dirname(directory)
        return pattern if os.path.isabs(pattern) else os.path.join(self.base_dir, pattern)

    def _glob(self, pattern: str, d: Directive) -> list[str]:
        """The paths ``pattern`` matches, sorted as glob(3) sorts them, within the budget."""
        refuse_walking_glob(pattern, d)
        paths: list[str] = []
        for path in glob.iglob(pattern):
            self.budget.spend_match(d.file, d.line)
            paths.append(path)
        return sorted(paths)


def refuse_walking_glob(pattern: str, d: Directive) -> None:
    """``ParseError`` at ``d`` for a glob with wildcards in more than ``MAX_GLOB_WILDCARD_PARTS``
    path components; call it before anything globs ``pattern``, as nothing lists a directory here."""
    wild = [part for part in pattern.split(os.sep) if glob.has_magic(part)]
    if len(wild) > MAX_GLOB_WILDCARD_PARTS:
        raise ParseError(
            d.file,
            d.line,
            f'the glob "{pattern}" has wildcards in {len(wild)} path components (at most '
            f"{MAX_GLOB_WILDCARD_PARTS}): it would walk a directory tree",
        )


def parse_config(path: str) -> list[Directive]:
    """The main file's directives, includes already spliced in; raises ``ParseError``."""
    return parse_config_noting(path)[0]


def parse_config_noting(path: str) -> tuple[list[Directive], list[str]]:
    """``parse_config``, and where includes not found as nginx would read them were found."""
    builder = _Builder(os.path.dirname(os.path.abspath(path)))
    directives = builder.parse_file(path, path)
    return directives, builder.notes


def parse_text(text: str, file: str = "nginx.conf", base_dir: str = ".") -> list[Directive]:
    tokens = _Lexer(text, file).run()
    directives, _ = _Builder(base_dir)._block(tokens, 0, file, top=True)
    return directives
