"""Quick-look plots of physjax output files (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import os
import re

import numpy as np


def _axes(ds, dims, limits=(None, None)):
    """x and y coordinates of the panels and their unit: km for domains of 10 km or more
    (the extent of an axis by its ``limits`` where they are known: one cell has no span)."""
    ydim, xdim = dims
    x, y = np.asarray(ds[xdim], dtype=float), np.asarray(ds[ydim], dtype=float)
    spans = [np.ptp(v) if v.size else 0.0 for v in (x, y)]
    spans += [hi - lo for lo, hi in (lim for lim in limits if lim is not None)]
    span = max(spans)
    if span >= 1e4:
        return x / 1e3, y / 1e3, "km"
    return x, y, "m"


def _on_the_domain(var, ds):
    """``(var, (y_limits, x_limits))``: the domain's extent along the panel's two axes (None
    for a coordinate of one value), and ``var`` closed over a periodic axis it lies on the
    faces of.

    A field on the cell faces or corners (ζ of a shallow-water run) is drawn in cells centred
    on its points, half a cell lower than the domain: its panel went from −Δ/2 to L − Δ/2,
    beside a height panel from 0 to L, with other ticks. Every panel now shows the domain,
    0 to L; on a periodic axis the first face is the last one (at L) again, so the half cell
    at the top is drawn; on a walled one the face at L is not stored and stays blank."""
    import xarray as xr

    limits = []
    for dim in var.dims[-2:]:
        coord = ds[dim] if dim in ds.coords else var[dim]
        c = np.asarray(coord, dtype=float)
        if c.size == 1:  # one cell along the axis (--nx 1): its extent from the file
            limits.append(_one_cell(ds, str(dim), float(c[0])))
            continue
        if c.size < 2:
            limits.append(None)
            continue
        step = c[1] - c[0]
        faces = coord.attrs.get("c_grid_axis_shift") == -0.5  # the cells' low faces
        limits.append((c[0], c[-1] + step) if faces else (c[0] - step / 2, c[-1] + step / 2))
        if faces and coord.attrs.get("boundary") == "periodic":
            first = var.isel({dim: [0]}).assign_coords({dim: [c[-1] + step]})
            var = xr.concat([var, first], dim, combine_attrs="override")
    return var, tuple(limits)


def _one_cell(ds, dim: str, c: float) -> tuple[float, float] | None:
    """The extent of an axis of one cell whose one coordinate value is ``c``: a run or
    solve with ``--nx 1`` drew blank panels, its one column of cells given no width (and
    the x axis ±5 % of ``c`` around it, not the domain). The cell reaches from its low face
    (``x_f``) to twice as far beyond its centre (``x``), both stored in a physjax file;
    else the domain length ``parameter_Lx`` with the centre in its middle; else None."""
    axis = dim[:-2] if dim.endswith("_f") else dim
    faces = dim.endswith("_f")
    other = axis if faces else f"{axis}_f"
    if other in ds.coords and ds[other].size == 1:
        centre, face = (float(ds[other][0]), c) if faces else (c, float(ds[other][0]))
        if centre > face:
            return face, 2 * centre - face
    length = ds.attrs.get(f"parameter_L{axis}")
    try:
        length = float(np.asarray(length).ravel()[0])
    except (TypeError, ValueError, IndexError):
        return None
    if not (np.isfinite(length) and length > 0):
        return None
    return (c, c + length) if faces else (c - length / 2, c + length / 2)


def _edges(c: np.ndarray, limits: tuple[float, float] | None) -> np.ndarray:
    """The cell edges of centres ``c`` (what pcolormesh's "nearest" shading takes); an axis
    of one value spans ``limits`` (or a unit cell about it)."""
    if c.size == 1:
        return np.asarray(limits if limits is not None else (c[0] - 0.5, c[0] + 0.5), float)
    mid = (c[1:] + c[:-1]) / 2
    return np.concatenate([[2 * c[0] - mid[0]], mid, [2 * c[-1] - mid[-1]]])


def _read_frame(path: str | os.PathLike, frame: int | None):
    """One frame (default: the last; the whole file without a time axis) read into memory.

    A running writer locks the file for a moment while it appends a frame, and a reader
    that meets the file as it grows (a writer that went on without the lock) fails to open
    or to read it: the whole read is then tried again, for a few seconds
    ([`physjax.io.read_retrying`][]), and a failure that lasts raises ``ValueError`` naming
    the file."""
    import xarray as xr

    from .io import read_retrying
    from .io._reading import error_text

    shown = os.fspath(path)

    def read():
        try:
            # the time axis as stored: a file of "seconds since 2000-01-01" became dates and
            # the title "t = 10957083333333 days"; its units are read for the title instead
            opened = xr.open_dataset(
                shown, engine="h5netcdf", decode_times=False, decode_timedelta=False
            )
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            # read_retrying tries again where the error behind this one passes in a moment
            raise ValueError(
                f"cannot read {shown!r} as a NetCDF4/HDF5 file: {error_text(e)}"
            ) from None
        with opened as ds:
            sel = _middle_level(_select(ds, shown, frame))
            try:
                return sel.load()
            except (OSError, KeyError, RuntimeError) as e:  # not a picture that failed
                raise ValueError(f"cannot read {shown!r}: {error_text(e)}") from None

    return read_retrying(shown, read)


def _middle_level(ds):
    """Of a 3-D file, the middle z level alone (the one its panels show), as an axis of one
    level: a 3-D solve was read whole into memory to draw that level (a 128³ float64 solve,
    84 MB on disk, took 86 MB more than a 16³ one; 512³ would take 5 GB)."""
    for dim in ("z", "z_f"):
        if dim in ds.dims and ds.sizes[dim] > 1:
            middle = ds.sizes[dim] // 2
            ds = ds.isel({dim: slice(middle, middle + 1)})
    return ds


def frames_text(n: int) -> str:
    """``n`` frames and the ``--frame`` values that pick one: "3 frames (0 to 2, or -1 to -3
    from the last)"; for one frame "1 frame (0, or -1)"."""
    which = f"0 to {n - 1}, or -1 to -{n} from the last" if n > 1 else "0, or -1"
    return f"{n} frame{'s' if n != 1 else ''} ({which})"


