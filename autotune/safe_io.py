"""The one writer of the files peagle-tune is asked to write (``export --out``, ``report --out``: the page and its
figures).

`write_file` writes a file whole or not at all, never through a symbolic link and never over anything but a regular
file, with the same ``--force`` rule everywhere, and names the path in every error:

- an existing path (a file, or a link even when it dangles) is refused without `force`; with it, a link is replaced
  by the new file (its target, maybe someone else's file, is untouched and a dangling one is not created);
- a directory, device, FIFO or socket at the path is refused even with `force` (``--out /dev/full --force`` must not
  replace the device with a file);
- the bytes go to a new file beside the path (``O_EXCL | O_NOFOLLOW``), are synced, and the file is renamed over the
  path: a reader, a full disk or a crash never sees half a file;
- an OS error (full disk, permissions) is one line naming the path and the reason.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from autotune.errors import PeagleError, UsageError

#: What a path holds, for the refusal of non-regular files.
_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def check_target(path: Path, *, force: bool, option: str = "--out") -> None:
    """Raise `UsageError` unless `write_file` may write `path`: its folder exists, and nothing is there, or with
    `force` a regular file or a symbolic link (to be replaced, not followed). Callers that write several files
    check them all first, so a refusal leaves every one of them as it was."""
    try:
        info: os.stat_result | None = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:
        raise PeagleError(f"{option} {path}: cannot check it ({exc.strerror or exc}).") from exc
    if info is not None:
        mode = info.st_mode
        if stat.S_ISLNK(mode):
            if not force:
                raise UsageError(
                    f"{option} {path} is a symbolic link (to {os.readlink(path)}); pass --force to replace the link "
                    "with a new file (its target is left alone), or choose another path."
                )
        elif stat.S_ISDIR(mode):
            raise UsageError(f"{option} {path} is a directory; give a file path.")
        elif not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise UsageError(
                f"{option} {path} is {kind}, not a regular file; peagle-tune writes only regular files: choose "
                "a file path."
            )
        elif not force:
            raise UsageError(f"{option} {path} exists; pass --force to replace it, or choose another path.")
    folder = path.parent
    if not folder.is_dir():
        problem = "is not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"{option} {path}: {folder} {problem}; create the folder or choose another path.")


def write_file(path: str | Path, data: str | bytes, *, force: bool, option: str = "--out") -> None:
    """Write `data` (text as UTF-8) to `path` under the rules of the module docstring.

    Raises `UsageError` for a path it may not write (see `check_target`) and `PeagleError` naming the path for an
    OS error while writing, after which the path is as it was.
    """
    path = Path(path)
    check_target(path, force=force, option=option)
    payload = data.encode("utf-8", errors="replace") if isinstance(data, str) else data
    folder = path.parent
    try:
        # The folder is opened once and every step below is relative to it, so it cannot be swapped midway.
        dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise PeagleError(f"{option} {path}: cannot write in {folder} ({exc.strerror or exc}).") from exc
    try:
        _write_replace(dir_fd, path, payload, option)
    finally:
        os.close(dir_fd)


def _write_replace(dir_fd: int, path: Path, payload: bytes, option: str) -> None:
    temporary = f".{path.name[:100]}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(temporary, flags, 0o666, dir_fd=dir_fd)
    except OSError as exc:
        raise PeagleError(f"{option} {path}: cannot write in {path.parent} ({exc.strerror or exc}).") from exc
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise PeagleError(
            f"{option} {path}: cannot write it ({exc.strerror or exc}); nothing was changed."
        ) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        os.fsync(dir_fd)
