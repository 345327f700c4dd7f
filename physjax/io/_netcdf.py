"""NetCDF4 (HDF5) output through h5netcdf: frames appended as a run goes, resumable.

Layout of a physjax file:

- dimensions ``time`` (unlimited), ``y``, ``x`` (and ``z``) for cell centres, and ``y_f``,
  ``x_f`` (``z_f``) for the low faces of the cells, each with a coordinate variable carrying
  ``axis`` and, on faces, xgcm's ``c_grid_axis_shift = -0.5``;
- a ``grid`` variable with SGRID topology attributes;
- data variables on their own location's dimensions, each with ``units``, ``long_name`` and
  ``location``; a ``step`` variable (time step count of each frame);
- global attributes: ``title``, ``case``, ``physjax_version``, ``status`` (``"running"``,
  ``"complete"``, ``"interrupted: …"`` or ``"failed: …"``), ``n_frames`` (the number of
  complete frames), ``configuration`` (the full run configuration as JSON), one
  ``parameter_<name>`` per physical parameter and, once a run has been resumed, ``history``
  (one dated line per ``--resume``).

Every frame is written by opening, appending and closing the file, so a crash or a kill
between frames leaves a valid file holding every frame written so far. A frame counts once
all its variables are written: ``n_frames`` is raised last, and a trailing frame beyond it
(from a process stopped inside an append) is dropped when the file is reopened or finished.
The writer takes HDF5's file lock while it writes; when a reader holds the file open (say an
``xarray.open_dataset`` of a running output, whose lock would make the append fail), it
writes without the lock from then on, so that looking at a running file never stops the run.

A full disk is caught before it can damage the file: HDF5 does not report every failed
write (some surface only as warnings, and a file whose metadata could not be written no
longer opens), so the writer checks the free space before it creates the file and before
every frame, and raises [`OutputSpaceError`][] while the file is still whole.
[`output_lock`][] keeps two processes from writing one file at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import operator
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import h5netcdf
import h5py
import numpy as np

from .. import __version__
from ._reading import (
    LOCKS_UNSUPPORTED,
    error_text,
    hidden_beside,
    locks_unsupported,
    transient_error,
)

if TYPE_CHECKING:  # reading a file (physjax plot) needs neither the grids nor jax
    from ..grids import Grid, Stagger

STATUS_RUNNING = "running"
STATUS_COMPLETE = "complete"
STATUS_INTERRUPTED = "interrupted"
STATUS_STOPPED = "stopped"

#: Free space kept in hand beyond twice the bytes to be written: HDF5's metadata and chunk
#: index grow with the file.
_SPACE_MARGIN = 1 << 20


class OutputSpaceError(OSError):
    """The output's disk has too little free space for the next write. Raised before the
    write, so the file still holds every frame written before, whole."""


class OutputRemoved(FileNotFoundError):
    """The file a writer was appending to is gone (removed while the run wrote it)."""


class OutputLocked(ValueError):
    """Another process is writing the same output file."""


def _require_space(path: str, nbytes: int, what: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:  # a file system that does not say: let the write find out
        return
    need = 2 * nbytes + _SPACE_MARGIN
    if free < need:
        raise OutputSpaceError(
            f"only {_size(free)} free on the disk of {path!r}; {what} needs {_size(nbytes)} "
            f"(with room kept for HDF5's metadata: {_size(need)})"
        )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


@contextlib.contextmanager
def output_lock(path: str | os.PathLike):
    """Hold an exclusive lock on writing ``path`` for the duration of the block, or raise
    [`OutputLocked`][] at once if another process holds it.

    The lock is an advisory ``flock`` on a hidden file beside the output (``.NAME.lock``),
    not on the output itself, whose HDF5 lock the writer takes and drops at every frame and
    readers share. The lock dies with its process, so a killed run never leaves the file
    locked; the lock file is removed when the block ends. Where the file system has no
    ``flock`` (or on a platform without ``fcntl``) the block runs unlocked."""
    given = os.fspath(path)
    path = os.path.realpath(given)  # one lock per file, whatever links lead to it
    lock = hidden_beside(path, ".lock")
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on Linux/macOS
        yield
        return
    fd = _lock_file(lock, given, fcntl)
    if fd is None:  # a read-only folder: the write will say so itself
        yield
        return
    try:
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.remove(lock)
    finally:
        os.close(fd)


def _lock_owner() -> str:
    """What a lock file records of the process that holds it."""
    return f"pid {os.getpid()} on {os.uname().nodename}"


def _lock_file(lock: str, given: str, fcntl) -> int | None:
    """Open and ``flock`` the lock file ``lock`` and return its descriptor (unlocked where
    the file system has no ``flock``), or ``None`` where the file cannot be made; raise
    [`OutputLocked`][] when another process holds it."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 64, 0).decode(errors="replace").strip()
            os.close(fd)
            if owner == _lock_owner():
                # flock locks per open file: a second output_lock of this process is refused
                # too, and was said to come from "another physjax process" (its own pid)
                raise OutputLocked(
                    f"{given!r} is already being written by this process (an output_lock "
                    f"of it not yet released: {owner}); one writer at a time"
                ) from None
            raise OutputLocked(
                f"{given!r} is being written by another physjax process"
                f"{f' ({owner})' if owner else ''}; wait for it to end, or give another --output"
            ) from None
        except OSError:  # no flock on this file system: unlocked
            return fd
        # The holder removes the lock file when it ends: one opened just before that and
        # locked just after is a file no longer on disk, and a third process could then
        # create and lock a new one, two writers each holding "the" lock. Keep the lock
        # only if it is on the file the name leads to now; else take the new one.
        try:
            current = os.path.samestat(os.fstat(fd), os.stat(lock))
        except OSError:
            current = False
        if current:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _lock_owner().encode(), 0)
            return fd
        os.close(fd)


class _ExplicitlyClosedFile(h5netcdf.File):
    """h5netcdf's file, closed only when asked. h5netcdf also closes a file when the object
    is collected, and one whose opening an interrupt cut short then fails in that close
    with an "Exception ignored" traceback on stderr; the writer always closes its files
    itself, and the HDF5 handle beneath."""

    def __del__(self):
        pass


@dataclasses.dataclass(frozen=True)
class Variable:
    """Metadata of one output variable.

    - `name`: netCDF name, e.g. ``"h"``.
    - `location`: stagger per grid axis, e.g. ``("centre", "face")`` for u on the C-grid.
    - `units`: UDUNITS string, e.g. ``"m s-1"``.
    - `long_name`: human-readable description.
    - `time_dependent`: whether it has a leading ``time`` dimension (default True).
    """

    name: str
    location: tuple[Stagger, ...]
    units: str
    long_name: str
    time_dependent: bool = True


