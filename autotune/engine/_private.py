"""Private per-user directories for the files peagle-tune hands to vLLM, and writes that never follow a link.

On a host shared by several users, a predictable name in ``/tmp`` belongs to whoever creates it first: a folder
pre-created world-writable (0777), or a ``plugin.json`` symlink planted in it, would make peagle-tune write into
another user's files or make vLLM load another user's drafter. So every directory we write into is either created
here with mode 0700 or checked: a real directory (not a symlink), owned by this user, writable by no one else, and
not inside a world-writable directory without the sticky bit (where anyone could swap it). Files are written to a
fresh temporary file in the same directory (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600) and renamed over the
target with `os.replace`, which replaces a symlink instead of following it.

The per-user root is ``<tmp>/ptune-<uid>`` (`user_private_root`; ``TMPDIR`` moves it). Its name is predictable on
purpose (``--dry-run`` prints the exact paths, and nothing is created before a launch); if someone else took it,
the check refuses it with a message saying what to do.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from autotune.errors import PrivateDirectoryError

PRIVATE_MODE = 0o700
"""Mode of the directories peagle-tune creates for its run files (only their owner may enter them)."""


def current_uid() -> int:
    """This process's user id (-1 where the platform has none; then ownership is not checked)."""
    getuid = getattr(os, "getuid", None)
    return int(getuid()) if getuid is not None else -1


def user_private_root(base: str | Path | None = None) -> Path:
    """``<tmp>/ptune-<uid>``: the per-user directory of serve run directories and drafter aliases (not created here).

    ``base``: the parent (default: `tempfile.gettempdir`, i.e. ``TMPDIR`` or /tmp).
    """
    parent = Path(base) if base is not None else Path(tempfile.gettempdir())
    return parent / f"ptune-{current_uid()}"


def ensure_private_dir(path: Path, *, fix: str, parents: bool = True) -> bool:
    """Create `path` with mode 0700, or accept an existing one only if it is private; True when created now.

    ``parents``: create missing parent directories as ordinary directories (the user chose where; only the last
    component holds our files). ``fix`` ends every error message: what the user can do instead. Raises
    `PrivateDirectoryError` (one line naming the path and the problem) for a symlink, a non-directory, a directory
    owned by another user or writable by group/others, or any OSError.
    """
    path = Path(path)
    created = False
    try:
        if parents:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except FileExistsError as exc:  # pathlib's word for "a file is in the way"
                raise PrivateDirectoryError(
                    f"{exc.filename or path.parent}: exists and is not a directory; {fix}."
                ) from None
        try:
            os.mkdir(path, PRIVATE_MODE)
            created = True
        except FileExistsError:
            pass
        check_private_dir(path, fix=fix)
    except OSError as exc:
        raise PrivateDirectoryError(os_error_line(exc, path, fix)) from None
    return created


def check_private_dir(path: Path, *, fix: str) -> None:
    """Raise `PrivateDirectoryError` unless `path` is a directory (not a symlink) of this user that no one else may
    write, in a parent that no one else may swap it out of (world-writable without the sticky bit)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        if os.path.islink(path):
            raise PrivateDirectoryError(
                f"{path} is a symbolic link (to {os.readlink(path)}); peagle-tune does not follow links for the "
                f"files it writes: {fix}."
            ) from None
        raise
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    uid = current_uid()
    if uid >= 0 and info.st_uid != uid:
        raise PrivateDirectoryError(
            f"{path} belongs to {_user_name(info.st_uid)}, not to you ({_user_name(uid)}); another user could "
            f"replace the files peagle-tune writes there: {fix}."
        )
    if info.st_mode & 0o022:
        who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if info.st_mode & bit)
        raise PrivateDirectoryError(
            f"{path} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o}); another user could replace the "
            f"files peagle-tune writes there: run `chmod go-w {path}`, or {fix}."
        )
    parent = os.stat(path.parent)
    if parent.st_mode & 0o002 and not parent.st_mode & stat.S_ISVTX:
        raise PrivateDirectoryError(
            f"{path} is in {path.parent}, which anyone may write (mode {stat.S_IMODE(parent.st_mode):04o}) and "
            f"which has no sticky bit, so another user could swap the directory: {fix}."
        )


def write_private_file(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically without following a link: a fresh temporary file in the same
    directory (``O_EXCL | O_NOFOLLOW``, mode 0600), renamed over `path` (a symlink there is replaced, not
    followed). Raises OSError; the directory should have passed `check_private_dir`."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_entry(path: Path) -> None:
    """Remove `path` without following a link: a symlink or file is unlinked, a real directory removed with its
    content (`shutil.rmtree` does not follow links inside). Nothing happens when it does not exist."""
    import shutil

    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def os_error_line(exc: OSError, path: Path, fix: str = "") -> str:
    """One line naming the path and the problem of an OSError, e.g. ``/run/x: Permission denied``."""
    where = exc.filename if exc.filename is not None else path
    what = exc.strerror or type(exc).__name__
    line = f"{where}: {what}"
    if exc.filename2 is not None:
        line += f" (renaming to {exc.filename2})"
    return f"{line}; {fix}." if fix else f"{line}."


def _user_name(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
