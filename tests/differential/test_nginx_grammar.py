"""The import's parser against ``nginx -t``: the same configs accepted, the same words read.

Two generated families of configs, each checked by the nginx binary:

- **Free text in a ``types {}`` block.** Inside ``types``, nginx checks nothing but the
  grammar: each directive is a content type and any extensions, so its accept/reject is
  the tokenizer's alone. The text is made of quotes, escapes, parentheses, ``$``/``${}``,
  ``#`` comments, ``;``, braces and whitespace in every order. The parser must accept
  exactly what nginx accepts, and read the same words: the block is written twice, so
  nginx warns ``duplicate extension "WORD"`` for every word of the second copy, and the
  warnings the parser's words predict must be the ones nginx prints, word for word.
- **``if (...) { return ...; }``** in a location, written in every spelling nginx allows
  (quoted or bare operands, ``(`` and ``)`` glued or apart, ``)`` right after a quote,
  comments and newlines between the words), and with a stray character glued after a
  closing quote, which nginx refuses. Both must agree, and an accepted config must give
  the words that were written.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.nginxconf.parser import Directive, ParseError, parse_config

pytestmark = pytest.mark.nginx

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
if NGINX is None and not os.environ.get("CI"):
    pytest.skip("needs the nginx binary", allow_module_level=True)

SETTINGS = settings(
    max_examples=200,
    deadline=5000,  # ms for one example: one nginx -t, about 30 ms
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
WARN_START = re.compile(r"(?:^|\n)\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[(\w+)\] \d+#\d+: ")


def nginx_test(conf: Path) -> tuple[bool, list[tuple[str, str]]]:
    """``nginx -t`` on ``conf``: accepted?, and its log messages as (level, text)."""
    assert NGINX is not None, "the nginx binary is required when CI is set"
    run = subprocess.run(
        [NGINX, "-t", "-q", "-p", str(conf.parent), "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        timeout=10,
    )
    text = run.stderr.decode("utf-8", "surrogateescape")
    marks = list(WARN_START.finditer(text))
    messages = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        body = text[mark.end() : end]
        if i + 1 == len(marks):
            body = body.split("\nnginx: ", 1)[0].rstrip("\n")
        messages.append((mark.group(1), body))
    return run.returncode == 0, messages


def ours(conf: Path) -> list[Directive] | None:
    try:
        return parse_config(str(conf))
    except ParseError:
        return None


# -- free text in types {} -------------------------------------------------------------------------------

FRAGMENTS = [
    "a", "Bc", "x1", "/", "=", "~*", "!", ".", "-",
    " ", "  ", "\t", "\n", "\r\n",
    ";", ";", "{", "}", "(", ")", "#", "# a comment; { } ' \"\n",
    '"', "'", '"q w"', "'s t'", '"q;{}#)("', "'\\''", '"\\""', '""', "''", '"a"b', "'x')",
    "\\", "\\\\", '\\"', "\\'", "\\n", "\\t", "\\r", "\\;", "\\{", "\\}", "\\ ", "\\#", "\\x", "\\\n",
    "$", "$uri", "${", "${uri}", "${uri}x", "$$", "${a b}",
]  # fmt: skip
# pieces that keep a word whole wherever they are glued, and quoted words (whole words)
GLUED = [
    "a", "Bc", "x1", "/", "=", "~*", "!", ".", "-", "(", ")", "a}b", "a#b", "$uri", "${uri}", "${uri}x", "$$",
    "\\\\", '\\"', "\\'", "\\n", "\\t", "\\;", "\\{", "\\}", "\\ ", "\\#", "\\x", "\\\n",
]  # fmt: skip
QUOTED = ['"q w"', "'s t'", '"q;{}#)("', "'\\''", '"\\""', '""', "''", "'x')", '"$uri ${uri}"', "'a\\tb\\\\'"]
WORD = st.one_of(
    st.lists(st.sampled_from(GLUED), min_size=1, max_size=3).map("".join),
    st.sampled_from(QUOTED),
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=2).map("".join),  # anything, now and then
)
GAP = st.sampled_from([" ", "\n", "\t", " # c\n", "  "])


@st.composite
def statements(draw: st.DrawFn) -> str:
    """Directives of words, each ending in ";" (mostly accepted, with odd words)."""
    out = []
    for _ in range(draw(st.integers(1, 5))):
        words = [draw(WORD) for _ in range(draw(st.integers(1, 5)))]
        out.append("".join(w + draw(GAP) for w in words[:-1]) + words[-1] + draw(st.sampled_from([";", " ;", ";\n"])))
    return "\n".join(out)


TEXT = st.one_of(statements(), statements(), st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join))


def types_config(text: str) -> str:
    return (
        "events {}\nhttp {\ntypes_hash_bucket_size 1024;\ntypes_hash_max_size 4096;\ntypes {\n"
        f"{text}\n{text}\n}}\n}}\n"
    )


def types_block(tree: list[Directive]) -> list[Directive] | None:
    """The types entries, if the tree is the expected shape (else nginx refuses it: an unknown directive...)."""
    if [d.name for d in tree] != ["events", "http"] or tree[1].block is None:
        return None
    http = tree[1].block
    if [d.name for d in http] != ["types_hash_bucket_size", "types_hash_max_size", "types"]:
        return None
    entries = http[2].block
    if entries is None or any(d.block is not None or d.name == "include" for d in entries):
        return None  # nginx: unexpected "{" inside types; "include" is a directive there
    return entries


def predicted_warnings(entries: list[Directive], file: str) -> list[str]:
    """What ngx_http_core_type warns for these entries: each repeated (lower-cased) extension."""
    types: dict[str, str] = {}
    out = []
    for d in entries:
        for ext in d.args:
            ext = ext.translate(LOWER)
            if ext in types:
                out.append(
                    f'duplicate extension "{ext}", content type: "{d.name}", '
                    f'previous content type: "{types[ext]}" in {file}:{d.end_line}'
                )
            types[ext] = d.name
    return out


LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@SETTINGS
@given(text=TEXT)
def test_free_text_is_accepted_and_read_as_nginx_does(text: str, tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    conf.write_text(types_config(text), encoding="utf-8")
    accepted, messages = nginx_test(conf)
    tree = ours(conf)
    entries = None if tree is None else types_block(tree)
    assert (entries is not None) == accepted, (text, tree is not None, messages)
    event("nginx accepts" if accepted else "nginx refuses")
    if entries is not None:
        warned = [m for level, m in messages if level == "warn" and m.startswith("duplicate extension")]
        event(f"words compared: {min(len(warned), 10)}{'+' if len(warned) >= 10 else ''}")
        assert predicted_warnings(entries, str(conf)) == warned, text


# -- if (...) { return ...; } ------------------------------------------------------------------------------

# (variable, operator, operand): conditions nginx compiles (the operand of ~ is a valid regex)
CONDITIONS = [
    ("$request_method", "=", "OPTIONS"),
    ("$request_method", "!=", "GET"),
    ("$http_user_agent", "~*", "(bot|spider)"),
    ("$request_uri", "~", "/\\.git"),
    ("$request_method", "!~", "^(GET|HEAD|POST)$"),
    ("$http_x_a", "!~*", "a b;{}#"),
    ("$host", "=", "${host}x"),
    ("$http_x_flag", "", ""),
]
RETURNS = [["204"], ["403", "no; {} # ) ( \" ' \\ $uri ${uri}"], ["301", "https://$host$request_uri"], ["200", ""]]


def spell(word: str, style: str) -> str:
    """``word`` as nginx reads it back: bare (when it can be), "double" or 'single' quoted."""
    if style == "bare" and word and not re.search(r"""[\s;{}"'#\\]|^\)""", word):
        return word
    quote = "'" if style == "single" else '"'
    return quote + word.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote


