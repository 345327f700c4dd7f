"""``physjax poisson``: solve a manufactured or user-supplied Poisson problem to NetCDF4.

Every setting is checked, the input fields read and the output paths tested before anything
is compiled or written. The right-hand side (and a coefficient) can come from any
NetCDF4/HDF5 variable — a physjax output file included, whose last frame is taken — and the
grid's shape, spacing and position are then those of the variable's coordinates.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import secrets
import sys
import time
from typing import Any

import numpy as np

CASES = ("periodic-sines", "dirichlet", "neumann", "variable-coefficient")
BCS = ("periodic", "dirichlet", "neumann")
METHODS = ("spectral", "multigrid", "cg")
#: Boundary conditions each manufactured case is built for (its exact solution satisfies them).
CASE_BC = {
    "periodic-sines": "periodic",
    "dirichlet": "dirichlet",
    "neumann": "neumann",
    "variable-coefficient": "dirichlet",
}
#: Settings of ``physjax poisson`` (also the keys allowed in its ``--config`` file).
POISSON_KEYS = (
    "case",
    "rhs",
    "coefficient",
    "shift",
    "frame",
    "bc",
    "method",
    "nx",
    "ny",
    "nz",
    "n",
    "lx",
    "ly",
    "lz",
    "rtol",
    "max_iterations",
    "compatibility",
    "precision",
    "devices",
    "output",
    "plot",
    "quiet",
)
#: The most iterations a solve takes: its counter is a 32-bit integer where float64 is off.
MAX_ITERATIONS = 2**31 - 1
DEFAULTS = dict(
    case="periodic-sines",
    n=64,
    precision="float64",
    devices=1,
    output="poisson.h5",
    compatibility="project",
    max_iterations=100,
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``poisson`` subcommand."""
    from .cli import _OneFile

    p = subparsers.add_parser(
        "poisson",
        help="solve a Poisson / elliptic problem",
        description=(
            "Solve ∇·(a∇u) = f (a = 1 unless a coefficient is given; ∇·(a∇u) − C u = f with "
            "--shift C) for cell-centred u on a 2-D or 3-D box; write u, f and the residual "
            "f − Au to NetCDF4. Settings on the command line override --config, which "
            "overrides the defaults."
        ),
    )
    p.add_argument(
        "--case",
        choices=CASES,
        help="manufactured problem (default periodic-sines); with --rhs it only sets the "
        "default boundary conditions",
    )
    p.add_argument(
        "--rhs",
        metavar="FILE:VARIABLE",
        help="right-hand side f from a NetCDF4/HDF5 variable (2-D or 3-D, optionally with a "
        "leading time dimension); the grid takes its shape and coordinates",
    )
    p.add_argument(
        "--coefficient",
        metavar="FILE:VARIABLE",
        help="coefficient a > 0 of ∇·(a∇u) from a NetCDF4/HDF5 variable of the grid's shape",
    )
    p.add_argument(
        "--frame",
        type=int,
        help="frame of a time-dependent --rhs/--coefficient variable (default: the last)",
    )
    p.add_argument(
        "--shift",
        type=float,
        help="C > 0: solve div(a grad u) - C u = f instead (a Helmholtz term, as implicit "
        "time steps need; no compatibility condition then)",
    )
    p.add_argument(
        "--bc",
        help="boundary conditions periodic, dirichlet or neumann: one for every axis, or one "
        "per axis in grid order (z,)y,x, e.g. dirichlet,periodic (default: the case's)",
    )
    p.add_argument(
        "--method",
        choices=METHODS,
        help="spectral (exact, constant coefficient; default), multigrid, or cg "
        "(multigrid-preconditioned; default with a coefficient)",
    )
    p.add_argument("--nx", type=int, help="cells in x")
    p.add_argument("--ny", type=int, help="cells in y")
    p.add_argument("--nz", type=int, help="cells in z (makes the problem 3-D)")
    p.add_argument(
        "--n",
        type=int,
        help="cells in x and y (default 64; sets both, except one given by --nx or --ny)",
    )
    p.add_argument("--lx", type=float, help="domain length in x [m] (default 1, or from --rhs)")
    p.add_argument("--ly", type=float, help="domain length in y [m] (default 1, or from --rhs)")
    p.add_argument("--lz", type=float, help="domain length in z [m] (default 1, or from --rhs)")
    p.add_argument(
        "--rtol",
        type=float,
        help="relative residual to reach (multigrid/cg; default 1e-10 in float64, 1e-5 in float32)",
    )
    p.add_argument(
        "--max-iterations",
        dest="max_iterations",
        type=int,
        help="cycles or CG iterations before giving up (default 100)",
    )
    p.add_argument(
        "--compatibility",
        choices=("project", "check"),
        help="periodic/Neumann problems need a zero-mean f: 'project' (default) removes the "
        "mean and reports it, 'check' refuses such an f",
    )
    p.add_argument("--precision", choices=("float32", "float64"), help="default float64")
    p.add_argument(
        "--devices",  # checked with the config file's value, for one-line errors
        help="devices to split the grid over: a count (4) or a layout, y×x (2x2) or, for a "
        "3-D problem, z×y×x (1x2x2); a count 4 is 2x2 in 2-D, 1x2x2 in 3-D",
    )
    p.add_argument("--output", help="NetCDF4/HDF5 output file (default poisson.h5)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output whatever it holds: a shallow-water run, an "
        "unfinished solve, a file physjax did not write (a Poisson solve that ended is "
        "replaced without it)",
    )
    p.add_argument(
        "--plot",
        help="quick-look PNG of u, the residual and the error (or f, where no exact solution "
        "is known: a --rhs, or a --bc other than the case's)",
    )
    p.add_argument(
        "--config",
        action=_OneFile,
        help="TOML file of these settings (keys as the long options), or the .h5 file of "
        "an earlier solve, whose problem is solved again",
    )
    p.add_argument(
        "--quiet", action="store_true", default=None, help="no status line before the solve"
    )
    p.set_defaults(func=run)
    return p


