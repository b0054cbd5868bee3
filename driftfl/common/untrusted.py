"""Files of a run directory that someone else may have made: read within bounds, never written
through a symbolic link.

- ``read_text`` reads a regular file only (not a link, a device, a pipe), at most a cap of
  bytes: /dev/zero or a 10 GB metrics.json is refused in one line, not read until memory runs out.
- ``refuse_links`` refuses, before anything is written, an output path that is a symbolic link
  (a victim file it points at stays untouched); ``replaced`` then writes by a new file renamed
  over the name, so a link that appears meanwhile is replaced, never followed.
- ``npz_arrays`` reads the shapes and dtypes an .npz archive declares (its .npy headers) without
  inflating any array, so that memory can be bounded before anything is loaded.

Messages name the file, never its contents.
"""

from __future__ import annotations

import os
import stat
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

import numpy as np

MAX_TEXT = 64 * 2**20  # bytes of a config.yaml, metrics.json, summary.json, ... read at most


class UnsafeFile(ValueError):
    """A file that is not read or written as it is (the message names it and says why)."""


def mib(size: int) -> str:
    return f"{size / 2**20:.0f} MiB" if size >= 2**20 else f"{size} bytes"


def regular_bytes(path: Path, limit: int, links: bool = False) -> bytes | str:
    """The bytes of the regular file ``path``, or what it is instead: "link" (unless ``links``
    may be followed), "not regular" (a device, a pipe, a folder), "too large" (over ``limit``
    bytes, of which no more are read); OSError where it cannot be opened."""
    if not links and os.path.islink(path):
        return "link"
    # O_NOFOLLOW: a link that appears after the check is not followed either; O_NONBLOCK: a
    # named pipe does not block the open
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if links else os.O_NOFOLLOW))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not regular"
        data = f.read(limit + 1)
    return "too large" if len(data) > limit else data


def read_bytes(path: Path, limit: int = MAX_TEXT) -> bytes:
    """The bytes of the regular file ``path``: UnsafeFile for a link, anything but a regular
    file, or more than ``limit`` bytes; OSError where it cannot be opened."""
    data = regular_bytes(path, limit)
    if data == "link":
        raise UnsafeFile(f"{path} is a symbolic link; driftfl reads no file of a run directory "
                         "through one (put the file itself in its place)")
    if data == "not regular":
        raise UnsafeFile(f"{path} is not a regular file (a device, a pipe or a folder); "
                         "driftfl reads only files it wrote")
    if data == "too large":
        raise UnsafeFile(f"{path} holds more than {mib(limit)}, more than driftfl ever writes "
                         "there; it is not a file of a run")
    return data


def read_text(path: Path, limit: int = MAX_TEXT) -> str:
    """``read_bytes`` as UTF-8 text (UnsafeFile where it is not)."""
    try:
        return read_bytes(path, limit).decode()
    except UnicodeDecodeError:
        raise UnsafeFile(f"{path} is not UTF-8 text") from None


def refuse_links(*paths: Path) -> None:
    """UnsafeFile for the first of ``paths`` (files to be written, or folders they go into)
    that is a symbolic link: driftfl never writes through one."""
    for path in paths:
        if os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link; driftfl never writes through one "
                             "(remove the link, or choose another directory)")


@contextmanager
def replaced(path: Path, mode: str = "w", **kwargs) -> Iterator[IO]:
    """An open file whose contents become ``path`` once the block ends (renamed over it: a link
    at ``path`` is replaced, its target untouched); nothing is left where the block fails."""
    fd, partial = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.")
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
        os.chmod(partial, 0o644 & ~_umask())
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def write_text(path: Path, text: str) -> None:
    with replaced(path) as f:
        f.write(text)


@contextmanager
def replaced_path(path: Path) -> Iterator[Path]:
    """A fresh path to write (e.g. matplotlib's savefig) that becomes ``path`` at the end."""
    suffix = Path(path).suffix  # savefig reads the format from it
    fd, partial = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.",
                                   suffix=suffix)
    os.close(fd)
    try:
        yield Path(partial)
        os.chmod(partial, 0o644 & ~_umask())
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def npz_arrays(source: str | Path | IO[bytes], limit: int,
               compressed: bool = True) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array of an .npz archive by name, with its shape and dtype as its .npy header
    declares them, read without inflating any array (only the headers). UnsafeFile (a phrase
    to follow the archive's name: "declares ...", "is not ...") where a
    member declares more than its header says (or is not an .npy array), where one is
    compressed but ``compressed`` is False (or other than by deflate, whose output is cut at the
    declared size), or where all of them together declare more than ``limit`` bytes."""
    found = {}
    try:
        with zipfile.ZipFile(source) as archive:
            members = archive.infolist()  # the central directory only: nothing inflated yet
            total = sum(info.file_size for info in members)
            if total > limit:
                raise UnsafeFile(f"declares {mib(total)} of arrays, more than the "
                                 f"{mib(limit)} it can hold here")
            allowed = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) if compressed else (
                zipfile.ZIP_STORED,)
            for info in members:
                if info.compress_type not in allowed:
                    raise UnsafeFile(f"has a member {info.filename!r:.60} compressed in a way "
                                     "driftfl never writes")
            for info in members:
                with archive.open(info) as member:
                    version = np.lib.format.read_magic(member)
                    shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                       else np.lib.format.read_array_header_2_0)(member)
                    header = member.tell() if member.seekable() else None
                size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if dtype.hasobject or header is None or header + size != info.file_size:
                    raise UnsafeFile(f"has a member {info.filename!r:.60} whose size is not "
                                     "that of the array it declares")
                found[info.filename.removesuffix(".npy")] = (tuple(shape), dtype)
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as err:
        if isinstance(err, UnsafeFile):
            raise
        raise UnsafeFile(f"is not an .npz archive of arrays ({type(err).__name__})") \
            from None
    return found
