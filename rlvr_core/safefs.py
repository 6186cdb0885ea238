"""Files in a run folder, written without following symbolic links (docs/design.md §8.7).

A run folder's name can come from someone else (a deployment parameter, a shared machine's folder), and
a file planted in it, ``run.lock -> /root/.ssh/authorized_keys``, would make an ordinary ``open(path,
"w")`` truncate and overwrite what the link points at, with the rights of the user who runs the training.
Every write here goes through a descriptor of the folder itself:

- ``open_folder`` resolves the folder's path once and opens what it resolved to with ``O_DIRECTORY |
  O_NOFOLLOW`` (a link swapped in meanwhile is refused), then refuses a folder that the running user does
  not own, or that every user may write (anyone who can write the folder can plant names in it). Every
  file is then opened relative to that descriptor, so a later swap of the path changes nothing.
- ``write_atomic`` creates a fresh temporary name with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to that
  descriptor and renames it over the target (``rename`` replaces a planted link, it never writes through
  it).
- ``open_in`` opens one file in the folder with ``O_NOFOLLOW``: for the lock and for appends.
- ``append_line`` appends all of a line or none of it: a write cut short (a full disk) is cut back off the
  file (``ftruncate`` to the size before) and its OSError raised. ``write_all`` is the loop every write of
  the project's files goes through: ``os.write`` may write a prefix only, and the rest is written again.
- ``set_aside`` renames a damaged file to a free name beside it (``rollouts.parquet.damaged``), so that
  nothing is deleted.

Linux and macOS both have ``O_NOFOLLOW`` and ``dir_fd``. The folder's path may pass through links
(``runs -> /scratch/runs``): what counts is the folder it reaches, and that no file in it is a link.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rlvr_core.errors import ConfigError


class UnsafeRunFolder(ConfigError):
    """A run folder (or a file in it) that is a link, belongs to another user, or that every user may write."""


def _check_folder(fd: int, folder: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise UnsafeRunFolder(f"{folder}: belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); a run "
                              "writes only into folders it owns: use another folder")
    if st.st_mode & 0o002:
        raise UnsafeRunFolder(f"{folder}: every user may write it ({stat.filemode(st.st_mode)}), so anyone could "
                              f"plant links in it; `chmod o-w {folder}` or use another folder")


def open_folder(folder: str | os.PathLike, create: bool = True) -> int:
    """A descriptor of ``folder`` (created, with its parents, when missing and ``create``), resolved once and
    opened without following a link; UnsafeRunFolder unless this user owns it and not every user may write it."""
    folder = Path(folder)
    if create:
        folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    real = os.path.realpath(folder)  # a link to a folder of this user's is fine: the checks are on the folder
    try:
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:  # ELOOP: swapped for a link since it was resolved
        raise UnsafeRunFolder(f"{folder}: cannot be opened as a folder ({e.strerror})") from None
    try:
        _check_folder(fd, folder)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextmanager
def folder_fd(folder: str | os.PathLike, create: bool = True) -> Iterator[int]:
    """``open_folder`` as a context: the descriptor is closed on leaving."""
    fd = open_folder(folder, create)
    try:
        yield fd
    finally:
        os.close(fd)


def _refuse_link(dir_fd: int, name: str, where: Path) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeRunFolder(f"{where / name}: a symbolic link was planted here; the run never writes through "
                              "one: remove it")


def open_in(dir_fd: int, name: str, flags: int, where: str | os.PathLike = "", mode: int = 0o644) -> int:
    """``os.open(name, flags | O_NOFOLLOW)`` relative to the folder ``dir_fd``; UnsafeRunFolder (naming
    ``where``/``name``) when ``name`` is a symbolic link."""
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} must be a plain file name")
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as e:
        _refuse_link(dir_fd, name, Path(where))  # ELOOP (Linux) / EMLINK (BSD): say it was a link
        raise e


def write_atomic(path: str | os.PathLike, data: bytes, *, fsync: bool = False, mode: int = 0o644,
                 create_folder: bool = True) -> None:
    """Write ``data`` to ``path`` atomically: a fresh temporary name created with O_EXCL | O_NOFOLLOW in
    ``path``'s folder (held open by descriptor), renamed over ``path``. A link planted at ``path`` is
    replaced, never written through; the folder must pass ``open_folder``'s checks. ``fsync``: the file is
    fsynced before the rename and the folder after it, so that a crash or power loss leaves the old
    content or the new one, whole."""
    path = Path(path)
    with folder_fd(path.parent, create_folder) as dfd:
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = open_in(dfd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, path.parent, mode)
        try:
            try:
                write_all(fd, data)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            if fsync:
                os.fsync(dfd)  # the rename itself
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise


def write_text_atomic(path: str | os.PathLike, text: str, **kw: bool | int) -> None:
    """``write_atomic`` of ``text`` encoded as UTF-8."""
    write_atomic(path, text.encode("utf-8"), **kw)  # type: ignore[arg-type]


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``fd``: ``os.write`` may write only a prefix (a full disk, a signal), so
    it is called again on the rest until none is left; its OSError (ENOSPC, EDQUOT, EIO ...) is raised, and a
    write that makes no progress is ENOSPC."""
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, f"write made no progress with {len(view)} bytes left")
        view = view[n:]


def append_line(path: str | os.PathLike, line: str, *, fsync: bool = False) -> None:
    """Append ``line`` (UTF-8) to ``path``, created when missing, opened without following a link. All of it
    or none: when a write fails part-way (a full disk) or the fsync fails, the file is cut back to its size
    before the append and the OSError is raised, so the file holds only whole lines (a resume that reads a
    line cut short, with the next one glued on, would refuse the file)."""
    path = Path(path)
    with folder_fd(path.parent) as dfd:
        fd = open_in(dfd, path.name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, path.parent)
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, line.encode("utf-8"))
                if fsync:
                    os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, size)  # shrinking needs no space
                except OSError as cut:
                    e.add_note(f"{path}: could not be cut back to {size} bytes ({cut.strerror}); its last line "
                               "may be incomplete")
                if e.filename is None:
                    e.filename = str(path)
                raise
        finally:
            os.close(fd)


def set_aside(path: str | os.PathLike, suffix: str = ".damaged") -> Path:
    """Rename ``path`` to the first free name of ``<name><suffix>``, ``<name><suffix>.1``, ... in its folder,
    through the folder's descriptor (a link is renamed as a link, never followed; nothing is overwritten), and
    fsync the folder; returns the new path."""
    path = Path(path)
    with folder_fd(path.parent, create=False) as dfd:
        for i in range(1000):
            name = f"{path.name}{suffix}" + (f".{i}" if i else "")
            try:
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                os.rename(path.name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                os.fsync(dfd)
                return path.with_name(name)
    raise FileExistsError(f"{path}: {path.name}{suffix}.1 ... .999 all exist; clear them to set another aside")


__all__ = ["UnsafeRunFolder", "append_line", "folder_fd", "open_folder", "open_in", "set_aside", "write_all",
           "write_atomic", "write_text_atomic"]


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (a policy's weights are not held in memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