# ------------------------------------------------------------------------------ settings
def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Defaults, then the ``--config`` file, then the command line; checked."""
    from .cli import _parse_devices, _positive_number, resolve_settings

    settings = resolve_settings(args, POISSON_KEYS, parameters=False)
    settings.pop("parameters", None)
    # the settings the command was given, stored: a --config of its file replays them
    # (--n arrives as nx and ny; "_given_as" is resolve_settings' own, for messages)
    settings["given"] = sorted(
        k for k, v in settings.items() if v is not None and not k.startswith("_")
    )
    settings["case_given"] = "case" in settings
    # the stopping rule of the iterative methods, as given (command line or config file)
    settings["iteration_options"] = [k for k in ("rtol", "max_iterations") if k in settings]
    for key, value in DEFAULTS.items():
        if key != "n":
            settings.setdefault(key, value)

    if settings["output"] == "":  # not "the default": a script's --output "$OUT" with OUT unset
        raise ValueError("--output must name a file, got ''")
    if settings["case"] not in CASES:
        raise ValueError(f"--case must be one of {', '.join(CASES)}, got {settings['case']!r}")
    if settings["precision"] not in ("float32", "float64"):
        raise ValueError(f"--precision must be float32 or float64, got {settings['precision']!r}")
    if settings.get("method") is not None and settings["method"] not in METHODS:
        raise ValueError(
            f"--method must be one of {', '.join(METHODS)}, got {settings['method']!r}"
        )
    if settings["compatibility"] not in ("project", "check"):
        raise ValueError(
            f"--compatibility must be project or check, got {settings['compatibility']!r}"
        )
    if isinstance(settings["devices"], str):  # from a config file: "4" or "2x2"
        try:
            settings["devices"] = _parse_devices(settings["devices"])
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None
    for key in ("nx", "ny", "nz"):
        if settings.get(key) is not None:
            settings[key] = _positive_number(f"--{key}", settings[key], integer=True)
    for key in ("lx", "ly", "lz"):
        if settings.get(key) is not None:
            settings[key] = _positive_number(f"--{key}", settings[key])
    settings["max_iterations"] = _positive_number(
        "--max-iterations", settings["max_iterations"], integer=True
    )
    if settings["max_iterations"] > MAX_ITERATIONS:  # the solve counts in 32-bit integers
        raise ValueError(
            f"--max-iterations must be at most {MAX_ITERATIONS} (2**31 - 1), got "
            f"{settings['max_iterations']}"
        )
    rtol = settings.get("rtol")
    if rtol is not None:
        ok = isinstance(rtol, (int, float)) and not isinstance(rtol, bool)
        if not (ok and math.isfinite(rtol) and 0 < rtol < 1):
            raise ValueError(f"--rtol must be a number in (0, 1), got {rtol!r}")
        settings["rtol"] = float(rtol)
    if settings.get("shift") is not None:
        settings["shift"] = _positive_number("--shift", settings["shift"])
    frame = settings.get("frame")
    if frame is not None and (isinstance(frame, bool) or not isinstance(frame, int)):
        raise ValueError(f"--frame must be an integer, got {frame!r}")
    bc = settings.get("bc")
    if isinstance(bc, str):
        bc = [b.strip() for b in bc.split(",")]
    if bc is not None:
        if not isinstance(bc, (list, tuple)) or not all(isinstance(b, str) for b in bc):
            raise ValueError(f"--bc must be names like dirichlet,periodic, got {bc!r}")
        bad = [b for b in bc if b not in BCS]
        if bad or not bc:
            raise ValueError(
                f"--bc: unknown boundary condition(s) {bad}; each axis takes one of "
                f"{', '.join(BCS)}"
            )
        settings["bc"] = list(bc)
    for key in ("rhs", "coefficient"):
        spec = settings.get(key)
        if spec is not None and (not isinstance(spec, str) or ":" not in spec):
            raise ValueError(f"--{key} must be FILE:VARIABLE, e.g. run.h5:zeta, got {spec!r}")
    return settings


# ---------------------------------------------------------------------------- input files
def read_field(spec: str, frame: int | None, option: str, strict: bool = True) -> dict[str, Any]:
    """The values of ``FILE:VARIABLE`` (one frame if it has a time dimension), with the
    names and values of its dimension coordinates and its ``units``. With ``strict``, a
    ``frame`` given for a variable without a time dimension is an error.

    A running physjax writer locks the file while it appends a frame, and one that finds the
    file open here goes on without the lock and may extend it while it is read ("truncated
    file", "addr overflow"): the read is then started again, for a few seconds
    ([`physjax.io.read_retrying`][])."""
    from .io import read_retrying

    def read():
        try:
            return _read_field(spec, frame, option, strict)
        except (OSError, RuntimeError) as e:  # HDF5's, reading the variable
            lacking = any(w in str(e).lower() for w in ("filter", "plugin"))
            hint = (
                " (it is compressed with an HDF5 filter this installation lacks: set "
                "HDF5_PLUGIN_PATH to a folder holding the filter's plugin, or store the "
                "variable uncompressed or with zlib)"
            )
            raise ValueError(
                f"--{option}: cannot read {spec}: {e}{hint if lacking else ''}"
            ) from None

    return read_retrying(spec.rsplit(":", 1)[0], read, prefix=f"--{option}: ")


def _netcdf4_dimension_scales(ds) -> list | None:
    """The dimension scale of each dimension of a netCDF-4 variable that is itself a
    dimension scale (named like its first dimension), by the ids in its
    ``_Netcdf4Coordinates`` and the ``_Netcdf4Dimid`` of the scales in its group and the
    groups above; ``None`` where they do not tell them all."""
    import h5py

    ids = ds.attrs.get("_Netcdf4Coordinates")
    if ids is None or np.ndim(ids) != 1 or len(ids) != ds.ndim:
        return None
    found: dict[int, Any] = {}
    group = ds.parent
    while True:
        for obj in group.values():  # the innermost group's dimension first
            scale = isinstance(obj, h5py.Dataset) and obj.is_scale  # (variables carry ids too)
            dimid = obj.attrs.get("_Netcdf4Dimid") if scale else None
            if dimid is not None and np.size(dimid) == 1:
                found.setdefault(int(np.asarray(dimid).ravel()[0]), obj)
        if group.name == "/":
            break
        group = group.parent
    scales = [found.get(int(i)) for i in ids]
    return None if any(s is None for s in scales) else scales


def _read_field(spec: str, frame: int | None, option: str, strict: bool) -> dict[str, Any]:
    import h5py

    from .io._reading import transient_error

    path, name = spec.rsplit(":", 1)
    if not os.path.exists(path):
        raise ValueError(f"--{option}: file {path!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"--{option}: {path!r} is not a regular file (a folder, device or pipe)")
    fh = _open_for_reading(path, option)
    with fh:
        try:
            ds = fh[name.lstrip("/")]
        except KeyError as e:  # no such name; not an object header a writer is rewriting
            if transient_error(e):
                raise
            ds = None
        if not isinstance(ds, h5py.Dataset):
            have = []  # in groups too, named as --rhs takes them (grp/f)
            fh.visititems(
                lambda k, v: have.append(k) if isinstance(v, h5py.Dataset) and v.ndim >= 2 else None
            )
            have.sort()
            raise ValueError(
                f"--{option}: {path!r} has no variable {name!r}; variables with two or more "
                f"dimensions: {have}"
            )
        dims, coords, coord_units, timelike, boundaries, positive = [], [], [], [], [], []
        # netCDF-4 makes a variable that shares its name with its first dimension, lev(lev,
        # y, x), that dimension's scale and attaches none to it: its dimensions are then
        # found by their netCDF ids
        own = _netcdf4_dimension_scales(ds) if ds.is_scale and ds.ndim > 1 else None
        for k, d in enumerate(ds.dims):
            scales = list(d.values())
            scale = scales[0] if scales else None
            if scale is None and own is not None:
                scale = own[k]
            label = scale.name.rsplit("/", 1)[-1] if scale is not None else (d.label or None)
            if label is None and ds.is_scale and k == 0:  # a variable is its own dimension
                label = ds.name.rsplit("/", 1)[-1]
            dims.append(label)
            values = unit = None
            attrs = {}
            if scale is not None and scale.ndim == 1 and scale.shape[0] > 0:
                attrs = {k: _text(v) for k, v in scale.attrs.items()}
                # a coordinate of labels (text) gives no positions: taken as none
                if np.issubdtype(scale.dtype, np.number) and not attrs.get("NAME", "").startswith(
                    "This is a netCDF dimension but not a netCDF variable"
                ):
                    values = np.asarray(scale[...])  # float32 kept: its rounding is known
                    if values.dtype.kind != "f":
                        values = values.astype(float)
                    unit = attrs.get("units")
            coords.append(values)
            coord_units.append(unit)
            timelike.append(_is_time(label, attrs))
            boundaries.append(attrs.get("boundary"))
            positive.append(str(attrs.get("positive", "")).strip().lower() or None)  # CF's z
        units = ds.attrs.get("units")  # text, also as bytes or a 1-element array (MATLAB's)
        units = None if units is None else _text(units)
        shape = ds.shape
        stored = tuple(d or "?" for d in dims)  # as the file has them, a time dimension too
        time_value = time_units = None
        later = [k for k in range(1, len(dims)) if timelike[k]]
        if later:
            raise ValueError(
                f"--{option}: {spec} has dimensions {tuple(d or '?' for d in dims)}, with time "
                f"({dims[later[0]]!r}) not first; physjax poisson reads one frame of a leading "
                f"time dimension: store the variable with time first (e.g. with xarray, "
                f"ds.transpose({dims[later[0]]!r}, ...))"
            )
        if dims and timelike[0]:
            from .io._netcdf import _frames_counted

            # a physjax file: frames beyond n_frames are incomplete (a bad count is refused)
            try:
                count = _frames_counted(fh.attrs.get("n_frames"), shape[0], path)
            except ValueError as e:
                raise ValueError(f"--{option}: {e}") from None
            index = -1 if frame is None else frame
            if count == 0:
                why = (
                    "time dimension of size 0"
                    if shape[0] == 0
                    else f"n_frames = 0 in the file: none of its {shape[0]} time entries is a "
                    "whole frame; a run still writing its first frame, or one stopped in it"
                )
                raise ValueError(f"--{option}: {spec} has no frame ({why})")
            if not -count <= index < count:
                from ._plot import frames_text

                raise ValueError(
                    f"--frame {frame} is out of range: {spec} has {frames_text(count)}"
                )
            index = index % count  # counted from the last complete frame
            data = _decode_cf(ds, np.asarray(ds[index]), option, spec)
            if coords[0] is not None:
                time_value, time_units = float(coords[0][index]), coord_units[0]
            dims, coords, coord_units = dims[1:], coords[1:], coord_units[1:]
            boundaries, positive = boundaries[1:], positive[1:]
        else:
            if frame is not None and strict:
                raise ValueError(f"--frame given, but {spec} has no time dimension")
            data = _decode_cf(ds, np.asarray(ds[...]), option, spec)
            index = None
    # a dimension of size 1 not named x, y or z (a single level, a member): a 2-D field
    # stored with it is solved in 2-D, not as a 3-D box one cell thick (whose Dirichlet
    # walls half a cell above and below would change the solution)
    flat = [k for k in range(data.ndim) if data.shape[k] == 1 and _axis_of(dims[k]) is None]
    if flat and data.ndim > 2 and data.ndim - len(flat) >= 2:
        keep = [k for k in range(data.ndim) if k not in flat]
        _note(
            f"physjax poisson: note: {spec} has dimensions {tuple(d or '?' for d in dims)} of "
            f"shape {data.shape}; dropped the dimension(s) of size 1 "
            f"{', '.join(repr(dims[k] or '?') for k in flat)}"
        )
        data = data.reshape([data.shape[k] for k in keep])
        dims, coords, coord_units, boundaries, positive = (
            [v[k] for k in keep] for v in (dims, coords, coord_units, boundaries, positive)
        )
    if data.ndim not in (2, 3):
        raise ValueError(
            f"--{option}: {spec} has dimensions {stored} of shape {shape}; need a 2-D (y, x) "
            f"or 3-D (z, y, x) field"
            + ("" if index is None else f" (after its leading time dimension {stored[0]!r})")
        )
    if not np.issubdtype(data.dtype, np.number) or data.dtype == bool:
        raise ValueError(f"--{option}: {spec} is not numeric (dtype {data.dtype})")
    if np.iscomplexobj(data):  # its imaginary part would be dropped with a warning only
        raise ValueError(f"--{option}: {spec} is complex (dtype {data.dtype}); give a real field")
    if data.size == 0:
        raise ValueError(f"--{option}: {spec} holds no values (shape {data.shape})")
    if not data.dtype.isnative:  # big-endian in the file: JAX takes native byte order only
        data = data.astype(data.dtype.newbyteorder("="))
    bad = int(np.sum(~np.isfinite(data)))
    if bad:
        raise ValueError(f"--{option}: {spec} holds {bad} non-finite value(s) (NaN/Inf)")
    field = dict(
        data=data,
        dims=dims,
        coords=coords,
        coord_units=coord_units,
        units=units,
        frame=index,
        time=time_value,
        time_units=time_units,
        boundaries=boundaries,
        positive=positive,
        spec=spec,
    )
    return _in_grid_order(field, option)


def _check_range(field: dict[str, Any], precision: str, option: str) -> None:
    """Refuse values that the working precision cannot hold: a float64 field's values
    beyond float32's range would be solved as inf (the file holds no inf, and its check
    for non-finite values passed)."""
    data = field["data"]
    limit = float(np.finfo(precision).max)
    if data.dtype.kind != "f" or data.dtype.itemsize <= np.dtype(precision).itemsize:
        return
    largest = float(np.max(np.abs(data)))
    if largest > limit:
        raise ValueError(
            f"--{option}: {field['spec']} holds values up to {largest:.3g} in magnitude, beyond "
            f"the range of --precision {precision} (±{limit:.3g}), where they would be inf; "
            f"use --precision float64, or rescale the field"
        )


def _iterations(k: int) -> str:
    """``"1 iteration"``, ``"2 iterations"``."""
    return f"{k} iteration{'' if k == 1 else 's'}"


def _text(value) -> Any:
    """An HDF5 attribute as Python text when it is text."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.ndarray) and value.dtype.kind in "SO" and value.size == 1:
        return _text(value.ravel()[0])
    return value if isinstance(value, str) else str(value)