def _select(ds, shown: str, frame: int | None):
    if "time" in ds.dims:
        frame = -1 if frame is None else frame
        # Only whole frames: a running file may hold one being written.
        n = min(int(ds.attrs.get("n_frames", ds.sizes["time"])), ds.sizes["time"])
        if n == 0:
            raise ValueError(f"{shown!r} holds no frame to plot")
        if not -n <= frame < n:
            raise ValueError(f"--frame {frame} is out of range: {shown!r} has {frames_text(n)}")
        return ds.isel(time=frame % n)
    if frame is not None:
        raise ValueError(
            f"--frame {frame}: {shown!r} has no time axis, so no frames to pick (leave --frame out)"
        )
    return ds


def _time_text(t: float) -> str:
    """A simulated time for a title: seconds below a day (no exponent), else days."""
    if t >= 86400:
        days = t / 86400
        number = f"{days:.0f}" if days >= 1000 else f"{days:.3g}"  # 1157 days, not 1.16e+03
        return f"{number} day{'' if round(days, 3) == 1 else 's'}"
    return f"{t:.0f} s" if t >= 10 or t == int(t) else f"{t:.3g} s"


def _when_text(value: float, unit) -> str:
    """A time coordinate's value for a title, in its own units: seconds (physjax's "s", or
    CF's "seconds since <date>") as [`_time_text`][]; other units as stored ("1.5 days since
    2000-01-01"), and no unit for a coordinate without one."""
    if unit is None:
        return f"{value:g}"
    words = str(unit).strip().lower().split()
    if (
        words
        and words[0] in ("s", "sec", "secs", "second", "seconds")
        and words[1:2] in ([], ["since"])
    ):
        return _time_text(value)
    return f"{value:g} {unit}"


_UNIT_POWER = re.compile(r"(?<![\w.^])([A-Za-z]+)(-?\d+)(?![\w.])")


def _units_text(units: str) -> str:
    """A CF/UDUNITS units string as a label: powers raised (``"kg m-2 s-1"`` drawn as
    kg m⁻² s⁻¹, as the shallow-water panels' own units are), and a ``$`` of the file's
    text taken literally rather than as the start of mathematics."""
    units = str(units).replace("$", r"\$")
    return _UNIT_POWER.sub(lambda m: f"{m.group(1)}$^{{{m.group(2)}}}$", units)


def _literal(text) -> str:
    """Text of the file (a case, an ``--rhs`` path, a long name, a status) for a title or a
    label, its ``$`` escaped: matplotlib takes text between two ``$`` for mathematics, so a
    solve of ``--rhs 'a$_$b.nc:f'`` could not be drawn ("ParseSyntaxException: Expected
    ..."), and ``run$1$.nc`` was drawn as "run1.nc" with an italic 1."""
    return str(text).replace("$", r"\$")


def _length_text(z: float) -> str:
    """A level for a title: metres below 10 km (no exponent), else km."""
    if abs(z) >= 1e4:
        return f"{z / 1e3:.4g} km"
    return f"{z:.0f} m" if abs(z) >= 100 else f"{z:.3g} m"