STRAY = st.sampled_from(["", "", "", "", "x", "(", '"', "'", "#", "}", "\\"])


@st.composite
def if_blocks(draw: st.DrawFn) -> tuple[str, list[str], list[str], bool]:
    """The config text of an if/return, the words nginx reads, and whether a stray makes it invalid."""
    variable, operator, operand = draw(st.sampled_from(CONDITIONS))
    gap = st.sampled_from([" ", "\n", "\t", " # (c) 'x' ;\n", "\n  "])
    style = st.sampled_from(["bare", "double", "single"])
    words: list[str] = []  # what nginx reads
    text: list[str] = []  # what is written
    glued = draw(st.booleans())
    words += [f"({variable}"] if glued else ["(", variable]
    text += [f"({variable}"] if glued else ["(", variable]
    last_quoted = False
    if operator:
        operand_style = draw(style)
        spelled = spell(operand, operand_style)
        last_quoted = spelled[0] in "\"'"
        words += [operator, operand]
        text += [operator, spelled]
    stray = draw(STRAY) if last_quoted else ""  # glued right after the closing quote: nginx refuses it
    if draw(st.booleans()):  # ")" apart
        text[-1] += stray
        text.append(")")
        words.append(")")
    elif last_quoted:  # ")" right after the quote starts a word of its own
        text[-1] += stray + ")"
        words.append(")")
    else:
        text[-1] += ")"
        words[-1] += ")"
    code, *body = draw(st.sampled_from(RETURNS))
    ret_text = ["return", code, *(spell(b, draw(style)) for b in body)]
    head = "".join(w + draw(gap) for w in text)
    conf = "if " + head + "{" + draw(gap) + " ".join(ret_text) + ";" + draw(gap) + "}"
    return conf, words, [code, *body], bool(stray)