#: Dimension names taken as time, whatever their attributes (WRF's ``Time``, NEMO's
#: ``time_counter``); other dimensions are time when their coordinate says so (CF).
_TIME_NAMES = ("time", "t", "time_counter")


def _is_time(label: str | None, attrs: dict) -> bool:
    """Whether a dimension is a time axis: by its name, or by its coordinate's CF attributes
    (``axis = "T"``, ``standard_name = "time"``, units "<unit> since <date>")."""
    if label and label.lower() in _TIME_NAMES:
        return True
    units = str(attrs.get("units", ""))
    return (
        str(attrs.get("axis", "")).upper() == "T"
        or str(attrs.get("standard_name", "")).lower() == "time"
        or " since " in units
    )


def _open_for_reading(path: str, option: str):
    """``h5py.File(path, "r")``; a netCDF-3 file named as such. An error that a writer
    holding or extending the file causes passes in a moment, and its text stays in the
    ``ValueError`` raised here for [`physjax.io.read_retrying`][] to see."""
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as e:
        try:
            with open(path, "rb") as fh:
                head = fh.read(4)
        except OSError:
            head = b""
        if head in (b"CDF\x01", b"CDF\x02", b"CDF\x05"):
            raise ValueError(
                f"--{option}: {path!r} is a netCDF-3 (classic) file; physjax reads "
                f"NetCDF4/HDF5: convert it, e.g. nccopy -k nc4 {path} out.nc, or with "
                f"xarray: xr.open_dataset({path!r}).to_netcdf('out.nc', engine='h5netcdf')"
            ) from None
        from .io._reading import LOCKS_UNSUPPORTED, locks_unsupported

        if locks_unsupported(e):
            raise ValueError(
                f"--{option}: cannot read {path!r}: {e}; {LOCKS_UNSUPPORTED}"
            ) from None
        raise ValueError(f"--{option}: cannot read {path!r} as a NetCDF4/HDF5 file: {e}") from None


