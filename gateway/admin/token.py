"""The admin API's generated token: where it lives, and how it is written, read and removed.

With no ``admin.token`` configured, the process that serves the admin API uses the
token in ``admin.token_file`` (default: ``admin-<port>.token`` in the runtime directory,
``gateway/config/paths.py``), or makes a random one there when there is none (readable by
its user only). The file outlives the process: a restart keeps the token, so a scraper's
``credentials_file`` and the status page's session stay valid, until the file is deleted
or ``gateway token --rotate`` writes a new one (the running gateway takes it at its next
admin call: ``Current``). The CLI reads it from there. The file's directory must be ours
and writable by nobody else, or someone could swap the file (a symlink or a planted token
in a shared /tmp): such a directory is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass, field

from gateway.config.paths import runtime_dir
from gateway.config.validate import valid_token
from gateway.files import make_private_dir

TOKEN_BYTES = 32
MAX_TOKEN_FILE = 4096


class TokenFileError(Exception):
    """The token file cannot be used; the message says why, for an operator."""


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def default_token_path(port: int) -> str:
    """``admin-<port>.token`` in the runtime directory (``$XDG_RUNTIME_DIR/gateway``, else
    ``<tmp>/gateway-<uid>``, or the private fallback when that one is not ours)."""
    return os.path.join(runtime_dir().path, f"admin-{port}.token")


def token_path(configured: str | None, port: int) -> str:
    return configured or default_token_path(port)


def publish(path: str, token: str) -> None:
    """Write ``token`` to ``path`` atomically (temp file + rename in the same directory), mode 0600."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _open_private_dir(directory, create=True)
    temp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, token.encode("ascii") + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise TokenFileError(f"cannot write the admin token file {path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)


def load_or_create(path: str) -> tuple[str, bool]:
    """The token in ``path``, or a new one written there when the file is missing or unusable (not a
    token, or writable by others); returns (token, whether it is new). TokenFileError: the
    directory cannot be used."""
    try:
        return read(path), False
    except TokenFileError:
        pass  # missing or unusable: replaced (publish refuses a directory that is not ours)
    return rotate(path), True


def rotate(path: str) -> str:
    """Write a new token to ``path`` and return it."""
    token = new_token()
    publish(path, token)
    return token


@dataclass
class Current:
    """The token a running admin API accepts: the one in its file, re-read when the file changes
    (``gateway token --rotate``); a file that is gone or unusable keeps the last good token."""

    path: str
    token: str
    _seen: tuple[int, int, int] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._seen = _identity(self.path)

    def get(self) -> str:
        seen = _identity(self.path)
        if seen is not None and seen != self._seen:
            self._seen = seen
            with contextlib.suppress(TokenFileError):  # unusable: the last good token stays
                self.token = read(self.path)
        return self.token


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read(path: str) -> str:
    """The token in ``path``; the directory and the file must be ours and not writable by others."""
    directory, name = os.path.split(os.path.abspath(path))
    dir_fd = _open_private_dir(directory, create=False)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
        except FileNotFoundError:
            raise TokenFileError(f"{path} does not exist") from None
        except OSError as exc:
            raise TokenFileError(f"cannot open the admin token file {path}: {exc.strerror}") from None
        try:
            _check_private(os.fstat(fd), path, "file")
            data = os.read(fd, MAX_TOKEN_FILE + 1)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        token = ""
    if len(data) > MAX_TOKEN_FILE or not valid_token(token):
        raise TokenFileError(f"the admin token file {path} does not hold a token")
    return token


def _open_private_dir(directory: str, *, create: bool) -> int:
    if create:
        try:
            make_private_dir(directory)
        except OSError as exc:
            raise TokenFileError(f"cannot create {directory} for the admin token: {exc.strerror}") from None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TokenFileError(f"{directory} does not exist") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, or a file where our directory should be
            raise TokenFileError(
                f"refusing to use {directory} for the admin token: it is a symbolic link or not a directory"
            ) from None
        raise TokenFileError(f"cannot open {directory}: {exc.strerror}") from None
    try:
        _check_private(os.fstat(fd), directory, "directory")
    except TokenFileError:
        os.close(fd)
        raise
    return fd


def _check_private(st: os.stat_result, path: str, what: str) -> None:
    uid = os.getuid()
    if st.st_uid != uid:
        raise TokenFileError(
            f"refusing to use {path} for the admin token: the {what} is owned by uid {st.st_uid}, not by this user "
            f"(uid {uid})"
        )
    if st.st_mode & 0o022:
        raise TokenFileError(
            f"refusing to use {path} for the admin token: the {what} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o}); it must be 0700 (directory) or 0600 (file)"
        )