def _dims(grid: Grid, location: Sequence[Stagger]) -> tuple[str, ...]:
    from ..grids._grid import check_location

    location = check_location(location, grid.ndim, "Variable.location")
    return tuple(
        name if s == "centre" else f"{name}_f" for name, s in zip(grid.axis_names, location)
    )


def _json_default(v: Any) -> Any:
    """JSON for what ``json`` cannot write itself: NumPy and JAX numbers and arrays (a
    model's parameters are 0-d JAX arrays) as numbers and lists, bytes and arrays of text as
    text and lists of it (they were stored as their Python reprs, "b'abc'" and "['a' 'b']"),
    anything else as text."""
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    try:
        a = np.asarray(v) if hasattr(v, "__array__") or isinstance(v, np.generic) else None
    except Exception:
        a = None
    if a is not None and a.dtype.kind in "biufUS":
        return a.tolist()  # bytes among a list's items come back here, decoded
    return str(v)


def _json(v: Any, **kwargs) -> str:
    try:
        return json.dumps(v, default=_json_default, **kwargs)
    except (TypeError, ValueError) as e:  # a tuple key, a dict that holds itself
        raise ValueError(f"{_short(v)} cannot be stored as JSON text: {e}") from None


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _attr_value(v: Any) -> Any:
    if hasattr(v, "__array__") and not isinstance(v, (np.generic, str)):
        try:
            a = np.asarray(v)
        except Exception:
            a = None
        if a is not None and a.ndim == 0 and a.dtype.kind in "biuf":
            v = a[()]  # a 0-d array (a model's parameter) is stored as the number it holds
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, int) and not -(2**63) <= v < 2**63:
        return str(v)  # beyond netCDF's int64 (h5py: "Object dtype ... no HDF5 equivalent")
    if isinstance(v, str):
        # a NumPy string (an item of an array of names) failed in h5py, "No conversion path
        # for dtype('<U9')", naming nothing (in finish, after the status was written)
        return str(v)
    if isinstance(v, np.floating) and v.dtype.itemsize not in (4, 8):
        # half and long double: HDF5 stores them, but netCDF has no such type and its
        # readers drop the attribute without a word
        return float(v)
    if isinstance(v, (int, float, np.integer, np.floating)):
        return v
    return _json(v)


def _attrs_to_store(attrs: Mapping[Any, Any], what: str) -> dict[str, Any]:
    """``attrs`` as the values the file stores, checked before any is written: a name that
    is not a non-empty string, or a text holding a NUL character (which HDF5 cannot store),
    is a ``ValueError`` naming it. (Such an attribute failed in h5py with a message that
    named neither, and in `finish` after the status and the attributes before it were
    already written.)"""
    out = {}
    for key, value in attrs.items():
        if not isinstance(key, str) or not key or "\x00" in key:
            raise ValueError(f"{what}: attribute names must be non-empty strings, got {key!r}")
        try:
            stored = _attr_value(value)
        except ValueError as e:  # JSON cannot hold it
            raise ValueError(f"{what}: attribute {key!r}: {e}") from None
        if isinstance(stored, str) and "\x00" in stored:
            raise ValueError(
                f"{what}: attribute {key!r} holds a NUL character ('\\x00'), which HDF5 "
                "cannot store in a text attribute"
            )
        out[key] = stored
    return out


#: Global attributes that the writer sets and reads back itself (``attrs`` may not set them).
_WRITER_ATTRS = frozenset({"physjax_version", "status", "Conventions", "n_frames"})


def check_writable(path: str | os.PathLike, what: str = "output path") -> None:
    """Raise ``ValueError`` (naming ``what``, e.g. ``"--output"``) if ``path`` cannot be
    written: a missing folder, a folder in its place, or a place that refuses the file.

    The test is real: a new file is created and removed again, an existing one opened for
    appending (and left unchanged), since permission bits say nothing for root and places
    like ``/proc`` or ``/sys`` refuse files whatever their bits say."""
    example = "out.png" if os.fspath(path).lower().endswith(".png") else "out.h5"
    path = os.fspath(path)
    if os.path.islink(path) and not os.path.exists(path):
        # a dangling link: the file is created where it points (see NetCDFWriter._create)
        check_writable(os.path.realpath(path), f"{what} {path!r} links to a missing file;")
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"{what} {path!r} is a directory; give a file name like {example}")
    if path.endswith(("/", os.sep)):  # abspath drops the slash: checked before the folder
        named = path.rstrip("/" + os.sep)
        if os.path.exists(named):  # a file of that name: "does not exist" was said of it too
            raise ValueError(
                f"{what} {path!r} ends with {path[-1]!r}, so names a folder, but {named!r} is a "
                f"file; give the file's name without the {path[-1]!r}, or another name"
            )
        raise ValueError(
            f"{what} {path!r} ends with {path[-1]!r}, so names a folder, and folder "
            f"{named!r} does not exist; give a file name like {example}, "
            f"or create the folder and give {os.path.join(path, example)!r}"
        )
    if not os.path.isdir(folder):
        raise ValueError(f"{what} {path!r}: folder {folder!r} does not exist")
    # the folder as written: "sub/../x.h5" passes through sub, which abspath drops (and the
    # open then failed with a bare "No such file or directory")
    written = os.path.dirname(path)
    if written and not os.path.isdir(written):
        parts = written.split(os.sep)
        for k in range(1, len(parts) + 1):
            step = os.sep.join(parts[:k]) or os.sep
            if not os.path.isdir(step):
                shown = os.path.abspath(step)
                state = "is a file, not a folder" if os.path.exists(step) else "does not exist"
                raise ValueError(f"{what} {path!r} passes through folder {shown!r}, which {state}")
    if os.path.exists(path) and not os.path.isfile(path):
        # a device such as /dev/null, a named pipe (opening it would wait for a reader) or a
        # socket: never replaced by a file, --overwrite or not
        raise ValueError(
            f"{what} {path!r} is not a regular file (a device, pipe or socket); give a file "
            f"name like {example}"
        )
    try:
        if os.path.exists(path):
            with open(path, "ab"):
                pass
        else:
            with open(path, "xb"):
                pass
            os.remove(path)
    except OSError as e:
        raise ValueError(f"{what} {path!r} is not writable: {e.strerror or e}") from None


