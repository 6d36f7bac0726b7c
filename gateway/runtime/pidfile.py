"""The pid file: where the running gateway's (or master's) process id is, for ``kill -HUP``,
``gateway reload`` and ``gateway stop``.

``pid:`` in the config names it (a relative path is taken from the config file's
directory, so the server and the CLI agree whatever their working directory);
``pid: off`` disables it. The default is one path per config file, in the runtime
directory: ``$XDG_RUNTIME_DIR/gateway/<config name>-<hash of its absolute path>.pid``,
else ``<tmp>/gateway-<uid>/...`` (the directory of the generated admin token). nginx
uses one fixed path; one per config file keeps that property for each config (the CLI
finds it from ``-c`` alone) while two gateways with different configs never collide.

At start the file is checked before anything binds: if it names a live gateway process
the start is refused; a stale one (no such process, or not a gateway) is taken over. It is
written once the listeners are bound, and removed at exit if it still holds our pid.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat

from gateway.errors import GatewayError
from gateway.files import make_private_dir


class PidFileError(GatewayError):
    """The pid file cannot be used, or names a gateway that is running; the message says which."""


def read(path: str) -> int | None:
    """The pid in ``path``; None when there is no such file. PidFileError when it is unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            text = handle.read(64).strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PidFileError(f"cannot read the pid file {path}: {exc.strerror}") from None
    if not text.isdigit() or int(text) <= 0:
        raise PidFileError(f"the pid file {path} does not hold a process id")
    return int(text)


def is_gateway(pid: int) -> bool:
    """Whether ``pid`` is a live process running the gateway."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"gateway" in handle.read()
    except OSError:
        return True  # no /proc: alive is all we know


def running(path: str) -> int:
    """The pid of the gateway named by ``path``; PidFileError when none runs."""
    pid = read(path)
    if pid is None:
        raise PidFileError(f"no pid file at {path}: is the gateway running (with this config or --pid)?")
    if not is_gateway(pid):
        raise PidFileError(f"the pid file {path} names process {pid}, which is not a running gateway (stale)")
    return pid


def check_free(path: str) -> None:
    """Refuse to start when ``path`` names a running gateway (other than us)."""
    try:
        pid = read(path)
    except PidFileError:
        return  # garbage: taken over
    if pid is not None and pid != os.getpid() and is_gateway(pid):
        raise PidFileError(
            f"another gateway is running (pid {pid}, pid file {path}); stop it first (gateway stop), "
            "or give this one its own pid: path"
        )


def write(path: str) -> bool:
    """Write our pid atomically (a temp file + rename, neither following a symlink); returns
    whether a stale file was replaced. The directory is created 0700 when missing, and refused
    when others can write it or own it (a neighbour could swap the file in a shared /tmp)."""
    directory, name = os.path.split(path)
    try:
        make_private_dir(directory)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise PidFileError(f"cannot use {directory} for the pid file: {exc.strerror}") from None
    try:
        st = os.fstat(dir_fd)
        if st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_uid != os.getuid()):
            raise PidFileError(
                f"refusing to write the pid file in {directory}: others can write that directory "
                f"(mode {stat.S_IMODE(st.st_mode):04o})"
            )
        if st.st_uid not in (os.getuid(), 0):  # its owner could swap the file under us
            raise PidFileError(
                f"refusing to write the pid file in {directory}: it is owned by uid {st.st_uid}, "
                f"not by this user (uid {os.getuid()}) nor root"
            )
        stale = _exists(name, dir_fd)
        temp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o644, dir_fd=dir_fd)
        try:
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        raise PidFileError(f"cannot write the pid file {path}: {exc.strerror}") from None
    finally:
        os.close(dir_fd)
    return stale


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def remove(path: str) -> None:
    """Remove ``path`` if it still holds our pid (a newer gateway may have taken it over)."""
    with contextlib.suppress(OSError, PidFileError):
        if read(path) == os.getpid():
            os.unlink(path)
