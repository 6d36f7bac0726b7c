"""nginx's configuration grammar: words, quotes, escapes, ``#`` comments, ``{}`` blocks, ``;``.

Follows ``ngx_conf_read_token``: a word ends at whitespace, ``;``, ``{`` or ``}``;
``"..."`` and ``'...'`` are one word (a quoted word must be followed by a separator);
a backslash keeps the next character in the word, and ``\\"``, ``\\'``, ``\\\\``,
``\\t``, ``\\r``, ``\\n`` are unescaped (any other ``\\x`` stays as written); ``#``
starts a comment only where a word could start; ``${name}`` keeps its braces.
``include`` is followed here, with globs, relative to the main file's directory.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field

_SEPARATORS = " \t\r\n;{}"
_UNESCAPE = {'"': '"', "'": "'", "\\": "\\", "t": "\t", "r": "\r", "n": "\n"}
MAX_INCLUDE_DEPTH = 32
MAX_FILES = 10_000  # included files in all: a glob including itself fans out
MAX_BLOCK_DEPTH = 64  # nested blocks (nginx configs nest a handful)
MAX_FILE_BYTES = 16 * 1024 * 1024


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

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def text(self) -> str:
        """The directive as nginx would print it (one line, block contents elided)."""
        words = [self.name, *(_quote(a) for a in self.args)]
        return " ".join(words) + (" { ... }" if self.block is not None else ";")


def _quote(word: str) -> str:
    if word and not any(c in word for c in " \t\r\n;{}\"'#\\"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


@dataclass(slots=True)
class _Token:
    value: str
    line: int
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
                self.pos = n if end < 0 else end
            elif ch in ";{}":
                self.tokens.append(_Token(ch, self.line))
                self.pos += 1
            elif ch in "\"'":
                self._quoted(ch)
            else:
                self._word()
        return self.tokens

    def _escaped(self) -> str:
        """The character after the backslash at ``pos``, unescaped as nginx does; moves past both."""
        nxt = self.text[self.pos + 1]
        if nxt == "\n":
            self.line += 1
        self.pos += 2
        return _UNESCAPE.get(nxt, "\\" + nxt)

    def _quoted(self, quote: str) -> None:
        text, n = self.text, len(self.text)
        start_line = self.line
        out: list[str] = []
        self.pos += 1
        while True:
            if self.pos >= n:
                raise ParseError(self.file, start_line, "unexpected end of file, expecting a closing quote")
            ch = text[self.pos]
            if ch == "\\" and self.pos + 1 < n:
                out.append(self._escaped())
                continue
            if ch == quote:
                self.pos += 1
                break
            if ch == "\n":
                self.line += 1
            out.append(ch)
            self.pos += 1
        if self.pos < n and text[self.pos] not in _SEPARATORS:
            raise ParseError(self.file, self.line, f'unexpected "{text[self.pos]}" after a quoted string')
        self.tokens.append(_Token("".join(out), start_line, quoted=True))

    def _word(self) -> None:
        text, n = self.text, len(self.text)
        out: list[str] = []
        while self.pos < n:
            ch = text[self.pos]
            if ch == "\\" and self.pos + 1 < n:
                out.append(self._escaped())
                continue
            if ch == "{" and out and out[-1].endswith("$"):
                end = text.find("}", self.pos)
                if end < 0 or "\n" in text[self.pos : end]:
                    raise ParseError(self.file, self.line, 'unexpected "{" in a variable name')
                out.append(text[self.pos : end + 1])
                self.pos = end + 1
                continue
            if ch in _SEPARATORS:
                break
            out.append(ch)
            self.pos += 1
        self.tokens.append(_Token("".join(out), self.line))


def _read(path: str, shown: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read(MAX_FILE_BYTES + 1)
        if len(text) > MAX_FILE_BYTES:
            raise ParseError(shown, 0, f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
        return text
    except OSError as exc:
        raise ParseError(shown, 0, f"cannot read: {exc.strerror or exc}") from None


@dataclass(slots=True)
class _Builder:
    base_dir: str
    depth: int = 0
    files: int = 0
    blocks: int = 0

    def parse_file(self, path: str, shown: str) -> list[Directive]:
        self.files += 1
        if self.files > MAX_FILES:
            raise ParseError(shown, 0, f"more than {MAX_FILES} included files (an include fanning out?)")
        tokens = _Lexer(_read(path, shown), shown).run()
        directives, pos = self._block(tokens, 0, shown, top=True)
        assert pos == len(tokens)
        return directives

    def _block(self, tokens: list[_Token], pos: int, file: str, top: bool) -> tuple[list[Directive], int]:
        out: list[Directive] = []
        words: list[_Token] = []
        while pos < len(tokens):
            tok = tokens[pos]
            pos += 1
            if not tok.quoted and tok.value == ";":
                if not words:
                    raise ParseError(file, tok.line, 'unexpected ";"')
                d = Directive(words[0].value, [w.value for w in words[1:]], file, words[0].line, end_line=tok.line)
                out.extend(self._include(d) if d.name == "include" else [d])
                words = []
            elif not tok.quoted and tok.value == "{":
                if not words:
                    raise ParseError(file, tok.line, 'unexpected "{"')
                self.blocks += 1
                if self.blocks > MAX_BLOCK_DEPTH:
                    raise ParseError(file, tok.line, f"blocks nested deeper than {MAX_BLOCK_DEPTH}")
                inner, pos = self._block(tokens, pos, file, top=False)
                self.blocks -= 1
                d = Directive(words[0].value, [w.value for w in words[1:]], file, words[0].line, inner)
                d.end_line = tokens[pos - 1].line
                out.append(d)
                words = []
            elif not tok.quoted and tok.value == "}":
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
        full = pattern if os.path.isabs(pattern) else os.path.join(self.base_dir, pattern)
        if glob.has_magic(full):
            paths = sorted(glob.glob(full))
        else:
            if not os.path.exists(full):
                raise ParseError(d.file, d.line, f'open() "{full}" failed (No such file or directory)')
            paths = [full]
        if self.depth >= MAX_INCLUDE_DEPTH:
            raise ParseError(d.file, d.line, f"includes nested deeper than {MAX_INCLUDE_DEPTH} (a loop?)")
        self.depth += 1
        try:
            out: list[Directive] = []
            for path in paths:
                shown = os.path.relpath(path, self.base_dir) if not os.path.isabs(pattern) else path
                out.extend(self.parse_file(path, shown))
            return out
        finally:
            self.depth -= 1


def parse_config(path: str) -> list[Directive]:
    """The main file's directives, includes already spliced in; raises ``ParseError``."""
    base_dir = os.path.dirname(os.path.abspath(path))
    return _Builder(base_dir).parse_file(path, path)


def parse_text(text: str, file: str = "nginx.conf", base_dir: str = ".") -> list[Directive]:
    tokens = _Lexer(text, file).run()
    directives, _ = _Builder(base_dir)._block(tokens, 0, file, top=True)
    return directives
