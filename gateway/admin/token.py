"""The admin API's generated token: where it lives, and how it is written, read and removed.

With no ``admin.token`` configured, the process that serves the admin API makes a
random token at start, writes it to ``admin.token_file`` (readable by its user
only) and removes it at exit; the CLI reads it from there. The file's directory
must be ours and writable by nobody else, or someone could swap the file (a
symlink or a planted token in a shared /tmp): such a directory is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile

from gateway.config.validate import valid_token

TOKEN_BYTES = 32
MAX_TOKEN_FILE = 4096


class TokenFileError(Exception):
    """The token file cannot be used; the message says why, for an operator."""


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def default_token_path(port: int) -> str:
    """``$XDG_RUNTIME_DIR/gateway/admin-<port>.token``, else ``<tmp>/gateway-<uid>/admin-<port>.token``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "gateway", f"admin-{port}.token")
    return os.path.join(tempfile.gettempdir(), f"gateway-{os.getuid()}", f"admin-{port}.token")


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


def withdraw(path: str, token: str) -> None:
    """Remove ``path`` if it still holds ``token`` (a newer process may have replaced it)."""
    try:
        if read(path) == token:
            directory, name = os.path.split(os.path.abspath(path))
            dir_fd = _open_private_dir(directory, create=False)
            try:
                os.unlink(name, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)
    except (TokenFileError, OSError):
        pass


def _open_private_dir(directory: str, *, create: bool) -> int:
    if create:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
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