def _axis_of(dim: str | None) -> str | None:
    """``x``, ``y`` or ``z`` for a dimension named so (or ``x_f``…, a face dimension)."""
    if not dim:
        return None
    name = dim.lower()
    name = name[:-2] if name.endswith("_f") else name
    return name if name in ("x", "y", "z") else None


def _note(text: str) -> None:
    """A line on stderr, dropped where stderr cannot be written (``physjax.cli._note``)."""
    from .cli import _note

    _note(text)


def _report(text: str, out) -> None:
    """The closing line, dropped where stdout cannot take it (``physjax.cli._report``)."""
    from .cli import _report

    _report(text, out)


def _note_other_boundaries(field: dict, bc, names) -> None:
    """A note on stderr for each axis whose coordinate records a boundary (a physjax run's
    ``boundary`` attribute: ``periodic`` or ``wall``) other than the one ``--bc`` gives."""
    for axis, (recorded, b) in enumerate(zip(field.get("boundaries") or [], bc)):
        if recorded not in ("periodic", "wall") or (recorded == "periodic") == (b == "periodic"):
            continue
        _note(
            f"physjax poisson: note: the {names[axis]} axis of {field['spec']} is {recorded} "
            f"in the file that wrote it; --bc gives it {b}"
        )


def _in_metres(values: np.ndarray, unit: str | None) -> np.ndarray | None:
    """Coordinate values in metres (``None`` for units that are no length)."""
    if not unit:
        return values
    factor = LENGTH_UNITS.get(unit.strip().lower())
    return None if factor is None else values * factor


def _check_coefficient_grid(rhs: dict, coef: dict, names) -> None:
    """Refuse a coefficient that does not sit where the right-hand side does: along an axis,
    one on faces (``x_f``) and the other at centres, or coordinates that differ."""
    for axis, name in enumerate(names):
        dr, dc = rhs["dims"][axis], coef["dims"][axis]
        if _axis_of(dr) and _axis_of(dc) and dr.lower().endswith("_f") != dc.lower().endswith("_f"):
            raise ValueError(
                f"--coefficient {coef['spec']} lies on {dc!r} along {name}, --rhs "
                f"{rhs['spec']} on {dr!r}: one on cell faces, the other at cell centres; give "
                f"the coefficient at the right-hand side's points"
            )
        vr, vc = rhs["coords"][axis], coef["coords"][axis]
        if vr is None or vc is None:
            continue
        rounding = max(float(np.finfo(v.dtype).eps) for v in (vr, vc))  # float32's, if stored so
        vr, vc = vr.astype(float), vc.astype(float)
        mr, mc = _in_metres(vr, rhs["coord_units"][axis]), _in_metres(vc, coef["coord_units"][axis])
        if mr is None or mc is None:
            continue
        span = float(np.ptp(mr)) or 1.0
        tol = max(1e-6 * span, 4 * rounding * float(np.max(np.abs(mr))))
        if not np.allclose(mr, mc, rtol=0, atol=tol):
            raise ValueError(
                f"--coefficient {coef['spec']}: its {name} coordinate ({mc[0]:g} … {mc[-1]:g} m) "
                f"is not the one of --rhs {rhs['spec']} ({mr[0]:g} … {mr[-1]:g} m); give the "
                f"coefficient on the right-hand side's grid"
            )


_POWER = re.compile(r"([A-Za-z]+)(-?[0-9]+)?")


def _powers(units: str) -> dict[str, int] | None:
    """A unit string of the form ``s-1 m2`` (products of integer powers) as ``{unit: power}``,
    ``None`` for anything else."""
    out: dict[str, int] = {}
    for token in units.split():
        if token == "1":
            continue
        m = _POWER.fullmatch(token)
        if m is None:
            return None
        out[m[1]] = out.get(m[1], 0) + int(m[2] or 1)
    return out


def _solution_units(f_units: str, a_units: str) -> str:
    """The units of u in div(a grad u) = f: those of f times m2 over those of a."""
    f, a = _powers(f_units), _powers(a_units)
    if f is None or a is None:
        return f"({f_units}) m2 / ({a_units})"
    total = dict(f)
    total["m"] = total.get("m", 0) + 2
    for unit, power in a.items():
        total[unit] = total.get(unit, 0) - power
    parts = [u if p == 1 else f"{u}{p}" for u, p in total.items() if p]
    return " ".join(parts) or "1"