def _ml_dtype_widened(dtype: np.dtype) -> np.dtype | None:
    """The NumPy dtype that holds every value of ``dtype`` exactly where it is one of the
    types NumPy does not know that JAX brings through ``ml_dtypes`` (``bfloat16`` and the
    ``float8`` types: float32; ``int4``, ``uint4``, …: int16), else ``None``."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - a dependency of jax
        return None
    for info, wide in ((ml_dtypes.finfo, np.float32), (ml_dtypes.iinfo, np.int16)):
        try:
            info(dtype)
        except Exception:
            continue
        return np.dtype(wide)
    return None


def _refuse_writer_attrs(attrs: Mapping[str, Any], what: str) -> None:
    """Refuse the writer's own attributes (its record of the file: status, frame count,
    version, the parameters' copies) among those a caller gives."""
    owned = sorted(k for k in attrs if k in _WRITER_ATTRS or str(k).startswith("parameter_"))
    if owned:
        raise ValueError(
            f"{what}: {owned} are written by physjax itself; give parameters in "
            "attrs['parameters'] and choose other names for the rest"
        )


def _run_attrs_to_store(attrs: dict[str, Any], what: str) -> dict[str, Any]:
    """Take ``parameters`` and ``configuration`` out of ``attrs`` and return them as stored:
    ``parameters`` as JSON with one ``parameter_<name>`` per entry, ``configuration`` as
    JSON. One encoding for a new file and for `finish`, which stored a configuration text
    as it was (a file physjax's own reader then refused as "not valid JSON") and left the
    ``parameter_<name>`` copies of earlier parameters beside new ones."""
    stored: dict[str, Any] = {}
    if "parameters" in attrs:
        params = attrs.pop("parameters") or {}
        if not isinstance(params, Mapping):
            raise TypeError(
                f"{what}['parameters'] must be a mapping of names to values, got {params!r}"
            )
        stored.update(
            _attrs_to_store(
                {f"parameter_{key}": value for key, value in params.items()},
                f"{what}['parameters']",
            )
        )
        stored["parameters"] = _named_json(params, f"{what}['parameters']")
    config = attrs.pop("configuration", None)
    if config is not None:
        stored["configuration"] = _named_json(config, f"{what}['configuration']", sort_keys=True)
    return stored


def _named_json(v: Any, what: str, **kwargs) -> str:
    """``_json(v)``, its error naming ``what``."""
    try:
        return _json(v, **kwargs)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


