"""Reading a file that a running physjax writer may be appending to.

A run writes each frame by opening, appending to and closing its file. While it appends it
holds HDF5's file lock, and a reader that opens the file then is refused
(``BlockingIOError``, "unable to lock file"). A writer that finds the file held open by a
reader goes on without the lock (see [`NetCDFWriter`][physjax.io.NetCDFWriter]), and a
reader then meets the file as it grows: opened before its end is written ("truncated
file"), data beyond the end it saw ("addr overflow"), an object header or B-tree being
rewritten ("bad object header …", KeyError from h5py). Each of these passes in a moment:
[`read_retrying`][] starts the whole read again until it succeeds, and a failure that lasts
becomes one ``ValueError`` naming the file.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds a read is started again while it meets a writer's lock or a file being extended.
READ_WAIT = 5.0
#: Seconds between two tries.
_PAUSE = 0.1

#: HDF5 messages that mean another process holds the file's lock.
_LOCKED = ("unable to lock file",)
#: HDF5 messages a reader meets when a writer extends or rewrites the file under it.
_CHANGING = (
    "truncated file",  # opened before the file's new end was written
    "addr overflow",  # data (or metadata) beyond the end the reader saw
    "bad object header",  # an object header being rewritten
    "wrong b-tree signature",
    "bad symbol table",
    "bad local heap",
    "bad global heap",
    "incorrect metadata checksum",
    "unable to load",  # a piece of metadata that did not read back whole
    "can't synchronously read data",  # any failed read of a variable's values
    "can't read data",  # the same, from HDF5 before 1.14
    "can't synchronously read attribute",
)

#: errno values with which HDF5's lock fails on a file system that has no file locks
#: (ENOLCK, ENOSYS, EOPNOTSUPP, and 524, ENOTSUPP, from Lustre or NFS mounts without flock):
#: no other process holds the file, and no wait mends it.
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, 524)

#: What to do about it.
LOCKS_UNSUPPORTED = (
    "the file system does not support HDF5's file locks: set the environment variable "
    "HDF5_USE_FILE_LOCKING=FALSE (e.g. export HDF5_USE_FILE_LOCKING=FALSE) and try again"
)


def locks_unsupported(e: BaseException | None) -> bool:
    """Whether ``e`` (or an error it was raised in place of) is HDF5's failure to lock a
    file on a file system without file locks ("unable to lock file, errno = 524"), not a
    lock that another process holds."""
    seen = 0
    while e is not None and seen < 8:
        text = error_text(e).lower()
        if "unable to lock file" in text:
            found = re.search(r"errno = (\d+)", text)
            number = int(found[1]) if found else getattr(e, "errno", None)
            if number in _NO_LOCKS:
                return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


#: Words of HDF5 messages that no wait mends, though they come as a failed read: a variable
#: compressed with a filter this HDF5 lacks (zstd, blosc: an hdf5plugin not installed).
_LASTING = ("filter", "plugin")


def hidden_beside(path: str, suffix: str) -> str:
    """The hidden file ``.NAME<suffix>`` beside ``path`` (a lock, a temporary file). Where
    that name would pass the folder's limit on a name's length (255 bytes on most file
    systems) while NAME itself does not, NAME is cut and a digest of it added, so that the
    name stays the same for every process and differs between files."""
    folder, base = os.path.split(path)
    name = f".{base}{suffix}"
    try:
        limit = os.pathconf(folder or ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(name)) > limit:
        digest = hashlib.sha1(os.fsencode(base)).hexdigest()[:16]
        keep = os.fsencode(base)[: max(0, limit - len(os.fsencode(suffix)) - 18)]
        name = f".{keep.decode(errors='ignore')}~{digest}{suffix}"
    return os.path.join(folder, name)


def error_text(e: BaseException) -> str:
    """An exception's text: a ``KeyError`` (h5py's "Unable to open object") unquoted."""
    if isinstance(e, KeyError) and len(e.args) == 1 and isinstance(e.args[0], str):
        return e.args[0]
    return str(e)


def transient_error(e: BaseException) -> tuple[str, BaseException] | None:
    """``("locked", error)`` or ``("changing", error)`` when ``e`` is what a reader meets
    while a writer holds or extends the file, else ``None``.

    ``error`` is the one that first said so: ``e`` itself, or one it was raised in place of
    (``e.__context__``, also where it was raised ``from None``), such as the HDF5 error
    behind a ``ValueError("cannot read … as a NetCDF4/HDF5 file: …")``."""
    if locks_unsupported(e):  # a file system without locks: no other process holds it
        return None
    found = None
    seen = 0
    while e is not None and seen < 8:  # the chain of errors raised in place of others
        if isinstance(e, (OSError, KeyError, RuntimeError, ValueError)):
            text = error_text(e).lower()
            if (
                isinstance(e, BlockingIOError)
                or (isinstance(e, OSError) and e.errno == errno.EAGAIN)
                or any(w in text for w in _LOCKED)
            ):
                found = "locked", e
            elif any(w in text for w in _CHANGING) and not any(w in text for w in _LASTING):
                found = "changing", e
        e = e.__cause__ or e.__context__
        seen += 1
    return found


def read_retrying(
    path: str | os.PathLike,
    read: Callable[[], T],
    *,
    prefix: str = "",
    wait: float | None = None,
) -> T:
    """``read()``: a whole read of ``path`` (open, read, close), started again 0.1 s
    apart while it fails as a reader of a running physjax file can (see
    [`transient_error`][]), for up to ``wait`` seconds (default ``READ_WAIT``, 5 s).

    Any other error of ``read`` is raised at once, unchanged. One that lasts becomes a
    ``ValueError`` that names ``path`` (after ``prefix``, e.g. ``"--rhs: "``): locked by
    another process, or not readable (a run still writing it, or a damaged file)."""
    shown = os.fspath(path)
    wait = READ_WAIT if wait is None else wait
    deadline = time.monotonic() + wait
    while True:
        try:
            return read()
        except (OSError, KeyError, RuntimeError, ValueError) as e:
            found = transient_error(e)
            if found is None:
                raise
            if time.monotonic() < deadline:
                time.sleep(_PAUSE)
                continue
            kind, cause = found
        # outside the except block: the final error is raised without the retried one
        if kind == "locked":
            writer = os.path.exists(hidden_beside(shown, ".lock"))
            raise ValueError(
                f"{prefix}{shown!r} is locked by another process"
                + (" (a physjax run writing it)" if writer else "")
                + f" and stayed so for {wait:g} s; try again (a run releases it between "
                "frames) or once the run has finished"
            )
        raise ValueError(
            f"{prefix}cannot read {shown!r}: {error_text(cause)}; still so after trying for "
            f"{wait:g} s (if a run is writing the file, try again once it has finished; if "
            "not, the file is damaged)"
        )