def _note_staggered_walls(field: dict, bc, names, extent, shape) -> None:
    """A note on stderr for each walled axis along which the right-hand side lies on faces
    (``zeta`` on a run's corners, ``v`` on its y faces): the solve takes the values as cell
    centres, so its wall is half a cell beyond the first and last values, not where the
    run's wall was (its first face lies on that wall). Along an axis that the file records
    as periodic the run had no walls there, and the note says only where the solve's are
    (`_note_other_boundaries` names the periodic axis)."""
    recorded = list(field.get("boundaries") or [None] * len(bc))
    for axis, (dim, b) in enumerate(zip(field["dims"], bc)):
        if b == "periodic" or not (dim or "").lower().endswith("_f"):
            continue
        name = names[axis]
        walls = (
            "" if recorded[axis] == "periodic" else ", not on the walls of the run that wrote it"
        )
        _note(
            f"physjax poisson: note: {field['spec']} lies on {name} faces ({dim}); its "
            f"values are taken as cell centres, so the {b} boundaries are half a cell "
            f"(d{name}/2 = {extent[axis] / shape[axis] / 2:g} m) beyond its first and last "
            f"values{walls} (docs/poisson.md)"
        )


def _in_grid_order(field: dict, option: str) -> dict:
    """A field whose dimensions are named x, y (and z) is put in the grid's order (z,) y, x,
    transposed if it is stored otherwise. Dimensions with other names take the axes left
    over, in their stored order (a note says which); a field with no such names is taken
    by position."""
    dims = field["dims"]
    ndim = field["data"].ndim
    want = ("z", "y", "x")[3 - ndim :]
    axes = [_axis_of(d) for d in dims]
    named = [a for a in axes if a is not None]
    if len(set(named)) != len(named) or not set(named) <= set(want):
        raise ValueError(
            f"--{option}: {field['spec']} has dimensions {tuple(dims)}; a {ndim}-D field "
            f"needs dimensions along {', '.join(want)}"
        )
    if named and len(named) < ndim:
        free = iter(a for a in want if a not in named)
        axes = [a if a is not None else next(free) for a in axes]
    if named and len(named) < ndim and axes != list(want):
        taken = ", ".join(f"{d or '?'!r} as {a}" for d, a in zip(dims, axes) if _axis_of(d) is None)
        _note(
            f"physjax poisson: note: {field['spec']} has dimensions {tuple(dims)}; took "
            f"{taken} (the axes its named dimensions leave)"
        )
    if not named:
        return field
    order = [axes.index(a) for a in want]
    if order == list(range(ndim)):
        return field
    return {
        **field,
        "data": np.transpose(field["data"], order),
        **{
            key: [field[key][k] for k in order]
            for key in ("dims", "coords", "coord_units", "boundaries", "positive")
            if key in field
        },
    }


def _decode_cf(ds, raw: np.ndarray, option: str, spec: str) -> np.ndarray:
    """The values a CF reader (xarray, netCDF4) sees: cells equal to ``_FillValue`` or
    ``missing_value`` are missing (an error: a solve needs every cell), integers marked
    ``_Unsigned = "true"`` (``"false"``) are read unsigned (signed), as netCDF stores
    unsigned data in signed types (satellite products' packed counts), and packed data is
    unpacked as ``raw * scale_factor + add_offset``."""
    if not np.issubdtype(raw.dtype, np.number):
        return raw
    missing = np.zeros(raw.shape, bool)
    for key in ("_FillValue", "missing_value"):
        value = ds.attrs.get(key)
        if value is not None:
            marks = np.atleast_1d(np.asarray(value)).ravel()
            marks = marks[~np.isnan(marks)] if np.issubdtype(marks.dtype, np.floating) else marks
            missing |= np.isin(raw, marks)
    if missing.any():
        raise ValueError(
            f"--{option}: {spec} has {int(missing.sum())} missing value(s) (cells equal to its "
            f"_FillValue/missing_value); fill them before solving"
        )
    unsigned = ds.attrs.get("_Unsigned")
    if unsigned is not None and raw.dtype.kind in "iu":
        flag = str(_text(unsigned)).strip().lower()
        kind = {"true": "u", "false": "i"}.get(flag, raw.dtype.kind)
        raw = raw.view(f"{raw.dtype.str[0]}{kind}{raw.dtype.itemsize}")  # byte order kept
    scale = ds.attrs.get("scale_factor")
    offset = ds.attrs.get("add_offset")
    if scale is None and offset is None:
        return raw
    for key, value in (("scale_factor", scale), ("add_offset", offset)):
        number = np.asarray(value)
        if value is not None and (number.size != 1 or number.dtype.kind not in "iuf"):
            # text ("0.5") or several values stopped in NumPy, naming neither
            raise ValueError(
                f"--{option}: {spec} has {key} = {_text(value)!r}, not a number: packed "
                f"data are unpacked as raw * scale_factor + add_offset, each one number"
            )
    scale = None if scale is None else np.asarray(scale).ravel()[0]
    offset = None if offset is None else np.asarray(offset).ravel()[0]
    dtype = np.result_type(
        np.float32, *(np.asarray(v).dtype for v in (scale, offset) if v is not None)
    )
    data = raw.astype(dtype)
    if scale is not None:
        data = data * np.asarray(scale, dtype)
    if offset is not None:
        data = data + np.asarray(offset, dtype)
    return data


#: Coordinate units read as lengths, and their size in metres.
LENGTH_UNITS = {
    **dict.fromkeys(("m", "meter", "meters", "metre", "metres"), 1.0),
    **dict.fromkeys(("km", "kilometer", "kilometers", "kilometre", "kilometres"), 1e3),
}