class NetCDFWriter:
    """Writes frames of a run into a NetCDF4 file, one open–append–close per frame.

    **Arguments:**

    - `path`: the ``.h5``/``.nc`` file to create (overwritten if present).
    - `grid`: the [`physjax.grids.Grid`][] of the fields.
    - `variables`: the [`physjax.io.Variable`][]s to write.
    - `attrs`: global attributes: ``case``, ``title``, ``parameters`` (a dict, also stored
      one attribute per entry) and ``configuration`` (a dict, stored as JSON). NumPy and
      JAX numbers (a model's 0-d parameters) are stored as numbers, their arrays as lists,
      an integer beyond int64 as its decimal text, bytes as text; a name that is not a
      non-empty string or a text with a NUL character is a ``ValueError``, raised before the
      file is made.
      The writer's own attributes (``status``, ``n_frames``, ``physjax_version``,
      ``Conventions``, ``parameter_*``) are refused.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        grid: Grid,
        variables: Sequence[Variable],
        *,
        attrs: Mapping[str, Any] | None = None,
        _create: bool = True,
        _z_positive: str = "up",
    ):
        from ..grids import Grid
        from ..grids._grid import check_location

        self.path = os.fspath(path)
        # arguments of the wrong kind failed later with an AttributeError naming none of them
        if not isinstance(grid, Grid):
            raise TypeError(f"grid must be a physjax.grids.Grid, got {type(grid).__name__}")
        self.grid = grid
        if isinstance(variables, (str, bytes, Variable)) or not isinstance(variables, Iterable):
            raise TypeError(
                "variables must be a sequence of physjax.io.Variable, got "
                f"{type(variables).__name__}"
            )
        # a generator was used up by the name check below, leaving a file of no variables
        variables = list(variables)
        for v in variables:
            if not isinstance(v, Variable):
                raise TypeError(
                    f"variables must be physjax.io.Variable objects, got {type(v).__name__} {v!r}"
                )
        if attrs is not None and not isinstance(attrs, Mapping):
            raise TypeError(f"attrs must be a mapping of names to values, got {attrs!r}")
        params = (attrs or {}).get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(
                f"attrs['parameters'] must be a mapping of names to values, got {params!r}"
            )
        names = [v.name for v in variables]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"variables: the name(s) {doubled} are given more than once")
        for v in variables:  # before anything is created or opened
            check_location(v.location, grid.ndim, "Variable.location")
            bad_name = not isinstance(v.name, str) or v.name in ("", ".", "..")
            if bad_name or "/" in v.name or "\x00" in v.name:
                # "a/b" made a group "a" holding "b", a variable no reader of the file saw;
                # "." stopped in h5py with "name already exists", naming neither; "h\x00x"
                # was stored as "h"
                raise ValueError(
                    f"Variable.name must be a non-empty netCDF name without '/' or a NUL "
                    f"character (and not '.' or '..'), got {v.name!r}"
                )
            for field in ("units", "long_name"):
                # None stopped in h5py, after the checks, with "Object dtype dtype('O') has
                # no native HDF5 equivalent"; a number was stored as a number
                # "" (or a NUL, which HDF5 cannot store) passed as the units and long_name
                # every variable is to have
                value = getattr(v, field)
                if not isinstance(value, str) or not value or "\x00" in value:
                    raise ValueError(
                        f'Variable.{field} of {v.name!r} must be a non-empty string (units "1" '
                        f"for a dimensionless variable), got {value!r}"
                    )
            if not isinstance(v.time_dependent, (bool, np.bool_)):
                # "no" was taken for True, None for False, by their truth values
                raise ValueError(
                    f"Variable.time_dependent of {v.name!r} must be True or False, got "
                    f"{v.time_dependent!r}"
                )
        # the writer's own variables: a clash failed while the file was being made, with
        # h5netcdf's "unable to create variable 'x' (name already exists)"
        own = {"time", "step", "grid", *grid.axis_names, *(f"{n}_f" for n in grid.axis_names)}
        taken = [v.name for v in variables if v.name in own]
        if taken:
            raise ValueError(
                f"Variable.name {taken[0]!r} is a name the writer gives its own variables "
                f"({', '.join(sorted(own))}); choose another"
            )
        _refuse_writer_attrs(attrs or {}, "attrs")
        self.variables = {v.name: v for v in variables}
        self._locking = True
        self._finished: str | None = None  # the status finish() gave, once it has run
        self._z_positive = _z_positive  # "down" for a z read from a file that says so
        if _create:
            check_writable(self.path)
            self._create(dict(attrs or {}))

    @contextlib.contextmanager
    def _open(self):
        """The file opened for appending, as a context.

        A reader holding it open blocks HDF5's file lock (``BlockingIOError``); the run must
        not die of that, so the writer then goes on without the lock. The HDF5 handle is
        opened and closed here rather than by h5netcdf: an interrupt (Ctrl-C, SIGTERM) that
        lands inside h5netcdf's close would otherwise leave the file open in this process,
        and the next open of it with other locking flags (the record of the interrupted run)
        would fail."""
        h5 = self._open_h5()
        try:
            f = _ExplicitlyClosedFile(h5, "a")
            try:
                yield f
            finally:
                f.close()
        finally:
            h5.close()

    def _open_h5(self) -> h5py.File:
        if not os.path.exists(self.path):
            # "a" would create an empty file in its place, which the next frame then failed
            # on with KeyError: 'time', left behind as "not a physjax output file"
            raise OutputRemoved(
                f"{self.path!r} was removed or moved away while it was being written, so the "
                "run cannot go on: start it again (a file moved elsewhere continues with "
                "--resume under its new name)",
            )
        tried = set()
        while True:
            tried.add(self._locking)
            try:  # None: HDF5's default locking (HDF5_USE_FILE_LOCKING is honoured)
                return h5py.File(self.path, "r+", locking=None if self._locking else False)
            except BlockingIOError:
                if False in tried:
                    raise
                self._locking = False
            except OSError as e:
                if "already open for read-only" in str(e):
                    # HDF5 opens a file once per process: one this process reads (a dataset
                    # of xarray.open_dataset kept open, in a notebook that also runs the
                    # solver) cannot be opened for writing beside it
                    raise OSError(
                        errno.EBUSY,
                        f"{self.path!r} is open for reading in this process (an "
                        "xarray.open_dataset or h5py.File not yet closed), and HDF5 cannot "
                        "open it for writing beside that: close it (ds.close(), or read with "
                        "xr.load_dataset or in a with block) and write again; the file is "
                        "unchanged",
                    ) from None
                # The file is still open in this process with the other locking flags (a
                # handle an interrupt left behind): HDF5 then insists on the same flags.
                if "locking flag values don't match" not in str(e) or (not self._locking) in tried:
                    raise
                self._locking = not self._locking

    # ------------------------------------------------------------------ create
    def _create(self, attrs: dict[str, Any]) -> None:
        # Written under a temporary name and moved into place: an error or an interrupt
        # while creating leaves neither a half-made file nor the temporary one. The name is
        # hidden and unique (a user's own NAME.partial is never touched), and the file lands
        # where a symbolic link points, the link kept.
        dest = os.path.realpath(self.path)
        tmp = hidden_beside(dest, f".{os.getpid()}.{secrets.token_hex(4)}.partial")
        _require_space(self.path, self._frame_bytes(False) + self._frame_bytes(True), "a new file")
        try:
            self._write_new(tmp, attrs)
            os.replace(tmp, dest)
        except BaseException as e:
            if os.path.exists(tmp):
                os.remove(tmp)
            if isinstance(e, OSError):
                hint = f"; {LOCKS_UNSUPPORTED}" if locks_unsupported(e) else ""
                raise ValueError(f"cannot write {self.path!r}: {e}{hint}") from None
            raise

    def _write_new(self, tmp: str, attrs: dict[str, Any]) -> None:
        g = self.grid
        dtype = np.dtype(g.dtype)
        title = attrs.pop("title", None)  # None: the default, not the text "None"
        title = "physjax output" if title is None else str(title)
        attrs.setdefault("parameters", {})  # every file records its parameters
        run_attrs = _run_attrs_to_store(attrs, "attrs")
        stored = _attrs_to_store(attrs, "attrs")
        _attrs_to_store({"title": title}, "attrs")
        with h5netcdf.File(tmp, "w") as f:
            # A file of time-independent fields (a Poisson solve, say) has no time axis.
            has_time = any(v.time_dependent for v in self.variables.values())
            dims: dict[str, int | None] = {"time": None} if has_time else {}
            for name, n in zip(g.axis_names, g.shape):
                dims[name] = n
                dims[f"{name}_f"] = n
            f.dimensions = dims
            if has_time:
                t = f.create_variable("time", ("time",), "f8")
                # Simulated seconds with no calendar: CF (section 4.4) asks a *time coordinate*
                # (axis "T" or standard_name "time") for "units since date" units, which
                # readers turn into dates; elapsed seconds are kept plain and not declared one.
                t.attrs.update(units="s", long_name="simulated time since the start of the run")
                s = f.create_variable("step", ("time",), "i8")
                s.attrs.update(units="1", long_name="number of time steps taken")
            for name, periodic in zip(g.axis_names, g.periodic):
                for stagger in ("centre", "face"):
                    dim = name if stagger == "centre" else f"{name}_f"
                    c = f.create_variable(dim, (dim,), "f8", data=g.coordinates(name, stagger))
                    where = "centres" if stagger == "centre" else "low faces"
                    c.attrs.update(
                        units="m",
                        long_name=f"{name} of cell {where}",
                        axis=name.upper(),
                        # not in the SGRID/CF metadata: what xgcm's padding needs
                        boundary="periodic" if periodic else "wall",
                    )
                    if name == "z":  # CF 4.3: a vertical coordinate not in pressure units
                        c.attrs["positive"] = self._z_positive  # says which way it increases
                    if stagger == "face":
                        c.attrs["c_grid_axis_shift"] = -0.5
            topo = f.create_variable("grid", (), "i4")
            topo.attrs.update(_sgrid_topology(g))
            for v in self.variables.values():
                vdims = _dims(g, v.location)
                shape = tuple(g.shape)
                if v.time_dependent:
                    var = f.create_variable(v.name, ("time", *vdims), dtype, chunks=(1, *shape))
                else:
                    var = f.create_variable(v.name, vdims, dtype)
                var.attrs.update(
                    units=v.units,
                    long_name=v.long_name,
                    location=_sgrid_location(g, v.location),
                    grid="grid",
                )
            f.attrs["title"] = title
            f.attrs["physjax_version"] = __version__
            f.attrs["status"] = STATUS_RUNNING
            # CF-1.9: the first CF version that admits the int64 of `step` and integer attributes
            f.attrs["Conventions"] = "CF-1.9 SGRID-0.3"
            for key, value in run_attrs.items():
                f.attrs[key] = value
            for key, value in stored.items():
                f.attrs[key] = value
            if has_time:
                f.attrs["n_frames"] = 0

    # ------------------------------------------------------------------ append
    def append(self, time: float, step: int, fields: Mapping[str, Any]) -> int:
        """Append one frame (every time-dependent variable) and return the frame count.

        The frame counts (``n_frames`` is raised) only after all its variables are written;
        an incomplete frame left by an earlier, interrupted append is overwritten. Every
        field is checked first (a time-dependent variable of the writer's, real and numeric,
        of the grid's shape, with no finite value beyond the range of the file's dtype, which
        would be stored as inf), as are ``time`` (finite) and ``step`` (a whole number below 2**63),
        both beyond the last frame's: a ``ValueError`` names the first that fails, and
        nothing is written. The masked
        cells of a NumPy masked array (a land mask) are stored as NaN. JAX's ``bfloat16``
        (``float8``, ``int4``) fields are taken exactly, as float32 (int16). A writer that has
        been finished appends nothing (``ValueError``): [`reopen`][] continues a file."""
        self._refuse_if_finished("append")
        if not any(v.time_dependent for v in self.variables.values()):
            raise ValueError(
                f"{self.path!r} has no time axis (no time-dependent variable): write its "
                "fields with write_static"
            )
        arrays = self._checked_fields(fields, time_dependent=True)  # before anything is written
        missing = [n for n, v in self.variables.items() if v.time_dependent and n not in fields]
        if missing:
            raise ValueError(f"frame lacks variables {missing}")
        # each on its own: a time beyond float's range was reported as a bad step
        try:  # the file's step is int64: 2**63 and beyond failed in h5py mid-frame
            whole = np.ndim(step) == 0 and bool(int(step) == step) and 0 <= int(step) < 2**63
        except (TypeError, ValueError, OverflowError):
            whole = False
        try:
            finite = np.ndim(time) == 0 and bool(np.isfinite(float(time)))
        except (TypeError, ValueError, OverflowError):
            finite = False
        # a text ("1.0", "3") went through float() and int() and was stored as a number
        if isinstance(step, (bool, str, bytes)) or not whole:
            raise ValueError(f"step must be a whole number from 0 to 2**63 - 1, got {step!r}")
        if isinstance(time, (bool, str, bytes)) or not finite:
            raise ValueError(f"time must be a finite number of seconds, got {time!r}")
        _require_space(self.path, self._frame_bytes(), "a frame")
        # Through h5py alone: h5netcdf's view of the file (built at every open, its
        # dimension sizes found by walking the variables at every read) took 19 of the
        # 29 ms of a 128² frame. The datasets, resizes and attributes are those h5netcdf
        # writes itself.
        h5 = self._open_h5()
        try:
            n = _complete_frames_h5(h5)
            if n:  # a time axis that goes back (or stands still) breaks readers' selection
                last_time, last_step = float(h5["time"][n - 1]), int(h5["step"][n - 1])
                if not (float(time) > last_time and int(step) > last_step):
                    raise ValueError(
                        f"frames go forward: frame {n} must come after the last one "
                        f"(t = {last_time:g} s, step {last_step}), got t = {float(time):g} "
                        f"s, step {int(step)}"
                    )
            time_axis = h5["time"]
            time_axis.resize((n + 1,))  # as h5netcdf's resize_dimension: the axis, then
            for ref, axis in time_axis.attrs.get("REFERENCE_LIST", ()):  # its variables
                h5[ref].resize(n + 1, int(axis))
            time_axis[n] = float(time)
            h5["step"][n] = int(step)
            for name, value in arrays.items():
                h5[name][n] = value
            h5.attrs["n_frames"] = np.atleast_1d(np.int64(n + 1))  # as h5netcdf stores it
        finally:
            h5.close()
        return n + 1

    def _checked_fields(self, fields: Mapping[str, Any], time_dependent: bool) -> dict:
        """The fields as real arrays of the grid's shape, checked before a byte is written:
        every name one of the writer's variables with the right time dependence, every
        value real and numeric (a complex or text value failed half-way through a frame)."""
        if not isinstance(fields, Mapping):  # a list stopped on "truth value … ambiguous"
            raise TypeError(
                "fields must be a mapping of variable names to arrays, e.g. {'h': h}, got "
                f"{type(fields).__name__}"
            )
        arrays = {}
        for name, value in fields.items():
            var = self.variables.get(name)
            if var is None:
                known = list(self.variables)
                raise ValueError(f"field {name!r} is not one of the variables {known}")
            if var.time_dependent != time_dependent:
                where = "append (a frame)" if var.time_dependent else "write_static"
                raise ValueError(
                    f"field {name!r} is {'' if var.time_dependent else 'not '}time-dependent: "
                    f"write it with {where}"
                )
            try:
                array = np.asarray(value)
                if np.ma.isMaskedArray(value) and np.ma.getmask(value) is not np.ma.nomask:
                    # np.asarray drops the mask: its cells were stored as whatever lay under
                    # it (1e20, a netCDF fill value); they are missing values, stored NaN
                    kind = array.dtype.kind
                    floats = array.dtype if kind == "f" else np.float64
                    if kind in "biuf":
                        array = np.ma.filled(np.ma.asarray(value).astype(floats), np.nan)
            except Exception as e:
                raise ValueError(f"field {name!r} is not an array: {e}") from None
            wide = _ml_dtype_widened(array.dtype) if array.dtype.kind == "V" else None
            if wide is not None:
                # JAX's bfloat16 (float8s, int4), kind "V" to NumPy, were refused as "not
                # real and numeric"; float32 (int16) holds each of their values exactly
                array = array.astype(wide)
            if array.dtype.kind not in "biuf":  # bool, integers, floats
                raise ValueError(
                    f"field {name!r} must be real and numeric, got dtype {array.dtype}"
                )
            if array.shape != self.grid.shape:
                raise ValueError(
                    f"field {name!r} has shape {array.shape}, not the grid's "
                    f"{self.grid.shape} (every location is stored on the grid's shape)"
                )
            stored = np.dtype(self.grid.dtype)
            if array.dtype.kind == "f" and array.dtype.itemsize > stored.itemsize:
                # a finite value beyond float32's range would be stored as ±inf
                with np.errstate(over="ignore"):
                    cast = array.astype(stored)
                lost = np.isinf(cast) & np.isfinite(array)
                if lost.any():
                    where = tuple(int(i) for i in np.argwhere(lost)[0])
                    raise ValueError(
                        f"field {name!r} holds {float(array[where]):g} at index {where}, "
                        f"beyond the range of the file's {stored.name} "
                        f"(±{float(np.finfo(stored).max):.3g}): it would be stored as inf"
                    )
                array = cast
            arrays[name] = array
        return arrays

    def _frame_bytes(self, time_dependent: bool = True) -> int:
        cell = np.dtype(self.grid.dtype).itemsize * int(np.prod(self.grid.shape))
        n = sum(v.time_dependent == time_dependent for v in self.variables.values())
        return n * cell + 16

    def write_static(self, fields: Mapping[str, Any]) -> None:
        """Write the variables that have no time dimension (not after [`finish`][])."""
        self._refuse_if_finished("write_static")
        arrays = self._checked_fields(fields, time_dependent=False)
        with self._open() as f:
            for name, value in arrays.items():
                f[name][...] = value

    def _refuse_if_finished(self, what: str) -> None:
        # the file said "complete" (or "failed: …") while frames were still being added
        if self._finished is not None:
            raise ValueError(
                f"{what}: {self.path!r} has been finished (status {self._finished!r}); "
                "NetCDFWriter.reopen gives a writer that continues it"
            )

    def finish(self, status: str = STATUS_COMPLETE, **attrs: Any) -> None:
        """Mark the file ``complete`` (or another status, e.g. ``"failed: …"``); a trailing
        incomplete frame is dropped. `attrs` are stored as global attributes, except the
        writer's own (``n_frames``, ``physjax_version``, ``Conventions``, ``parameter_*``),
        refused with a ``ValueError`` before anything is written; ``parameters`` and
        ``configuration`` are stored as the writer stores them when it makes the file (JSON,
        and ``parameters`` replaces every ``parameter_<name>`` copy). So is a ``complete`` file
        with a time-independent variable never written by `write_static` (HDF5 would read
        it as zeros, a field like any other). Once finished, the writer's `append` and
        `write_static` raise ``ValueError`` (a frame added to a ``complete`` file left it
        saying so); `finish` may be called again to change the status."""
        _refuse_writer_attrs(attrs, "finish")
        if not isinstance(status, str) or not status:
            raise ValueError(f"finish: status must be a non-empty string, got {status!r}")
        attrs = dict(attrs)
        run_attrs = _run_attrs_to_store(attrs, "finish")
        stored = {**_attrs_to_store({"status": status, **attrs}, "finish"), **run_attrs}
        with self._open() as f:
            if status == STATUS_COMPLETE:
                unwritten = [
                    n
                    for n, v in self.variables.items()
                    if not v.time_dependent and f[n]._h5ds.id.get_storage_size() == 0
                ]
                if unwritten:
                    raise ValueError(
                        f"finish: the time-independent variable(s) {unwritten} of "
                        f"{self.path!r} were never written; give them to write_static first"
                    )
            _drop_incomplete_frame(f)
            if "parameters" in stored:  # the copies of parameters no longer given go
                for key in [k for k in f.attrs if str(k).startswith("parameter_")]:
                    if key not in stored:
                        del f.attrs[key]
            # the status last: a write that fails before it leaves the file saying what it
            # said before, not the new status without the attributes that go with it
            for key in sorted(stored, key=lambda k: k == "status"):
                f.attrs[key] = stored[key]
        self._finished = status

    def frames(self) -> tuple[int, int | None]:
        """The number of whole frames in the file and the step of the last (``None`` when
        there is none), read through the writer's own handle: what an interrupted run
        reports without meeting its own file's lock. A file with no time axis (only
        time-independent variables) has none: ``(0, None)``."""
        with self._open() as f:
            if "time" not in f.dimensions:  # was a bare KeyError: 'time'
                return 0, None
            n = _complete_frames(f)
            return n, (int(f["step"][n - 1]) if n else None)

    # ------------------------------------------------------------------ resume
    @classmethod
    def reopen(
        cls,
        path: str | os.PathLike,
        grid: Grid,
        variables: Sequence[Variable],
        *,
        history: str | None = None,
    ):
        """A writer that appends to an existing file (for ``--resume``); marks it running.
        The file must hold `variables` on `grid`: its shape, cell centres (extent, origin),
        boundaries and dtype, and every time-dependent variable of the file must be among
        them (one left out would be unwritten in the frames appended); otherwise a
        ``ValueError`` is raised and nothing is written.
        `history`, if given, is added as a dated line to the file's ``history`` attribute."""
        path = os.fspath(path)
        if history is not None and (not isinstance(history, str) or "\x00" in history):
            # a NUL failed in h5py after the file had been marked running again
            raise ValueError(f"reopen: history must be a text without NUL, got {history!r}")
        if not os.path.isfile(path):
            raise ValueError(f"cannot resume: {path!r} does not exist")
        w = cls(path, grid, variables, _create=False)
        try:
            with w._open() as f:
                _check_appendable(f, path, grid, w.variables.values())  # before any write
                _drop_incomplete_frame(f)
                f.attrs["status"] = STATUS_RUNNING
                if history:
                    stamp = datetime.datetime.now(datetime.UTC)
                    line = f"{stamp:%Y-%m-%dT%H:%M:%SZ}: {history}"
                    before = _decode(f.attrs.get("history", ""))
                    f.attrs["history"] = f"{before}\n{line}" if before else line
        except (OSError, KeyError, RuntimeError) as e:  # KeyError, RuntimeError: damaged
            raise ValueError(
                f"cannot resume: {path!r} cannot be opened for writing: {error_text(e)}"
            ) from None
        return w