def _colour_scale(data: np.ndarray, cmap: str):
    """``(data, vmin, vmax, exponent, note)`` for a panel: the scale is taken from the
    finite values only (NaN/Inf are drawn in the colour map's 'bad' colour and counted in
    ``note``); a signed field gets a scale symmetric about zero, and a constant one says so;
    ``exponent`` is the power of ten moved into the colour bar's label (or 0)."""
    finite = np.isfinite(data)
    bad = int(data.size - np.count_nonzero(finite))
    note = f" ({bad} NaN/Inf cells, in grey)" if bad else ""
    if not finite.any():
        return np.full_like(data, np.nan), -1.0, 1.0, 0, " (no finite value)"
    values = data[finite]
    lo, hi = float(values.min()), float(values.max())
    if lo == hi:
        note += f" (constant {lo:.3g})"
    symmetric = cmap != "viridis"
    vmax = max(abs(lo), abs(hi)) or 1.0
    exponent = int(np.floor(np.log10(vmax)))
    if abs(exponent) < 3:  # the power of ten goes into the label only when it is large
        exponent = 0
    if not symmetric and lo != hi and hi - lo <= 1e-3 * vmax:
        # values that share their first digits (h = 1000 m ± 5 mm): matplotlib writes that
        # part once over the bar ("+1e3"), in the label's units; with 10³ in the label too
        # the bar read "h [10³ m]" under "1e−6+1", a value (1 + 10⁻⁶·tick)·10³ m
        exponent = 0
    scale = 10.0**exponent
    data = np.where(finite, data, np.nan) / scale
    if symmetric:
        return data, -vmax / scale, vmax / scale, exponent, note
    if lo == hi:
        return data, lo / scale - 0.5, hi / scale + 0.5, exponent, note
    return data, lo / scale, hi / scale, exponent, note


def _status_text(status: str, what: str = "run") -> str:
    """A second title line for a run (or, ``what``, a solve) that did not end as asked;
    none for a complete one."""
    from .io import STATUS_INTERRUPTED, STATUS_RUNNING, STATUS_STOPPED

    if status.startswith("failed"):
        return f"\nthe {what} {status}"
    if status.startswith((STATUS_INTERRUPTED, STATUS_STOPPED)):
        return f"\nthe {what} was {status}"
    if status == STATUS_RUNNING:  # still running, or killed without a word
        return f"\nthe {what} has not finished (status 'running')"
    return ""


#: Width of a colour bar and its gap to the panel [inches].
_BAR_WIDTH, _BAR_PAD = 0.15, 0.08


def _bar_beside(ax):
    """Axes for a colour bar just right of the panel ``ax`` as drawn, as tall as it.

    ``fig.colorbar(ax=ax)`` sizes the bar by the panel's slot in the layout, which a panel
    of true proportions (a domain wider than tall) fills only in part: the bar stood above
    and below the field it keys. An inset axes follows the drawn panel (the constrained
    layout makes room for it); its width and gap are in inches, so a narrow panel's bar is
    not a hairline."""
    from matplotlib.transforms import ScaledTranslation, blended_transform_factory

    fig = ax.get_figure()
    # x: inches from the panel's right edge; y: the panel's height
    right = fig.dpi_scale_trans + ScaledTranslation(1, 0, ax.transAxes)
    return ax.inset_axes(
        [_BAR_PAD, 0, _BAR_WIDTH, 1], transform=blended_transform_factory(right, ax.transAxes)
    )


def _fit_size(fig, panels) -> None:
    """Take out of the figure what panels of true proportions leave blank.

    A domain wider than its panel's slot is drawn shorter than the slot, leaving blank bands
    above and below it (between the figure's title and the panels' titles, under the x
    labels); a taller one is drawn narrower, leaving blank columns between the panels. The
    figure is laid out, and made smaller by the blank its title and the panels with their
    titles, labels and colour bars leave; the panels keep their drawn size."""
    for _ in range(3):  # the layout moves a little with the size: settle it
        fig.draw_without_rendering()  # lays the figure out and places the labels
        renderer = fig.canvas.get_renderer()
        width, height = fig.get_size_inches()
        boxes = [ax.get_tightbbox(renderer) for ax in panels]
        title = fig._suptitle.get_window_extent(renderer) if fig._suptitle else None
        tall = max(b.height for b in boxes) + (title.height if title else 0)
        wide = max(sum(b.width for b in boxes), title.width if title else 0)
        # what is left, less room for the layout's pads
        blank_h = height - tall / fig.dpi - 0.25
        blank_w = width - wide / fig.dpi - 0.3 * len(panels)  # and a gap between titles
        if blank_h < 0.05 and blank_w < 0.05:
            return
        fig.set_size_inches(width - max(blank_w, 0), height - max(blank_h, 0))