def _geometry_from_coords(field: dict, lengths: list, names: tuple[str, ...]):
    """Lengths and origin per axis: given lengths win; otherwise uniform coordinates of the
    variable (its values at the cell centres, in metres or km, or without units); otherwise
    a unit length."""
    extent, origin = [], []
    for axis, (given, values) in enumerate(zip(lengths, field["coords"])):
        n = field["data"].shape[axis]
        if given is None and values is not None and n < 2:
            raise ValueError(
                f"--rhs: the {names[axis]} coordinate of {field['spec']} has one value, "
                f"which gives no spacing: give the domain length with --l{names[axis]}"
            )
        if given is not None or values is None:
            extent.append(given if given is not None else 1.0)
            origin.append(0.0)
            continue
        unit = field["coord_units"][axis]
        rounding = float(np.finfo(values.dtype).eps)  # of the stored values
        values = values.astype(float)
        if unit:
            if unit.strip().lower() not in LENGTH_UNITS:
                raise ValueError(
                    f"--rhs: the {names[axis]} coordinate of {field['spec']} is in {unit!r}; "
                    f"physjax poisson solves on a Cartesian grid in metres: give the domain "
                    f"length with --l{names[axis]}"
                )
            values = values * LENGTH_UNITS[unit.strip().lower()]
        step = np.diff(values)
        d = float(values[-1] - values[0]) / (n - 1)
        # uniform to 1e-6 of the step, or to the rounding of the stored values: float32
        # coordinates keep a 100 m step at 1000 km to 6e-4 of itself, 0.1 km steps to 5e-6
        tol = max(1e-6 * abs(d), 4 * rounding * float(np.max(np.abs(values))))
        uniform = bool(np.allclose(step, d, rtol=0, atol=tol))
        if d < 0 and uniform:  # --l… would reverse the axis
            dim = field["dims"][axis] or names[axis]
            raise ValueError(
                f"--rhs: the {names[axis]} coordinate of {field['spec']} decreases "
                f"({values[0]:g} … {values[-1]:g}); the grid's first cell is its lowest: "
                f"store the variable with {dim} increasing (with xarray, ds.sortby({dim!r})) "
                f"— a length given with --l{names[axis]} would take the values by position, "
                f"the axis reversed"
            )
        if not (d > 0 and uniform):
            raise ValueError(
                f"--rhs: the {names[axis]} coordinate of {field['spec']} is not uniformly "
                f"increasing; give the domain length with --l{names[axis]}"
            )
        extent.append(n * d)
        origin.append(float(values[0]) - d / 2)
    return extent, origin