def _check_appendable(f: h5netcdf.File, path: str, grid: Grid, variables) -> None:
    """Refuse to append to a file physjax did not write, or one of another grid or other
    variables (nothing is written to it)."""
    if "physjax_version" not in f.attrs or "time" not in f.dimensions:
        raise ValueError(f"cannot resume: {path!r} is not a physjax output file with frames")
    have = {n: f.dimensions[n].size for n in grid.axis_names if n in f.dimensions}
    want = dict(zip(grid.axis_names, grid.shape))
    if have != want:
        raise ValueError(
            f"cannot resume: {path!r} holds a grid of {have}, not the {want} asked for"
        )
    for name, periodic in zip(grid.axis_names, grid.periodic):
        # the shape alone let frames of another box (spacing, origin) or other boundaries
        # be appended under the file's coordinates
        stored = np.asarray(f.variables[name][...], dtype=float) if name in f.variables else None
        want = grid.coordinates(name, "centre")
        span = float(np.max(np.abs(want))) or 1.0
        if stored is None or not np.allclose(stored, want, rtol=0, atol=1e-9 * span):
            # in full: 6 digits showed "-1500 … 1500" for both when the origin moved by 1 mm
            shown = "none" if stored is None else f"{float(stored[0])!r} … {float(stored[-1])!r}"
            raise ValueError(
                f"cannot resume: the {name} cell centres of {path!r} are {shown}, those of "
                f"the grid asked for {float(want[0])!r} … {float(want[-1])!r} (its extent or "
                "origin differs)"
            )
        boundary = _decode(f.variables[name].attrs.get("boundary"))
        asked = "periodic" if periodic else "wall"
        if boundary in ("periodic", "wall") and boundary != asked:
            raise ValueError(
                f"cannot resume: the {name} axis of {path!r} is {boundary}, the grid asked "
                f"for has it {asked}"
            )
    missing = [v.name for v in variables if v.name not in f.variables]
    if missing:
        raise ValueError(f"cannot resume: {path!r} has no variable(s) {missing}")
    # a field of the file the writer does not know would be left unwritten (read as
    # zeros, HDF5's fill value) in every frame appended, which still counted as whole
    known = {v.name for v in variables} | {"time", "step"}
    left = [
        n for n, var in f.variables.items() if var.dimensions[:1] == ("time",) and n not in known
    ]
    if left:
        raise ValueError(
            f"cannot resume: {path!r} also holds the time-dependent variable(s) {left}, "
            "which the frames appended would leave unwritten; give every variable of the file"
        )
    for v in variables:
        want = (("time",) if v.time_dependent else ()) + _dims(grid, v.location)
        have = tuple(f.variables[v.name].dimensions)
        if have != want:
            raise ValueError(
                f"cannot resume: {v.name!r} in {path!r} lies on {have}, not on {want} (its "
                "location or time dependence differs)"
            )
        stored = np.dtype(f.variables[v.name].dtype)
        if stored != np.dtype(grid.dtype):
            raise ValueError(
                f"cannot resume: {v.name!r} in {path!r} is stored as {stored.name}, the grid "
                f"asked for is {np.dtype(grid.dtype).name}"
            )


