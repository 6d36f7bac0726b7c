"""Reading a file that the configuration names, within a bound, and never blocking on it; and
creating a private directory (every missing component mode 0700).

A configuration names files (``access.deny_file``, certificates, CA bundles, the
configuration itself, the files an nginx configuration includes), and whoever wrote it
may name ``/dev/zero``, a FIFO or a 40 GB log by mistake or on purpose. Each is read here:

* ``os.stat`` first: anything that is not a regular file (a device, a FIFO, a socket, a
  directory) is refused before it is opened, and so is a file larger than the bound;
* then ``open`` with ``O_NONBLOCK``, so a file swapped for a FIFO in between cannot block
  the open, and ``fstat`` on what was opened, the same two checks again;
* then at most ``limit + 1`` bytes are read, so a file that grew since is refused too.

A refusal is ``FileRefused``, an ``OSError`` whose ``strerror`` says why in words, so the
callers' ``except OSError`` handlers report it like a missing file, at the key naming it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

MIB = 1024 * 1024

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(OSError):
    """A file that is not read: not a regular file, or over its bound (``strerror`` says which)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EINVAL, message)


class FileTooLarge(FileRefused):
    """A regular file over its bound."""


def size_text(limit: int) -> str:
    """``limit`` bytes in the unit it was chosen in: ``64 MiB``, ``512 KiB``, ``100 bytes``."""
    if limit >= MIB and limit % MIB == 0:
        return f"{limit // MIB} MiB"
    if limit >= 1024 and limit % 1024 == 0:
        return f"{limit // 1024} KiB"
    return f"{limit} bytes"


def too_large(limit: int) -> FileTooLarge:
    return FileTooLarge(f"larger than {size_text(limit)}, the bound for this file")


def _check(st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        raise FileRefused(f"not a regular file ({kind})")
    if st.st_size > limit:
        raise too_large(limit)


def open_regular(path: str, limit: int) -> BinaryIO:
    """``path`` opened for reading in binary, when it is a regular file of at most ``limit`` bytes.

    Raises ``FileRefused`` otherwise, and ``OSError`` when it cannot be opened. Never blocks.
    """
    _check(os.stat(path), limit)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        _check(os.fstat(fd), limit)
        return os.fdopen(fd, "rb", buffering=1 << 16)
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str, limit: int) -> bytes:
    """All of ``path``, a regular file of at most ``limit`` bytes; raises ``FileRefused`` or ``OSError``."""
    with open_regular(path, limit) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # it grew after fstat
        raise too_large(limit)
    return data


def bounded_lines(handle: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of ``handle`` (a file or a pipe such as stdin); ``FileRefused`` past ``limit`` bytes in all."""
    left = limit
    while True:
        line = handle.readline(left + 1)
        if not line:
            return
        left -= len(line)
        if left < 0:
            raise too_large(limit)
        yield line


def make_private_dir(path: str) -> None:
    """Create ``path`` mode 0700, and each of its missing parents mode 0700 too (``os.makedirs``
    gives the parents the umask's mode); an existing one is left as it is, for the caller to
    check. Raises OSError."""
    missing = []
    current = os.path.abspath(path)
    while current and not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