# ------------------------------------------------------------------------ manufactured
def manufactured(case: str, grid) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Exact solution, right-hand side and coefficient (or None) of a manufactured case on
    ``grid`` (origin at 0), scaled to its lengths."""
    xs = grid.mesh_coordinates(("centre",) * grid.ndim)
    pi = np.pi
    L = grid.extent
    if case == "periodic-sines":
        u = np.prod([np.sin(2 * pi * x / l) for x, l in zip(xs, L)], axis=0)
        return u, -sum((2 * pi / l) ** 2 for l in L) * u, None
    if case in ("dirichlet", "variable-coefficient"):
        u = np.prod([np.sin(pi * x / l) for x, l in zip(xs, L)], axis=0)
        f = -sum((pi / l) ** 2 for l in L) * u
        a = None
        if case == "variable-coefficient":
            x, lx = xs[-1], L[-1]
            a = 1 + 0.5 * np.sin(2 * pi * x / lx)
            # ∇·(a∇u) = a ∇²u + ∂a/∂x ∂u/∂x
            others = np.prod([np.sin(pi * y / l) for y, l in zip(xs[:-1], L[:-1])], axis=0)
            dudx = pi / lx * np.cos(pi * x / lx) * others
            f = a * f + pi / lx * np.cos(2 * pi * x / lx) * dudx
        return u, f, a
    u = np.prod([np.cos(pi * x / l) for x, l in zip(xs, L)], axis=0)
    return u, -sum((pi / l) ** 2 for l in L) * u, None


# ----------------------------------------------------------------------------------- run
def run(args) -> int:
    """Run the ``poisson`` subcommand (exit code 0, or 1 if the solve did not converge).
    The output is locked against a second physjax process from the overwrite check to
    the end (a running shallow-water file is never replaced under its writer)."""
    with contextlib.ExitStack() as held:
        return _run(args, held)


def _run(args, held: contextlib.ExitStack) -> int:
    from .cli import (
        _check_devices_divide,
        _check_plot_path,
        _plot_written,
        _stop_if_signalled,
        setup_jax,
    )

    s = resolve(args)
    given_as = s.pop("_given_as", None) or {}  # nx, ny set by --n (or a config's n)

    # Input fields first (read without jax): they fix the grid's shape and geometry.
    # --frame is for whichever of the two has a time dimension (both, if both have one)
    frame = s.get("frame")
    rhs = coef = None
    if s.get("rhs"):
        rhs = read_field(s["rhs"], frame, "rhs", strict=not s.get("coefficient"))
    if s.get("coefficient"):
        coef = read_field(s["coefficient"], frame, "coefficient", strict=rhs is None)
    for field, option in ((rhs, "rhs"), (coef, "coefficient")):
        if field is not None:
            _check_range(field, s["precision"], option)
    if frame is not None and rhs is None and coef is None:
        raise ValueError("--frame needs --rhs or --coefficient")
    if frame is not None and rhs is not None and coef is not None:
        if rhs["frame"] is None and coef["frame"] is None:
            raise ValueError(
                f"--frame given, but neither --rhs {s['rhs']} nor --coefficient "
                f"{s['coefficient']} has a time dimension"
            )
    if rhs is not None:
        shape = list(rhs["data"].shape)
        names = ("z", "y", "x")[3 - len(shape) :]
        for name, size in zip(names, shape):
            given = s.get(f"n{name}")
            if given is not None and given != size:
                # the option the user gave: --n (or n in --config) sets nx and ny unless
                # they are given too
                option = "--n" if f"n{name}" in given_as else f"--n{name}"
                raise ValueError(
                    f"{option}={given} does not match --rhs {s['rhs']}, whose shape is "
                    f"{tuple(shape)}; leave the grid size out to take the variable's"
                )
        if len(shape) == 2 and s.get("nz") is not None:
            raise ValueError(f"--nz given, but --rhs {s['rhs']} is 2-D (shape {tuple(shape)})")
    else:
        nx, ny = s.get("nx", 64), s.get("ny", 64)
        shape = [ny, nx] if s.get("nz") is None else [s["nz"], ny, nx]
    # before jax starts: on a CPU it simulates every device asked for, and a mistyped
    # --devices 5000 took seconds and 700 MB to be told that it does not divide the grid
    _check_devices_divide(s["devices"], tuple(shape))
    setup_jax(s["precision"], s["devices"])
    from .cli import _check_memory

    if rhs is None:
        _check_memory(nx, ny, s["precision"], s.get("nz"), "solve")
    else:  # the file's grid, as large as it may be
        nz = shape[0] if len(shape) == 3 else None
        _check_memory(shape[-1], shape[-2], s["precision"], nz, "solve", f"--rhs {s['rhs']}")
    ndim = len(shape)
    names = ("z", "y", "x")[3 - ndim :]
    if ndim == 2 and s.get("lz") is not None:
        raise ValueError(
            f"--lz given, but the problem is 2-D (shape {tuple(shape)}); give --nz for 3-D"
        )
    lengths = [s.get(f"l{name}") for name in names]
    if rhs is not None:
        extent, origin = _geometry_from_coords(rhs, lengths, names)
    else:
        extent, origin = [v if v is not None else 1.0 for v in lengths], [0.0] * ndim
    from .grids._grid import spacing_out_of_range

    for name, length, n in zip(names, extent, shape):
        problem = spacing_out_of_range(length, n, s["precision"])
        if problem:
            where = (
                f"--l{name} {length:g}"
                if s.get(f"l{name}") is not None
                else f"the {name} coordinate of --rhs {s['rhs']} ({length:g} m)"
            )
            raise ValueError(f"{where} {problem}")
    if coef is not None and tuple(coef["data"].shape) != tuple(shape):
        raise ValueError(
            f"--coefficient {s['coefficient']} has shape {coef['data'].shape}, the grid is "
            f"{tuple(shape)}"
        )
    if coef is not None and rhs is not None:
        _check_coefficient_grid(rhs, coef, names)

    case_bc = CASE_BC[s["case"]]
    if rhs is not None and not s.get("bc") and not s["case_given"]:
        raise ValueError(
            f"--rhs needs --bc, the boundary conditions of {s['rhs']}: one for every axis "
            f"or one per axis {','.join(names)}, e.g. periodic or dirichlet,periodic"
        )
    bc = s.get("bc") or [case_bc]
    if len(bc) == 1:
        bc = bc * ndim
    if len(bc) != ndim:
        raise ValueError(
            f"--bc needs one condition or {ndim} (one per axis {','.join(names)}), got "
            f"{len(bc)}: {','.join(bc)}"
        )
    if rhs is not None:
        _note_staggered_walls(rhs, bc, names, extent, shape)
        _note_other_boundaries(rhs, bc, names)
    if rhs is not None and s["case"] == "variable-coefficient" and coef is None:
        raise ValueError(
            "--case variable-coefficient defines its coefficient with its own right-hand "
            "side; with --rhs give the coefficient by --coefficient FILE:VARIABLE"
        )
    has_coefficient = coef is not None or (rhs is None and s["case"] == "variable-coefficient")
    method = s.get("method") or ("cg" if has_coefficient else "spectral")
    if method == "spectral" and has_coefficient:
        raise ValueError(
            "--method spectral needs a constant coefficient; use --method cg or multigrid"
        )
    if method == "spectral" and s["iteration_options"]:
        # a direct solve has no stopping rule: the options were ignored without a word
        given = " and ".join(f"--{k.replace('_', '-')}" for k in s["iteration_options"])
        which = "--method spectral" if s.get("method") else "the method is spectral (the default)"
        raise ValueError(
            f"{given} given, but {which}, a direct solve with no iterations to stop; "
            "they apply to --method multigrid or cg"
        )

    output = s["output"]
    for spec in (s.get("rhs"), s.get("coefficient")):
        if spec and os.path.exists(output):
            if os.path.samefile(spec.rsplit(":", 1)[0], output):
                raise ValueError(
                    f"--output {output!r} is the input file of {spec}; writing would destroy it"
                )
    from .cli import _check_not_the_config, _check_output_name, _check_overwrite
    from .io import check_writable, output_lock

    _check_output_name(output)
    overwrite = bool(getattr(args, "overwrite", False))
    _check_not_the_config(output, getattr(args, "config", None), overwrite)
    check_writable(output, "--output")
    held.enter_context(output_lock(output))
    replacing = _check_overwrite(output, overwrite, "poisson")
    _check_plot_path(s.get("plot"), output=output)

    import jax
    import jax.numpy as jnp

    from .grids import Grid
    from .io import NetCDFWriter, Variable
    from .io._reading import hidden_beside
    from .parallel import make_mesh
    from .solvers.poisson import PoissonSolver

    grid = Grid(
        shape,
        extent,
        periodic=tuple(b == "periodic" for b in bc),
        origin=origin,
        dtype=s["precision"],
    )
    exact = a = None
    shift = s.get("shift")
    if rhs is None:
        exact, f, a = manufactured(s["case"], grid)
        if any(b != case_bc for b in bc) or coef is not None:
            exact = None  # the case's solution does not solve this problem
        elif shift is not None:
            f = f - shift * exact  # the same exact u solves the shifted problem
    else:
        f = rhs["data"].astype(s["precision"])
    if coef is not None:
        a = coef["data"]
    from .cli import _shown_devices

    devices = s["devices"]
    mesh = None
    if devices not in (1, None, (1,) * ndim):
        try:
            mesh = make_mesh(
                tuple(devices) if isinstance(devices, (list, tuple)) else devices, ndim
            )
        except ValueError as e:
            raise ValueError(f"--devices {_shown_devices(devices)}: {e}") from None
    try:
        solver = PoissonSolver(
            grid,
            tuple(bc),
            method,
            coefficient=a,
            shift=shift,
            mesh=mesh,
            rtol=s.get("rtol"),
            max_iterations=s["max_iterations"],
            compatibility="project",  # --compatibility check is done below, on f's own round-off
            throw=False,
        )
    except ValueError as e:
        if coef is not None and str(e).startswith("coefficient"):
            raise ValueError(f"--coefficient {s['coefficient']}: {e}") from None
        if str(e).startswith("the spectral method on"):  # its slabs split by the devices
            raise ValueError(
                f"--devices {_shown_devices(devices)}: {e}; give a device count that divides "
                f"those sizes, or --method multigrid"
            ) from None
        if str(e).startswith("multigrid cannot coarsen"):
            sizes = " ".join(f"--n{n} {k}" for n, k in zip(names, shape))
            if rhs is not None:  # its sizes are the file's, not options given
                sizes = f"--rhs {s['rhs']} ({'×'.join(map(str, shape))})"
            text = str(e).replace("method='spectral'", "--method spectral")
            # max_coarse is a Python argument only: the command line keeps its default
            text = re.sub(r"max_coarse=(\d+)", r"\1", text)
            raise ValueError(f"--method {method} with {sizes}: {text}") from None
        raise
    f_mean = float(np.mean(f))
    scale = float(np.max(np.abs(f))) or 1.0
    # the solver's own round-off bound on the mean (compatibility="check"), or float32's for
    # a float32 input: a float32 run's vorticity sums to zero to float32's round-off only
    precision = "float32" if rhs is not None and rhs["data"].dtype == np.float32 else s["precision"]
    tolerance = PoissonSolver._mean_tolerance(np.asarray(f, precision))
    mean_is_round_off = abs(f_mean) <= tolerance * scale
    if solver.singular and s["compatibility"] == "check" and not mean_is_round_off:
        raise ValueError(
            f"f has mean {f_mean:.3e} (max |f| {scale:.3e}); a problem without Dirichlet "
            f"axes ({','.join(bc)}) needs ∫f = 0 — use --compatibility project to "
            f"remove the mean"
        )

    n_dev = 1 if mesh is None else mesh.size
    if not s.get("quiet"):
        _note(
            f"physjax poisson: {'×'.join(map(str, shape))} cells, bc {','.join(bc)}"
            + ("" if shift is None else f", shift {shift:g}")
            + f", {method} on {n_dev} device{'s' if n_dev > 1 else ''} "
            f"({jax.default_backend()})"
        )
    fj = jnp.asarray(f, s["precision"])
    start = time.perf_counter()
    sol = solver.solve(fj)
    jax.block_until_ready(sol)
    seconds = time.perf_counter() - start
    b = fj - jnp.mean(fj) if solver.singular else fj
    residual = np.asarray(solver.residual(sol.u, b))
    iterations = int(sol.iterations)
    rel_residual = float(sol.residual_norm)
    converged = bool(sol.converged)

    centre = ("centre",) * ndim
    a_units = "1" if coef is None else (coef["units"] or "1")
    unknown = ""
    if rhs is None:  # u dimensionless, unless a --coefficient with units divides it
        f_units = "m-2"
        u_units = _solution_units(f_units, a_units)
    else:
        f_units = rhs["units"] or "1"
        u_units = _solution_units(f_units, a_units)
        if not rhs["units"]:
            unknown = " (the input gave no units: taken as 1)"
    residual_name = "f - <f> - A u" if solver.singular else "f - A u"
    equation = "div(a grad u) = f" if shift is None else f"div(a grad u) - {shift:g} u = f"
    variables = [
        Variable("u", centre, u_units, f"solution of {equation}{unknown}", False),
        Variable("f", centre, f_units, f"right-hand side{unknown}", False),
        Variable("residual", centre, f_units, f"{residual_name} of the discrete problem", False),
    ]
    fields = {"u": sol.u, "f": f, "residual": residual}
    if a is not None:
        variables.append(Variable("a", centre, a_units, "coefficient a of div(a grad u)", False))
        fields["a"] = a
    errors = {}
    if exact is not None:
        err = np.asarray(sol.u) - exact
        if solver.singular:
            err = err - err.mean()
        variables += [
            Variable("u_exact", centre, "1", "manufactured exact solution", False),
            Variable("error", centre, "1", "u - u_exact (zero-mean gauge if singular)", False),
        ]
        fields.update(u_exact=exact, error=err)
        errors = dict(
            error_max=float(np.max(np.abs(err))),
            error_l2=float(np.sqrt(np.mean(err**2))),
        )
    config = dict(
        command="poisson",
        given=s["given"],
        case=s["case"] if rhs is None else "user",
        rhs=s.get("rhs") or "",
        coefficient=s.get("coefficient") or "",
        shift=shift,
        # the frame taken: the right-hand side's, else the coefficient's (-1: none)
        frame=next((x["frame"] for x in (rhs, coef) if x and x["frame"] is not None), -1),
        rhs_time=None if rhs is None else rhs["time"],  # of that frame, if it has one
        rhs_time_units=None if rhs is None else rhs["time_units"],
        # the coefficient's own frame (-1: none, or a static one), which need not be the
        # right-hand side's: each file's last frame by default
        coefficient_frame=-1 if coef is None or coef["frame"] is None else coef["frame"],
        coefficient_time=None if coef is None else coef["time"],
        coefficient_time_units=None if coef is None else coef["time_units"],
        bc=list(bc),
        method=method,
        shape=list(shape),
        extent=list(extent),
        origin=list(origin),
        rtol=solver.rtol,
        max_iterations=s["max_iterations"],
        compatibility=s["compatibility"],
        precision=s["precision"],
        devices=list(devices) if isinstance(devices, (list, tuple)) else devices,
        output=output,
        plot=s.get("plot") or "",
    )
    if replacing:  # named once every setting has passed, as the file is replaced
        _note(replacing)
    removed = solver.singular and s["compatibility"] == "project"
    summary = dict(
        iterations=iterations,
        residual_norm=rel_residual,
        converged=int(converged),
        solve_seconds=seconds,
        rhs_mean_removed=f_mean if removed else 0.0,
        **errors,
    )
    # Made and filled under a hidden name beside the output, then moved into place whole: an
    # interrupt or a failed write leaves an existing --output as it was (until 2026-12-07 it
    # was replaced as the new file was created, then removed with it) and no file begun.
    dest = os.path.realpath(output)  # a symbolic link is kept, the file it names replaced
    tmp = hidden_beside(dest, f".{os.getpid()}.{secrets.token_hex(4)}.solve")
    try:
        writer = NetCDFWriter(
            tmp,
            grid,
            variables,
            attrs=dict(
                # the case names its right-hand side; with other conditions it is not the case's
                # problem any more, and the name says so
                case=(
                    "user"
                    if rhs is not None
                    else s["case"]
                    if all(b == case_bc for b in bc)
                    else f"{s['case']} right-hand side, bc {','.join(bc)}"
                ),
                title="physjax poisson",
                # the problem's sizes as a shallow-water file gives them (parameter_nx, …)
                parameters={
                    **{f"n{n}": int(k) for n, k in zip(names, shape)},
                    **{f"L{n}": float(e) for n, e in zip(names, extent)},
                    "precision": s["precision"],
                    **({} if shift is None else {"shift": float(shift)}),
                },
                configuration=config,
            ),
            # a z read from a file whose coordinate increases downward (a depth) keeps saying so
            _z_positive="down"
            if ndim == 3 and rhs is not None and rhs["positive"][0] == "down"
            else "up",
        )
        writer.write_static({k: np.asarray(v) for k, v in fields.items()})
        if converged:
            writer.finish(**summary)
        else:
            writer.finish(
                status=f"failed: not converged after {_iterations(iterations)} (relative "
                f"residual {rel_residual:.2e} > rtol {solver.rtol:.3g})",
                **summary,
            )
        _stop_if_signalled()  # a stop whose raise was lost in a callback: the old file kept
        os.replace(tmp, dest)
    except BaseException as e:  # an interrupt or a failed write
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, (ValueError, OSError)):  # named as the user gave it
            e.args = tuple(a.replace(tmp, output) if isinstance(a, str) else a for a in e.args)
        raise
    if s.get("plot"):  # u, residual, and the error or f (as `physjax plot`)
        _plot_written(output, s["plot"], "complete" if converged else "marked failed")
    what = f"poisson {method}: "
    if method != "spectral":
        what += f"{_iterations(iterations)}, "
    what += f"relative residual {rel_residual:.2e}"
    if errors:
        what += f", max error vs exact {errors['error_max']:.2e}"
    what += f" in {seconds:.2f} s (compilation included)"
    if removed and not mean_is_round_off:
        what += f" (mean of f {f_mean:.3e} removed)"
    where = f"{output}" + (f" and {s['plot']}" if s.get("plot") else "")
    if not converged:
        _note(
            f"physjax poisson: {method} did not converge in {_iterations(iterations)} (relative "
            f"residual {rel_residual:.2e} > rtol {solver.rtol:.3g}); wrote {where}, marked failed"
        )
        return 1
    _report(f"{what}; wrote {where}", sys.stdout)  # dropped where stdout is full
    return 0