def _complete_frames(f: h5netcdf.File, path: str | None = None) -> int:
    """Frames whose every variable is written: the ``n_frames`` attribute (the length of the
    time axis in files written before it existed)."""
    return _frames_counted(f.attrs.get("n_frames"), f.dimensions["time"].size, path)


def _complete_frames_h5(h5: h5py.File) -> int:
    """[`_complete_frames`][] of the file opened by h5py: the time axis is as long as the
    longest variable on it (h5netcdf's size of an unlimited dimension)."""
    time_axis = h5["time"]
    size = time_axis.shape[0]
    for ref, axis in time_axis.attrs.get("REFERENCE_LIST", ()):
        size = max(size, h5[ref].shape[int(axis)])
    return _frames_counted(h5.attrs.get("n_frames"), size, None)


def _frames_counted(n: Any, size: int, path: str | None) -> int:
    if n is None:
        return size
    where = f"{path!r}" if path else "the file"
    if isinstance(n, np.ndarray) and n.size == 1:  # stored 1-d, as h5netcdf writes it
        n = n.reshape(())[()]
    value = _decode(n)
    # -1 was read as "-1 frames (0 to -2, or -1 to --1)", and 2.5 as 2 without a word
    try:
        count = operator.index(value)
    except TypeError:
        count = None
    if isinstance(value, bool) or count is None or count < 0:
        raise ValueError(
            f"{where}: attribute n_frames must be a count of frames (an integer >= 0), got "
            f"{value!r}; the file was not written by physjax, or has been altered"
        ) from None
    return min(count, size)


