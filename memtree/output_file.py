"""Writing a file the user named, as shell redirection (``> PATH``) would, without its risks.

A backup written straight into its file would leave half a backup under the name if
the process died midway, so a *regular* file is written beside itself and renamed
over the old one in one step. That rename must not change what the name was:

- a symbolic link is followed: its target is replaced, and the link stays a link;
- a named pipe, a device (``/dev/null``, a tape) or a socket path is not a file to
  replace: the output is written through to it, as ``>`` does (renaming over
  ``/dev/full`` as root would put a regular file in ``/dev``);
- an existing file keeps its permission bits (and its owner and group where this
  user may set them); a new file gets the user's umask, not ``mkstemp``'s 0600.

:func:`output_problem`-style checks that run before any work use
:func:`resolved_target`, so they look at the folder the file will really be written in.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

NEW_FILE_MODE = 0o666
"""What ``open(..., "w")`` asks for; the kernel takes the umask off it."""


def resolved_target(path: Path) -> Path:
    """The file ``path`` names once symbolic links are followed (``path`` itself when it is none).

    A dangling link resolves to where its target would be, which is where ``>``
    would create it.
    """
    if not path.is_symlink():
        return path
    return Path(os.path.realpath(path))


STREAM_NAMES = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/")
"""Names of a process's open files (``/dev/stdout``, ``/proc/self/fd/1``): written
through even when they lead to a regular file, so ``export /dev/stdout >> log``
appends to ``log`` as the shell set it up instead of replacing it."""


def writes_through(path: Path) -> bool:
    """Whether ``path`` is written to in place and never replaced: it exists (links
    followed) and is not a regular file or a folder (a pipe, a device, a socket), or
    it names a stream this process has open (:data:`STREAM_NAMES`)."""
    if os.path.abspath(path).startswith(STREAM_NAMES):
        return path.exists()
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def write_output(path: str | os.PathLike[str], chunks: Iterable[str]) -> None:
    """Write the text ``chunks`` (UTF-8, ``\\n`` line ends) to the file ``path``.

    A regular file (new or existing, through any symbolic links) is replaced
    atomically: an interrupted write leaves the old file or none, never half a new
    one. Anything else (a pipe, a device) is written to in place. See the module
    docstring for links, modes and owners.
    """
    given = Path(path)
    if writes_through(given):
        # A stream name reopens a file the shell set up: truncating it would undo ``>>``.
        mode = "a" if os.path.abspath(given).startswith(STREAM_NAMES) else "w"
        with open(given, mode, encoding="utf-8", newline="\n") as stream:
            for chunk in chunks:
                stream.write(chunk)
        return
    _replace_atomically(resolved_target(given), chunks)


def _replace_atomically(path: Path, chunks: Iterable[str]) -> None:
    try:
        old: os.stat_result | None = path.stat()
    except FileNotFoundError:
        old = None
    folder = path.parent if str(path.parent) else Path(".")
    handle, temporary = _create_beside(path, folder)
    try:
        if old is not None:
            _copy_ownership(handle, old)
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as stream:
            for chunk in chunks:
                stream.write(chunk)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync_folder(folder)


def _create_beside(path: Path, folder: Path) -> tuple[int, Path]:
    """A new, empty temporary file in ``folder``, created with the umask's mode
    (``mkstemp`` would make it 0600, and the rename would keep that)."""
    for _ in range(100):
        temporary = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, NEW_FILE_MODE), temporary
        except FileExistsError:
            continue
    raise FileExistsError(f"could not find a free temporary name beside {path}")


def _copy_ownership(handle: int, old: os.stat_result) -> None:
    """Give the new file the replaced file's permission bits, owner and group.

    The owner can only be changed by root (and the group only to one of the user's
    groups): where it cannot, the file is this user's, as any file they write is.
    """
    with contextlib.suppress(PermissionError):
        if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
            os.fchown(handle, old.st_uid, old.st_gid)
    os.fchmod(handle, stat.S_IMODE(old.st_mode))


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (best effort: some file systems refuse it)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