@SETTINGS
@given(case=if_blocks())
def test_if_return_in_every_spelling(case: tuple[str, list[str], list[str], bool], tmp_path: Path) -> None:
    block, words, returned, invalid = case
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"events {{}}\nhttp {{\nserver {{\nlisten 127.0.0.1:1;\nlocation / {{\n{block}\n}}\n}}\n}}\n", encoding="utf-8"
    )
    accepted, messages = nginx_test(conf)
    event("nginx accepts" if accepted else "nginx refuses")
    assert accepted == (not invalid), (block, messages)  # the generator writes what nginx accepts, bar the stray
    tree = ours(conf)
    assert (tree is not None) == accepted, (block, messages)
    if tree is not None:
        location = tree[1].block[0].block[1].block  # type: ignore[index]
        assert location[0].name == "if" and location[0].args == words, block
        assert location[0].block[0].args == returned  # type: ignore[index]


# -- nginx's 4096-byte read buffer --------------------------------------------------------------------------

LONG_FORMS = {
    "word;": "a/b {w};",
    "word ;": "a/b {w} ;",
    "quoted;": 'a/b "{w}";',
    "quoted ;": 'a/b "{w}" ;',
    "quoted)": 'a/b "{w}");',
    "escaped": "a/b \\{w};",
    "utf-8": "a/b \u00e9{w};",
    "comment": "#{w}\nx/y z;",
}


@pytest.mark.parametrize("form", LONG_FORMS, ids=list(LONG_FORMS))
def test_words_that_fill_nginx_read_buffer_are_refused_alike(form: str, tmp_path: Path) -> None:
    for pad, length in [(p, n) for p in ("", "#" * 4093 + "\n") for n in range(4093, 4098)]:
        conf = tmp_path / "nginx.conf"
        body = LONG_FORMS[form].replace("{w}", "x" * length)
        conf.write_text(f"{pad}events {{}}\nhttp {{ types {{\n{body}\n}} }}\n", encoding="utf-8")
        accepted, messages = nginx_test(conf)
        assert (ours(conf) is not None) == accepted, (form, length, messages)


def test_the_reported_idiom_parses() -> None:
    from gateway.nginxconf.parser import parse_text

    tree = parse_text("if ($request_method = 'OPTIONS') { return 204; }")
    assert tree[0].args == ["($request_method", "=", "OPTIONS", ")"]
    tree = parse_text('if ($http_user_agent ~* "(bot|spider)") { return 403; }')
    assert tree[0].args == ["($http_user_agent", "~*", "(bot|spider)", ")"]