def _drop_incomplete_frame(f: h5netcdf.File) -> None:
    if "time" in f.dimensions:
        n = _complete_frames(f)
        if f.dimensions["time"].size > n:
            f.resize_dimension("time", n)
        f.attrs["n_frames"] = n


def _sgrid_location(grid: Grid, location: Sequence[Stagger]) -> str:
    """The SGRID location of a stagger: in 2-D ``face`` (cell centres), ``edge1`` (x-faces),
    ``edge2`` (y-faces), ``node`` (corners); in 3-D ``volume``, ``face1..3`` (normal to x, y,
    z), ``edge1..3`` (along x, y, z), ``node``. SGRID numbers the dimensions x, y, z."""
    number = {"x": 1, "y": 2, "z": 3}
    faces = [number[n] for n, s in zip(grid.axis_names, location) if s == "face"]
    centres = [number[n] for n, s in zip(grid.axis_names, location) if s == "centre"]
    if not faces:
        return "face" if grid.ndim == 2 else "volume"
    if not centres:
        return "node"
    if grid.ndim == 2:
        return f"edge{faces[0]}"
    return f"face{faces[0]}" if len(faces) == 1 else f"edge{centres[0]}"


def _sgrid_topology(grid: Grid) -> dict[str, Any]:
    """SGRID attributes of the ``grid`` variable. Nodes are the cell corners, whose coordinate
    along each axis is the low face ``x_f``; the cells (``x``) are as many, the last one lying
    beyond the last stored node: ``padding: high``. (xgcm reads the same layout from
    ``c_grid_axis_shift = -0.5`` on ``x_f``: the nodes sit to the left of the centres.)"""
    names = list(reversed(grid.axis_names))  # x, y(, z): SGRID's dimension order
    cells = " ".join(f"{n}: {n}_f (padding: high)" for n in names)
    kind = "face" if grid.ndim == 2 else "volume"
    return {
        "cf_role": "grid_topology",
        "topology_dimension": grid.ndim,
        "long_name": "SGRID topology of the Arakawa C-grid",
        "units": "1",
        "node_dimensions": " ".join(f"{n}_f" for n in names),
        f"{kind}_dimensions": cells,
        "node_coordinates": " ".join(f"{n}_f" for n in names),
        f"{kind}_coordinates": " ".join(names),
    }


