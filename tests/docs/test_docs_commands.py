"""The commands shown in the documentation run, and print what the documentation says.

A fenced ``console`` block preceded by a marker line is run:

    <!-- docs-test {"gateway": "conf/limits.yaml"} -->
    ```console
    $ gateway check -c conf/limits.yaml
    ok
    ```

Each ``$ `` line is a command (a trailing ``\\`` continues it); the other lines are output
that must appear in the command's stdout or stderr (whitespace runs count as one space, and
``...`` stands for any text, such as a time that moves). A
command must exit 0, or the status its trailing ``# exit N`` comment names. The commands of
one page run in order, in one scratch directory that holds a copy of ``conf/``, the
repository's ``scripts/`` and the files the page's ``{"file": NAME}`` blocks define; there
``gateway``, ``.venv/bin/gateway`` and ``python3`` are this checkout's.

Marker options: ``"gateway": CONFIG`` runs ``gateway run -c CONFIG`` first, with its
``listen`` and ``admin.listen`` moved to free ports (the block's ``8080`` and ``9180`` are
replaced by them) and its pid file in the scratch directory; ``"demo_upstream": true`` also
runs ``gateway demo-upstream`` on free ports as upstream ``app``; ``"replace": {OLD: NEW}``
substitutes text in the commands (a smaller input, for instance).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ports import free_port, wait_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = [p for p in (ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))) if p.exists()]
MARKER = re.compile(r"^<!-- docs-test (\{.*\}) -->\s*$")
FENCE = re.compile(r"^(`{3,})\s*([\w-]*)")
EXIT = re.compile(r"#\s*exit\s+(\d+)\b")


@dataclass
class Block:
    page: Path
    line: int
    options: dict[str, Any]
    language: str
    text: str


@dataclass
class Command:
    text: str
    expected: list[str] = field(default_factory=list)

    @property
    def status(self) -> int:
        found = EXIT.search(self.text)
        return int(found.group(1)) if found else 0


def marked_blocks(page: Path) -> list[Block]:
    """The fenced blocks that follow a marker line (markers inside a fence are text, not markers)."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    pending: tuple[int, dict[str, Any]] | None = None
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        marker = MARKER.match(lines[i])
        if marker:
            pending = (i + 1, json.loads(marker.group(1)))
        elif opened:
            ticks, language = opened.group(1), opened.group(2)
            end = i + 1
            while end < len(lines) and lines[end].strip() != ticks:
                end += 1
            if pending is not None:
                out.append(Block(page, pending[0], pending[1], language, "\n".join(lines[i + 1 : end]) + "\n"))
            pending = None
            i = end
        elif lines[i].strip():
            pending = None  # a marker belongs to the block right after it
        i += 1
    return out


def commands_of(block: Block) -> list[Command]:
    out: list[Command] = []
    lines = iter(block.text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\"):
                text = text[:-1] + " " + next(lines).strip()
            out.append(Command(text))
        elif line.strip() and out:
            out[-1].expected.append(line.strip())
        elif line.strip():
            raise AssertionError(f"{block.page.name}:{block.line}: output before any command: {line!r}")
    return out


def _squeeze(text: str) -> str:
    return " ".join(text.split())


class Scratch:
    """A scratch directory for one page, and the processes its blocks start."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        shutil.copytree(ROOT / "conf", tmp / "conf")
        (tmp / "scripts").symlink_to(ROOT / "scripts")
        bin_dir = tmp / "bin"
        for wrapper, target in (
            (bin_dir / "gateway", f'exec "{sys.executable}" -m gateway "$@"'),
            (tmp / ".venv" / "bin" / "gateway", f'exec "{sys.executable}" -m gateway "$@"'),
            (bin_dir / "python3", f'exec "{sys.executable}" "$@"'),
        ):
            wrapper.parent.mkdir(parents=True, exist_ok=True)
            wrapper.write_text(f"#!/bin/sh\n{target}\n")
            wrapper.chmod(0o755)
        self.env = dict(os.environ)
        self.env["PATH"] = f"{bin_dir}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
        self.substitutions: dict[str, str] = {}

    def start(self, args: list[str], port: int, log: str) -> None:
        with (self.dir / f"{log}.out").open("wb") as out, (self.dir / f"{log}.err").open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", *args], cwd=self.dir, env=self.env, stdout=out, stderr=err
            )
        self.procs.append(proc)
        try:
            wait_port(port, timeout=20, proc=proc)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{log} did not start: {exc}\n{(self.dir / f'{log}.err').read_text()}") from None

    def run_gateway(self, config: str, demo_upstream: bool) -> None:
        path = self.dir / config
        data = yaml.safe_load(path.read_text())
        port, admin = free_port(), free_port()
        data["listen"] = f"127.0.0.1:{port}"
        data.setdefault("admin", {})["listen"] = f"127.0.0.1:{admin}"
        data["pid"] = f"{path.stem}.pid"  # beside the config: the CLI finds it from -c
        if demo_upstream:
            upstreams = [free_port(), free_port()]
            listen = [arg for p in upstreams for arg in ("--listen", f"127.0.0.1:{p}")]
            self.start(["demo-upstream", *listen], upstreams[-1], "demo-upstream")
            data["upstreams"]["app"]["servers"] = [f"127.0.0.1:{p}" for p in upstreams]
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        self.start(["run", "-c", config], port, "gateway")
        self.substitutions.update(
            {"localhost:8080": f"127.0.0.1:{port}", "127.0.0.1:8080": f"127.0.0.1:{port}", ":9180": f":{admin}"}
        )

    def run(self, command: Command, replace: dict[str, str], where: str) -> None:
        text = command.text
        for old, new in {**self.substitutions, **replace}.items():
            text = text.replace(old, new)
        done = subprocess.run(
            ["bash", "-c", text], cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=180
        )
        output = done.stdout + done.stderr
        assert done.returncode == command.status, (
            f"{where}: `{text}` exited {done.returncode}, not {command.status}:\n{output}"
        )
        for line in command.expected:
            pattern = ".*?".join(re.escape(part) for part in _squeeze(line).split("..."))
            assert re.search(pattern, _squeeze(output)), f"{where}: `{text}` did not print {line!r}:\n{output}"

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
        self.substitutions.clear()


PAGES_WITH_COMMANDS = [page for page in PAGES if any(b.language == "console" for b in marked_blocks(page))]


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Scratch]:
    s = Scratch(tmp_path)
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_of_a_page_run_as_shown(page: Path, scratch: Scratch) -> None:
    for block in marked_blocks(page):
        where = f"{page.relative_to(ROOT)}:{block.line}"
        if "file" in block.options:
            (scratch.dir / block.options["file"]).write_text(block.text)
            continue
        assert block.language == "console", f"{where}: a docs-test marker on a {block.language!r} block needs file"
        if "gateway" in block.options:
            scratch.run_gateway(block.options["gateway"], bool(block.options.get("demo_upstream")))
        commands = commands_of(block)
        assert commands, f"{where}: a marked block without a $ command"
        for command in commands:
            scratch.run(command, block.options.get("replace", {}), where)
        scratch.close()  # the next block starts its own gateway


def test_the_commands_the_issue_asks_for_are_run() -> None:
    """check, import-nginx, replay, reload, ban, bans and unban appear in marked blocks."""
    ran = " ".join(
        command.text
        for page in PAGES
        for block in marked_blocks(page)
        if block.language == "console"
        for command in commands_of(block)
    )
    for name in ("check", "import-nginx", "replay", "reload", "ban", "bans", "unban"):
        assert f"gateway {name} " in ran, f"no marked docs block runs `gateway {name}`"