def _map_for(var) -> str:
    """The colour map of a panel of ``var``: a signed field (a solution, a residual, an
    error, a streamfunction) on a diverging one, its scale centred on zero; else viridis."""
    values = np.asarray(var, dtype=float)
    values = values[np.isfinite(values)]
    return "RdBu_r" if values.size and values.min() < 0 < values.max() else "viridis"


def _drawable(sel) -> list[str]:
    """The data variables of a frame that a panel can show: fields of (y, x) or (z, y, x),
    at cell centres or on faces (``x_f``…)."""
    names = []
    for name, var in sel.data_vars.items():
        axes = [str(d)[:-2] if str(d).endswith("_f") else str(d) for d in var.dims]
        if axes in (["y", "x"], ["z", "y", "x"]):
            names.append(str(name))
    return names


def plot_panels(
    path: str | os.PathLike,
    output: str | os.PathLike,
    frame: int | None = None,
    names: list[str] | None = None,
) -> str:
    """Plot the fields of one frame (default: the last) of a physjax file into a PNG;
    returns ``output``. A file without a time axis (a Poisson solve) has no frames to pick.

    Shallow-water files show the height anomaly ``h + b − mean`` [m] and the relative
    vorticity ζ [s⁻¹], Poisson files the solution, residual and error (or f); ``names``
    (``physjax plot --vars``) picks the variables instead, each a field of (y, x) or
    (z, y, x) (a name the file lacks, or one of other dimensions, is refused with the
    names it can draw). Other files show up to three of their data variables. A 3-D field
    is shown by its middle z level.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = _read_frame(path, frame)  # in memory: the file is closed again
    panels = []
    if names is None and sel.attrs.get("title") == "physjax poisson":
        # the solution, its residual, and its error where the exact solution is known
        names = ["u", "residual", "error" if "error" in sel else "f"]
        names = [n for n in names if n in sel] or None
    if names is not None:
        drawable = _drawable(sel)
        can = (
            f"variables it can draw: {', '.join(drawable)}"
            if drawable
            else "it has no variable of (y, x) to draw"
        )
        missing = [n for n in names if n not in sel]
        if missing:
            raise ValueError(
                f"{os.fspath(path)!r} has no variable {', '.join(repr(n) for n in missing)}; {can}"
            )
        flat = [
            f"{n!r} ({', '.join(sel[n].dims) if sel[n].ndim else 'one value'} in a frame)"
            for n in names
            if n not in drawable
        ]
        if flat:  # a 1-D or scalar variable failed with "not enough values to unpack"
            raise ValueError(
                f"cannot draw {', '.join(flat)} of {os.fspath(path)!r}: a panel shows a "
                f"variable of (y, x) or (z, y, x); {can}"
            )
        for name in names:
            var = sel[name]
            long_name = var.attrs.get("long_name", name)
            units = _units_text(var.attrs.get("units", ""))
            panels.append((var, _literal(f"{name}: {long_name}"), units, _map_for(var)))
    elif "h" in sel and "zeta" in sel:
        eta = sel["h"] + (sel["bottom"] if "bottom" in sel else 0)
        anomaly = eta - float(eta.where(np.isfinite(eta)).mean())  # an Inf cell: not all Inf
        panels.append((anomaly, "height anomaly", "m", "RdBu_r"))
        panels.append((sel["zeta"], "relative vorticity", "s$^{-1}$", "PuOr_r"))
    else:
        for name, var in sel.data_vars.items():
            if var.ndim in (2, 3) and name != "grid":
                panels.append(
                    (
                        var,
                        _literal(var.attrs.get("long_name", name)),
                        _units_text(var.attrs.get("units", "")),
                        _map_for(var),
                    )
                )
            if len(panels) == 3:
                break
    if not panels:
        raise ValueError(f"{os.fspath(path)!r} has no 2-D variable to plot")
    title_time = ""
    if "time" in sel.coords or "time" in sel:
        time = sel["time"]
        title_time = f", t = {_when_text(float(time), time.attrs.get('units'))}"
    # constrained: tight_layout let the title overlap a panel's two-line title (3-D)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False, layout="constrained"
    )
    for ax, (var, label, units, cmap) in zip(axes[0], panels):
        title = label
        if names is not None:
            label = label.split(":", 1)[0]  # the variable's name on the colour bar
        if var.ndim == 3:
            level = var.sizes[var.dims[0]] // 2
            z = float(sel[var.dims[0]][level])
            var = var.isel({var.dims[0]: level})
            title = f"{title}\nat z = {_length_text(z)}"
        var, limits = _on_the_domain(var, sel)
        x, y, xy_units = _axes(var, var.dims[-2:], limits)
        data, vmin, vmax, exponent, note = _colour_scale(np.asarray(var, dtype=float), cmap)
        scale = 1e3 if xy_units == "km" else 1.0
        if exponent:  # the power of ten in the label, not over the bar
            # a dimensionless field (CF units "1") is in powers of ten alone: "10⁻⁴", not "10⁻⁴ 1"
            power = f"$10^{{{exponent}}}$"
            units = power if units.strip() in ("", "1") else f"{power} {units}"
        title += note
        colours = plt.get_cmap(cmap).with_extremes(bad="0.5")  # NaN/Inf grey, not zero's white
        if x.size == 1 or y.size == 1:  # "auto" shading gives one value no width: edges
            scaled = [None if lim is None else (lim[0] / scale, lim[1] / scale) for lim in limits]
            x, y = _edges(x, scaled[1]), _edges(y, scaled[0])
            im = ax.pcolormesh(x, y, data, cmap=colours, shading="flat", vmin=vmin, vmax=vmax)
        else:
            im = ax.pcolormesh(x, y, data, cmap=colours, shading="auto", vmin=vmin, vmax=vmax)
        # the domain's extent (its cells' centres span a cell less, and a face or corner
        # field's another amount: a 4000 x 1000 km domain of 32 x 8 cells was drawn at true
        # proportions for ζ, stretched to fill the panel for the height beside it)
        width, height = (
            np.ptp(c) if lim is None else (lim[1] - lim[0]) / scale
            for c, lim in ((x, limits[1]), (y, limits[0]))
        )
        # true proportions, unless they leave a sliver (a long channel): then fill the panel
        ax.set_aspect("equal" if 0 < height <= 4 * width and width <= 4 * height else "auto")
        if limits[1] is not None:
            ax.set_xlim(*(v / scale for v in limits[1]))
        if limits[0] is not None:
            ax.set_ylim(*(v / scale for v in limits[0]))
        ax.set_xlabel(f"x [{xy_units}]")
        ax.set_ylabel(f"y [{xy_units}]")
        ax.set_title(title, fontsize=10)
        # a variable without units: no empty brackets
        fig.colorbar(im, cax=_bar_beside(ax), label=f"{label} [{units}]" if units else label)
    case = sel.attrs.get("case", "")
    if sel.attrs.get("title") == "physjax poisson":
        config = json.loads(sel.attrs.get("configuration", "") or "{}")
        case = f"poisson, {config.get('rhs') or case}"
        if config.get("rhs_time") is not None:  # the frame of a run the rhs was taken from
            when = _when_text(config["rhs_time"], config.get("rhs_time_units"))
            case += f" (frame {config.get('frame')}, t = {when})"
    # a file without a case: "physjax, t = 1.5 s", not "physjax , t = 1.5 s"
    name = f"physjax {case}" if str(case).strip() else "physjax"
    # a poisson file is a solve: "the solve failed: not converged …", not "the run failed"
    what = "solve" if sel.attrs.get("title") == "physjax poisson" else "run"
    status = _status_text(str(sel.attrs.get("status", "")), what)
    fig.suptitle(_literal(f"{name}{title_time}{status}"))
    _fit_size(fig, axes[0])
    try:
        _save_replacing(fig, os.fspath(output))
    finally:
        plt.close(fig)
    return os.fspath(output)


def _save_replacing(fig, output: str) -> None:
    """Save ``fig`` to ``output`` through a hidden temporary file beside it, moved into
    place once whole: a write that fails partway (a full disk, a file-size limit, Ctrl-C)
    truncated the picture an earlier run had left there; now that picture stays as it was
    and the temporary file is removed. A symbolic link is written through, and kept."""
    import secrets

    from .cli import _stop_if_signalled
    from .io._reading import hidden_beside

    dest = os.path.realpath(output)
    # a name that nearly fills the folder's limit is cut and given a digest (as the writer's)
    tmp = hidden_beside(dest, f".{os.getpid()}.{secrets.token_hex(4)}.partial")
    # the format by the name asked for, as savefig would take it (the temporary name has none)
    ext = os.path.splitext(output)[1][1:].lower() or "png"
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format=ext)
        _stop_if_signalled()  # a stop whose raise was lost in a callback: the old one kept
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