def _open_for_reading(path: str) -> h5netcdf.File:
    """``path`` opened read-only. ``ValueError`` for a missing path, a folder or a file that
    is not NetCDF4/HDF5; ``BlockingIOError`` (an ``OSError``: wait and try again) while a
    writer holds HDF5's lock on it, as it does during every append of a running file."""
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a directory, not a NetCDF4/HDF5 file")
    try:
        return h5netcdf.File(path, "r")
    except FileNotFoundError:
        raise ValueError(f"file {path!r} does not exist") from None
    except OSError as e:
        if locks_unsupported(e):
            raise ValueError(f"cannot read {path!r}: {e}; {LOCKS_UNSUPPORTED}") from None
        if isinstance(e, BlockingIOError) or "unable to lock file" in str(e):
            raise BlockingIOError(
                errno.EAGAIN,
                f"{path!r} is locked by a process writing it (a frame being appended); "
                "try again in a moment",
            ) from None
        raise ValueError(f"cannot read {path!r} as a NetCDF4/HDF5 file: {e}") from None
    except (KeyError, RuntimeError) as e:
        # h5py's error for a damaged object header or link table met while h5netcdf walks
        # the file: the File it leaves half built is closed here, where its own close
        # (at garbage collection) would print "Exception ignored … AttributeError"
        _close_half_built(e)
        raise ValueError(f"cannot read {path!r} as a NetCDF4/HDF5 file: {error_text(e)}") from None


def _close_half_built(e: BaseException) -> None:
    tb = e.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_locals.get("self")
        if isinstance(f, h5netcdf.File) and not hasattr(f, "_writable"):
            h5 = getattr(f, "_File__h5file", None)
            with contextlib.suppress(Exception):
                if h5 is not None:
                    h5.close()
            f._closed = True
        tb = tb.tb_next


@contextlib.contextmanager
def _reading(path: str):
    """``path`` opened read-only, where an HDF5 error met while reading it (a damaged or
    truncated file: h5py's ``KeyError``, ``RuntimeError`` or ``OSError``) becomes a
    ``ValueError`` naming the file. A ``BlockingIOError`` (a
    writer holds the file) passes unchanged. The HDF5 error stays the ``__context__`` of
    the ``ValueError``, where [`physjax.io.read_retrying`][] looks for one that passes."""
    try:
        with _open_for_reading(path) as f:
            yield f
    except BlockingIOError:
        raise
    except (KeyError, RuntimeError, OSError) as e:
        # met half the time reading a running file ("addr overflow"): a caller retrying on
        # BlockingIOError alone did not know this one passes too
        hint = (
            "; a file a run is still writing can be read in the middle of an append: read "
            "it through physjax.io.read_retrying, which tries again"
            if transient_error(e) is not None
            else ""
        )
        raise ValueError(f"cannot read {path!r}: {error_text(e)}{hint}") from None


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """Global attributes of a physjax file, with ``configuration``/``parameters`` decoded.
    Raises ``ValueError`` for a path that is missing, not a NetCDF4/HDF5 file, damaged or
    truncated, or has a malformed attribute, ``BlockingIOError`` while a frame is being
    appended. A file a run is still writing can also raise a passing ``ValueError`` (HDF5
    met the file mid-append, the message says so): read it through
    [`physjax.io.read_retrying`][], which tries again on both."""
    path = os.fspath(path)
    with _reading(path) as f:
        attrs = {k: _decode(v) for k, v in f.attrs.items()}
        attrs["n_frames"] = _complete_frames(f, path) if "time" in f.dimensions else 0
    for key in ("configuration", "parameters"):
        if isinstance(attrs.get(key), str):
            try:
                attrs[key] = json.loads(attrs[key])
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path!r}: the {key!r} attribute is not valid JSON ({e}); the file was "
                    "not written by physjax, or has been altered"
                ) from None
    return attrs


def _decode(v):
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.generic):
        return v.item()
    return v


def read_static(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every time-independent field of a physjax file, by name: all of a
    ``physjax poisson`` file's (``u``, ``f``, ``residual``, ...), a shallow-water run's
    ``bottom``. Fields are the variables on the grid (those with SGRID's ``grid``
    attribute); coordinates and the grid's topology variable are left out. Raises
    ``ValueError`` for a file that is missing, not NetCDF4/HDF5, damaged or truncated, or
    that holds no time-independent field, ``BlockingIOError`` while a frame is being
    appended (read a running file through [`physjax.io.read_retrying`][])."""
    path = os.fspath(path)
    with _reading(path) as f:
        out = {
            name: np.asarray(var[...])
            for name, var in f.variables.items()
            if "time" not in var.dimensions and "grid" in var.attrs and var.dimensions
        }
    if not out:
        raise ValueError(
            f"{path!r} holds no time-independent field on a grid (read its frames with "
            "physjax.io.read_frame)"
        )
    return out


def read_frame(path: str | os.PathLike, index: int = -1) -> dict[str, Any]:
    """One complete frame of every time-dependent variable, plus ``time`` and ``step``;
    ``index`` (an integer: a Python, NumPy or 0-d JAX one) counts complete frames only
    (``-1``: the last). Raises ``ValueError`` for a file that is missing, not NetCDF4/HDF5,
    damaged or truncated, or has no time axis, ``BlockingIOError`` while a frame is being
    appended; of a file a run is still writing, read it through
    [`physjax.io.read_retrying`][] (as for [`physjax.io.read_attrs`][])."""
    path = os.fspath(path)
    try:  # a 0-d integer array too (jnp.int32(-1) was refused as "not an integer")
        if isinstance(index, (bool, np.bool_)):
            raise TypeError
        index = operator.index(index)
    except TypeError:
        raise TypeError(f"index must be an integer frame number, got {index!r}") from None
    with _reading(path) as f:
        if "time" not in f.dimensions:
            raise ValueError(
                f"{path!r} has no time axis, so no frames: read its time-independent fields "
                "(a Poisson solve's) with physjax.io.read_static"
            )
        n = _complete_frames(f, path)
        if n == 0:
            raise ValueError(f"{os.fspath(path)!r} holds no frame")
        if not -n <= index < n:
            held = "1 frame (0, or -1)" if n == 1 else f"{n} frames (0 to {n - 1}, or -1 to -{n})"
            raise ValueError(f"frame {index} is out of range: {os.fspath(path)!r} has {held}")
        index %= n
        out = {}
        for name, var in f.variables.items():
            if var.dimensions and var.dimensions[0] == "time":
                out[name] = np.asarray(var[index])
        return out
