"""The rotating nonlinear shallow-water equations on an Arakawa C-grid."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from jaxtyping import Array, ArrayLike, Float

from ..._custom_types import is_concrete
from ...grids import (
    CENTRE,
    X_FACE,
    Y_FACE,
    Grid,
    diff_x_c2f,
    diff_y_c2f,
    fill_halo,
    interior,
    interp_x_c2f,
    interp_x_f2c,
    interp_y_c2f,
    interp_y_f2c,
)
from ...grids._grid import require_enabled_dtype
from ...parallel import decompose, error_if, place_on_mesh, shard, shard_map_fields
from ...parallel._mesh import _specs
from .._time_stepping import (
    DAMPING_LIMITS,
    SCHEMES,
    SPAN_RTOL,
    advance,
    blockwise_rms_norm,
    check_diffrax_options,
    check_time_span,
    controller_for_sharded_fields,
    default_controller,
    integrate,
    integrate_diffrax,
    saveat_in_dtype,
    scheme,
)
from ._blocked import (
    AUTO_STRIP_STEPS,
    OVERLAP,
    auto_strip_rows,
    blocked_ssprk3_step,
    blocked_ssprk3_steps,
    strip_aux,
)

Field2D = Float[Array, "ny nx"]
Boundary = Literal["free-slip", "no-slip"]
#: Cells a walled axis needs (on every device of a mesh): the wall's halo mirrors the
#: face-located velocity of the face after the wall face.
_MIN_WALLED = 2


class ShallowWaterState(eqx.Module):
    """Prognostic fields of [`physjax.solvers.ShallowWater`][], each ``(ny, nx)``.

    - `h`: layer thickness [m] at cell centres.
    - `u`: x-velocity [m/s] on x-faces (``u[j, i]`` on the west face of cell ``(j, i)``).
    - `v`: y-velocity [m/s] on y-faces (``v[j, i]`` on the south face of cell ``(j, i)``).
    """

    h: Field2D
    u: Field2D
    v: Field2D


class ShallowWaterSolution(eqx.Module):
    """Frames of a run.

    - `ts`: times [s] of the frames, shape ``(n_frames,)``.
    - `states`: a [`physjax.solvers.ShallowWaterState`][] whose fields have a leading
      ``n_frames`` axis.
    """

    ts: Float[Array, " n_frames"]
    states: ShallowWaterState


def _scalar(x, dtype):
    return jnp.asarray(x, dtype=dtype)


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) > 0:
        return f"an array of shape {tuple(shape)} and dtype {value.dtype}"
    return f"{value!r} ({type(value).__name__})"


def _real_dtype_or_raise(name: str, value, what: str) -> np.ndarray | None:
    """``value`` as a NumPy array when it has a value now (``None`` for a tracer), after
    refusing anything that is not real numbers (strings, complex, booleans, objects)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"{name} must be {what}, got {_describe(value)}")
    if is_concrete(value):
        try:
            arr = np.asarray(value)
        except Exception as e:  # ragged lists and other objects NumPy cannot read
            raise TypeError(f"{name} must be {what}, got {_describe(value)}") from e
        dtype = arr.dtype
    else:
        arr, dtype = None, np.dtype(value.dtype)
    if dtype.kind not in "iuf":
        kind = {"c": "complex", "b": "boolean"}.get(dtype.kind, f"dtype {dtype}")
        raise TypeError(f"{name} must be {what}, got {kind} values: {_describe(value)}")
    return arr


def _check_scalar(name: str, value, *, low: str | None = None, dtype=None):
    """Refuse a physical constant that is not one finite real number (checked on its value
    when it has one; only its type and shape inside ``jit``/``grad``/``vmap``). ``low``:
    ``">0"`` or ``">=0"``. With ``dtype`` the value is checked again as the model holds it."""
    arr = _real_dtype_or_raise(name, value, "a real number")
    shape = np.shape(value) if arr is None else arr.shape
    if shape != ():
        raise ValueError(f"{name} must be a scalar (one number), got an array of shape {shape}")
    if arr is None:
        return
    x = float(arr)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be a finite number, got {x}")
    if low == ">0" and not x > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if low == ">=0" and not x >= 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if dtype is not None:
        # a finite float64 value can overflow the grid's float32 (or underflow to 0)
        with np.errstate(over="ignore", under="ignore"):
            held = float(np.asarray(x).astype(dtype))
        if not math.isfinite(held):
            raise ValueError(
                f"{name} must be finite in the grid's dtype {np.dtype(dtype)}, got {value} "
                f"(|x| > {np.finfo(dtype).max:.3g})"
            )
        if low == ">0" and not held > 0:
            raise ValueError(
                f"{name} must be > 0 in the grid's dtype {np.dtype(dtype)}, got {value}, "
                f"which it holds as 0"
            )


@functools.partial(jax.jit, static_argnames="dtype")
def _field_value_stats(a, dtype):
    held = a.astype(dtype)
    return (
        jnp.sum(~jnp.isfinite(a), dtype=jnp.int32),
        jnp.sum(~jnp.isfinite(held), dtype=jnp.int32),
        jnp.min(held),
    )


def _check_field_values(name: str, value, grid: Grid) -> float | None:
    """Refuse a field that is not real numbers of the grid's shape, or (when it has a value)
    that holds NaN/Inf, also once cast to the grid's dtype; returns its least value in that
    dtype when it has a value. A JAX array is reduced where it lives (one compiled function
    per shape, dtype and sharding): only three scalars come to the host, not the field."""
    what = f"real numbers on the grid, shape (ny, nx)={grid.shape}"
    if isinstance(value, jax.Array) and is_concrete(value):
        kind = np.dtype(value.dtype).kind
        if kind not in "iuf":
            kind = {"c": "complex", "b": "boolean"}.get(kind, f"dtype {value.dtype}")
            raise TypeError(f"{name} must be {what}, got {kind} values: {_describe(value)}")
        _check_field(name, value, grid)
        # evaluated now also while tracing (a concrete field closed over by ``jit``)
        with jax.ensure_compile_time_eval():
            stats = _field_value_stats(value, np.dtype(grid.dtype))
            bad, bad_held, least = (x.item() for x in jax.device_get(stats))
    else:
        arr = _real_dtype_or_raise(name, value, what)
        _check_field(name, value if arr is None else arr, grid)
        if arr is None:
            return None
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        # checked again as the model will hold it: a finite float64 value can overflow
        with np.errstate(over="ignore"):
            arr = arr.astype(grid.dtype)
        bad_held = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        least = arr.min() if arr.size else None
    if bad:
        raise ValueError(f"{name} must be finite everywhere, got {bad} NaN/Inf value(s)")
    if bad_held:
        raise ValueError(
            f"{name} must be finite everywhere in the grid's dtype {grid.dtype}, got "
            f"{bad_held} value(s) beyond its range (|x| > {np.finfo(grid.dtype).max:.3g})"
        )
    return least


@jax.jit
def _state_extremes(h, u, v):
    # NaN propagates through min/max and ±Inf is an extreme: all six are finite exactly
    # when the fields are. The wall rows are picked by a mask, not a slice: on a mesh a
    # slice of a sharded axis is all-reduced whole, a masked maximum as one scalar
    au, av = jnp.abs(u), jnp.abs(v)
    west = jax.lax.broadcasted_iota(jnp.int32, u.shape, 1) == 0
    south = jax.lax.broadcasted_iota(jnp.int32, v.shape, 0) == 0
    zero = jnp.zeros((), u.dtype)
    return {
        "h_min": jnp.min(h),
        "h_max": jnp.max(h),
        "u_max": jnp.max(au),
        "v_max": jnp.max(av),
        "wall_u": jnp.max(jnp.where(west, au, zero)),
        "wall_v": jnp.max(jnp.where(south, av, zero)),
    }


@jax.jit
def _nonfinite_counts(h, u, v):
    return {
        f"bad_{k}": jnp.sum(~jnp.isfinite(a), dtype=jnp.int32) for k, a in zip("huv", (h, u, v))
    }


def _state_stats(h, u, v) -> dict[str, np.ndarray]:
    """The scalars that ``ShallowWater._check_state`` and ``max_stable_dt`` need of a state
    with values: min and max of ``h``, max ``|u|`` and ``|v|``, max ``|u[:, 0]|`` and
    ``|v[0, :]|`` (the flow through the west and south walls) and, only when one of these
    is not finite, the count of NaN/Inf in each field (``bad_h``, ``bad_u``, ``bad_v``;
    0 otherwise). Reduced by compiled functions (one compilation per shape, dtype and
    sharding; on a mesh each device reduces its block and only scalars are all-reduced), so
    that a check copies a few scalars to the host, not the fields (which a process of a
    multi-host run could not read whole)."""
    # evaluated now also when called while tracing (a concrete state closed over by ``jit``)
    with jax.ensure_compile_time_eval():
        stats = jax.device_get(_state_extremes(h, u, v))
        if all(np.isfinite(x) for x in stats.values()):
            stats.update(bad_h=0, bad_u=0, bad_v=0)
        else:
            stats.update(jax.device_get(_nonfinite_counts(h, u, v)))
    return stats


def _check_time(name: str, value, *, positive: bool = False, unit: str = "seconds") -> float | None:
    """A time [s] (or other number) as a float (``None`` when traced), refusing anything but
    one finite real number (> 0 when ``positive``): Python or NumPy scalars and 0-d arrays are
    accepted."""
    need = ("a finite number > 0" if positive else "a finite number") + f" ({unit})"
    if isinstance(value, (str, bytes, bool, np.bool_)) or value is None:
        raise ValueError(f"{name} must be {need}, got {value!r}")
    if not is_concrete(value):
        if np.shape(value) != () or np.dtype(value.dtype).kind not in "iuf":
            raise ValueError(f"{name} must be {need}, got {_describe(value)}")
        return None
    try:
        arr = np.asarray(value)
    except Exception:
        arr = np.asarray(None)
    if arr.shape != () or arr.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be {need}, got {value!r}")
    x = float(arr)
    if not (math.isfinite(x) and (x > 0 or not positive)):
        raise ValueError(f"{name} must be {need}, got {value!r}")
    return x


def _check_grid(grid, boundary: str) -> None:
    """Refuse a grid the model cannot run on: not a 2-D ``Grid`` of an enabled dtype with a
    one-cell halo, a walled axis of fewer than 2 cells, or no wall for ``"no-slip"``. Run by
    the constructor and again by every method taking a state (``eqx.tree_at`` skips the
    constructor)."""
    if not isinstance(grid, Grid) or grid.ndim != 2:
        raise TypeError(f"grid must be a 2-D physjax.grids.Grid, got {grid!r}")
    require_enabled_dtype(grid)
    if grid.halo != 1:
        raise ValueError(
            f"the shallow-water stencils use a one-cell halo: the grid must have halo=1, "
            f"got halo={grid.halo} (Grid(..., halo=1), the default)"
        )
    if boundary == "no-slip" and all(grid.periodic):
        # nothing would hold the fluid: a setting without effect is a mistake to report
        raise ValueError(
            "boundary='no-slip' sets the condition at walls, and this grid has none "
            "(periodic on every axis); give Grid(periodic=...) a walled axis"
        )
    for axis, name in enumerate(("y", "x")):
        if not grid.periodic[axis] and grid.shape[axis] < _MIN_WALLED:
            raise ValueError(
                f"grid size n{name}={grid.shape[axis]} is too small: a walled {name} axis "
                f"needs n{name} >= {_MIN_WALLED} (the halo mirrors the velocity on the face "
                f"next to the wall)"
            )


class ShallowWater(eqx.Module):
    r"""Rotating nonlinear shallow-water equations in vector-invariant form.

    $$\partial_t h + \nabla\cdot(h\mathbf{u}) = 0,$$
    $$\partial_t \mathbf{u} + q\,\hat{\mathbf{z}}\times h\mathbf{u}
      + \nabla\big(g(h + b) + \tfrac12|\mathbf{u}|^2\big)
      = \frac{\boldsymbol{\tau}}{\rho_0 h} - r\,\mathbf{u} + \nu\nabla^2\mathbf{u},
      \qquad q = \frac{f + \zeta}{h},\ f = f_0 + \beta (y - y_{\rm mid}).$$

    Discretised on the Arakawa C-grid (``h`` at centres, ``u`` on x-faces, ``v`` on y-faces,
    potential vorticity ``q`` at corners) with the energy-conserving scheme of Sadourny
    (1975), DOI 10.1175/1520-0469(1975)032<0680:TDAOSW>2.0.CO;2: the Coriolis/vorticity term
    is $\overline{q\,\overline{V}^x}^y$ in the u-equation and $-\overline{q\,\overline{U}^y}^x$
    in the v-equation, with mass fluxes $U = \overline{h}^x u$, $V = \overline{h}^y v$ and
    kinetic energy $K = \tfrac12(\overline{u^2}^x + \overline{v^2}^y)$. Mass is conserved to
    round-off and, without forcing and dissipation, the semi-discrete total energy
    $\sum h K + \tfrac12 g h^2 + g h b$ exactly (the time schemes lose a little of it, less at a
    smaller dt); potential enstrophy is not conserved (a spatial error that falls with
    resolution; docs/shallow_water.md).

    **Arguments** (physical parameters are keyword-only, SI units, and become differentiable
    array leaves):

    - `grid`: a 2-D [`physjax.grids.Grid`][]; its ``periodic`` flags choose periodic or walled
      axes.
    - `gravity`: g [m s⁻²] (default 9.81; use a reduced gravity for a 1½-layer ocean).
    - `coriolis`: f₀ [s⁻¹] at mid-domain (default 1e-4).
    - `beta`: β = df/dy [m⁻¹ s⁻¹] (default 0, an f-plane).
    - `bottom`: bottom height b [m] at cell centres, ``(ny, nx)`` (default none: flat).
    - `drag`: linear drag coefficient r [s⁻¹] (default none: the term is not computed).
    - `viscosity`: Laplacian viscosity ν [m² s⁻¹] (default none: not computed). Any value
      given, even 0, is kept as a differentiable leaf.
    - `wind_stress`: ``(tau_x, tau_y)`` [N m⁻²] on x- and y-faces (default none).
    - `density`: reference density ρ₀ [kg m⁻³] of the wind-stress term (default 1025).
    - `boundary`: ``"free-slip"`` (default) or ``"no-slip"`` at walls.
    - `scheme`: fixed-step time scheme, ``"ssprk3"`` (default) or ``"rk4"``.
    - `strip_rows`: cache blocking of the fixed-step SSP-RK3 update on one device: the grid
      is advanced ``strip_rows`` full rows at a time (each strip read with three rows of
      overlap per step), so that a strip's intermediates stay in cache; the same arithmetic
      as the unblocked step. ``None`` (default): automatic, on the CPU only, once the plain
      step's working set (13 field-sized buffers) no longer fits in the last-level cache read
      from Linux's sysfs (with 32 MiB of L3, from 569² float64 or 804² float32 up); where
      the cache size cannot be read, for fields of 4 MiB or more (725² float64, 1024² float32);
      never for grids narrower than 128 columns, whose strips XLA:CPU runs slower than the
      plain step; ``0``: never; a number of rows from 3 to ``ny``: always (on one device; a
      run split over a mesh steps each block unblocked). When it does not divide ``ny``, the first
      strip takes the remaining rows (with ``strip_rows`` more if they are fewer than the
      overlap), compiled as a block of its own.
    - `strip_steps`: steps advanced per visit of a strip (temporal blocking: a strip is read
      with ``3 × strip_steps`` rows of overlap and the state is read and written once per
      ``strip_steps`` steps). ``None`` (default): 3, or ``strip_rows // 3`` if that is
      smaller; needs ``strip_rows >= 3 × strip_steps``. A run whose step count is not a
      multiple takes the remaining steps one at a time. With one step per visit the result
      is the plain step's to the last bit when both are compiled; with more, XLA may fuse
      (and so contract multiply-adds) differently, and the two agree to round-off.

    The physical constants must be single real numbers, finite (and > 0 where so bounded) in
    the grid's dtype, and ``bottom``/``wind_stress`` real, finite fields of the grid's shape
    (strings, complex and boolean values are refused); values are checked when they have
    them (not while traced by ``jit``/``grad``/``vmap``).

    The model works on one sample; use ``jax.vmap`` for ensembles.
    """

    grid: Grid
    gravity: Array
    coriolis: Array
    beta: Array
    bottom: Field2D | None
    drag: Array | None
    viscosity: Array | None
    wind_stress: tuple[Field2D, Field2D] | None
    density: Array
    boundary: str = eqx.field(static=True)
    scheme: str = eqx.field(static=True)
    strip_rows: int | None = eqx.field(static=True)
    strip_steps: int | None = eqx.field(static=True)

    def __init__(
        self,
        grid: Grid,
        *,
        gravity: ArrayLike = 9.81,
        coriolis: ArrayLike = 1e-4,
        beta: ArrayLike = 0.0,
        bottom: ArrayLike | None = None,
        drag: ArrayLike | None = None,
        viscosity: ArrayLike | None = None,
        wind_stress: tuple[ArrayLike, ArrayLike] | None = None,
        density: ArrayLike = 1025.0,
        boundary: Boundary = "free-slip",
        scheme: str = "ssprk3",
        strip_rows: int | None = None,
        strip_steps: int | None = None,
    ):
        if boundary not in ("free-slip", "no-slip"):
            raise ValueError(f"boundary must be 'free-slip' or 'no-slip', got {boundary!r}")
        _check_grid(grid, boundary)
        if scheme not in SCHEMES or scheme == "euler":
            raise ValueError(f"scheme must be 'ssprk3' or 'rk4', got {scheme!r}")
        if strip_rows is not None:
            if isinstance(strip_rows, bool) or not isinstance(strip_rows, (int, np.integer)):
                raise ValueError(
                    f"strip_rows must be None, 0 or a positive integer, got {strip_rows!r}"
                )
            strip_rows = int(strip_rows)
            if strip_rows < 0 or (strip_rows and not 3 <= strip_rows <= grid.shape[0]):
                raise ValueError(
                    f"strip_rows must be None, 0 or a number of rows from 3 (the rows of "
                    f"overlap of a strip) to ny={grid.shape[0]}, got {strip_rows}"
                )
            if strip_rows and scheme != "ssprk3":
                raise ValueError(f"strip_rows needs scheme='ssprk3', got scheme={scheme!r}")
        if strip_steps is not None:
            if (
                isinstance(strip_steps, bool)
                or not isinstance(strip_steps, (int, np.integer))
                or strip_steps < 1
            ):
                raise ValueError(
                    f"strip_steps must be None or an integer >= 1, got {strip_steps!r}"
                )
            strip_steps = int(strip_steps)
            if scheme != "ssprk3":
                raise ValueError(f"strip_steps needs scheme='ssprk3', got scheme={scheme!r}")
            if strip_rows == 0:
                raise ValueError(f"strip_steps={strip_steps} needs strips, got strip_rows=0")
            if strip_rows and strip_rows < OVERLAP * strip_steps:
                raise ValueError(
                    f"strip_rows={strip_rows} is too few for strip_steps={strip_steps}: a strip "
                    f"needs at least {OVERLAP} rows per step ({OVERLAP * strip_steps})"
                )
        dt = grid.dtype
        given = dict(
            gravity=gravity,
            coriolis=coriolis,
            beta=beta,
            density=density,
            drag=drag,
            viscosity=viscosity,
        )
        for name, low in _SCALAR_PARAMETERS:
            value = given[name]
            if value is not None or name not in ("drag", "viscosity"):
                _check_scalar(name, value, low=low, dtype=grid.dtype)
        self.grid = grid
        self.gravity = _scalar(gravity, dt)
        self.coriolis = _scalar(coriolis, dt)
        self.beta = _scalar(beta, dt)
        self.drag = None if drag is None else _scalar(drag, dt)
        self.viscosity = None if viscosity is None else _scalar(viscosity, dt)
        self.density = _scalar(density, dt)
        if bottom is not None:
            _check_field_values("bottom", bottom, grid)
            bottom = jnp.asarray(bottom, dtype=dt)
        self.bottom = bottom
        if wind_stress is not None:
            try:
                n = None if isinstance(wind_stress, (str, bytes)) else len(wind_stress)
            except TypeError:  # a number, a 0-d array
                n = None
            if n != 2:
                raise ValueError(
                    f"wind_stress must be a pair (tau_x, tau_y) of fields of the grid shape "
                    f"(ny, nx)={grid.shape}, got {_describe(wind_stress)}"
                )
            tx, ty = wind_stress
            _check_field_values("wind_stress[0] (tau_x)", tx, grid)
            _check_field_values("wind_stress[1] (tau_y)", ty, grid)
            wind_stress = (jnp.asarray(tx, dtype=dt), jnp.asarray(ty, dtype=dt))
        self.wind_stress = wind_stress
        self.boundary = boundary
        self.scheme = scheme
        self.strip_rows = strip_rows
        self.strip_steps = strip_steps

    # ---------------------------------------------------------------- set-up
    def initial_state(
        self, h: ArrayLike, u: ArrayLike | None = None, v: ArrayLike | None = None
    ) -> ShallowWaterState:
        """A state from thickness and velocities (zeros when omitted), converted to the model's
        dtype and with the normal velocity set to zero on walls. Raises if a field is not real
        numbers of the grid's shape, holds NaN/Inf, or the thickness is not positive (values
        are checked when they have them, also inside ``jit`` for arrays closed over)."""
        g = self.grid
        # Checked on the values as given (NumPy arrays and lists on the host, JAX arrays
        # reduced on their devices, now also inside jit on arrays that have a value).
        for name, f in (("h", h), ("u", u), ("v", v)):
            if f is not None:
                least = _check_field_values(name, f, g)
                if name == "h" and least is not None and not least > 0:
                    raise ValueError(
                        f"layer thickness h must be > 0 everywhere (mean depth and anomalies), "
                        f"got a minimum of {float(least):g} m in {g.dtype}"
                    )
        h = jnp.asarray(h, dtype=g.dtype)
        u = jnp.zeros(g.shape, g.dtype) if u is None else jnp.asarray(u, dtype=g.dtype)
        v = jnp.zeros(g.shape, g.dtype) if v is None else jnp.asarray(v, dtype=g.dtype)
        if not g.periodic[1]:
            u = u.at[:, 0].set(0)
        if not g.periodic[0]:
            v = v.at[0, :].set(0)
        return ShallowWaterState(h=h, u=u, v=v)

    def coriolis_at(self, y: ArrayLike) -> Array:
        """f = f₀ + β (y − y_mid) [s⁻¹] at coordinates ``y`` [m], in the model's dtype (the
        grid's) whatever the dtype of ``y`` (``y − y_mid`` is taken in the precision of
        ``y``). ``y`` must be real numbers: strings, complex and boolean values raise a
        ``TypeError``."""
        _real_dtype_or_raise("y", y, "coordinates [m], real numbers")
        return self._coriolis_at(y)

    def _coriolis_at(self, y: ArrayLike) -> Array:
        # unchecked: called while tracing every step, on coordinates the model made itself
        g = self.grid
        y_mid = g.origin[0] + 0.5 * g.extent[0]
        model = self._in_grid_dtype()  # parameters set with eqx.tree_at may be float64
        offset = (jnp.asarray(y) - y_mid).astype(g.dtype)
        return model.coriolis + model.beta * offset

    def _coriolis_at_corner_rows(self, rows: Array) -> Array:
        """f at the corners of global rows ``rows`` (integers), as a column. On a periodic y
        axis the rows wrap, so that corner row ``ny`` is corner row ``0``: one value of the
        potential vorticity per corner, as the energy-conserving scheme needs."""
        g = self.grid
        if g.periodic[0]:
            rows = rows % g.shape[0]
        y = g.origin[0] + (rows.astype(g.dtype) + 0.0) * g.spacing[0]
        return self._coriolis_at(y)[:, None]

    # ----------------------------------------------------------------- physics
    def _tangential_parity(self) -> int:
        return 1 if self.boundary == "free-slip" else -1

    def _bc(self) -> dict[str, tuple]:
        p = self._tangential_parity()
        return {"h": (CENTRE, (1, 1)), "u": (X_FACE, (p, -1)), "v": (Y_FACE, (-1, p))}

    def _pad(self, state: ShallowWaterState) -> ShallowWaterState:
        """The state with halos holding the boundary conditions (and neighbours' data)."""
        bc = self._bc()
        return ShallowWaterState(
            **{k: fill_halo(getattr(state, k), self.grid, *bc[k]) for k in ("h", "u", "v")}
        )

    def _unpad(self, padded: ShallowWaterState) -> ShallowWaterState:
        return jax.tree.map(lambda a: interior(a, self.grid), padded)

    def _padded_bottom(self) -> Array | None:
        return None if self.bottom is None else fill_halo(self.bottom, self.grid, CENTRE)

    def _tendency(
        self,
        padded: ShallowWaterState,
        t: ArrayLike,
        bottom: Array | None,
        f_corner: Array | None = None,
    ) -> ShallowWaterState:
        """Interior tendencies from a halo-padded state (halo width 1).

        Every term is written as slices of the padded fields over exactly the index window it
        is needed on, so that XLA fuses the whole right-hand side into a few loops (see
        docs/benchmarks.md); it is the same arithmetic as the staggered operators in
        [`physjax.grids`][]: ``U = h̄ˣu``, ``V = h̄ʸv``, ``q = (f + ζ)/h̄ˣʸ`` at corners,
        ``B = g(h + b) + K``. ``f_corner`` (rows of corners 0..ny, as a column) replaces the
        Coriolis parameter computed from the grid's coordinates (a strip knows its rows).
        The rotational and Bernoulli terms come from ``_core_shared`` on the CPU and from
        ``_core_pointwise`` on accelerators (see ``_pointwise_core``).
        """
        g = self.grid
        ny, nx = g.local_shape
        dx, dy = g.dx, g.dy
        h, u, v = padded.h, padded.u, padded.v

        win = _win

        P = (-1, -1)  # origin of padded fields
        if f_corner is None:
            f_corner = self._coriolis_at_corner_rows(g.local_index(0, padded=True)[1:])
        if _pointwise_core():
            dh, du, dv = self._core_pointwise(padded, bottom, f_corner)
        else:
            dh, du, dv = self._core_shared(padded, bottom, f_corner)
        u_c, v_c = win(u, P, 0, ny, 0, nx), win(v, P, 0, ny, 0, nx)
        if self.viscosity is not None:
            # Five-point Laplacians; walls (free- or no-slip) are held by the halo.
            def lap(a, c):
                return (
                    win(a, P, 0, ny, 1, nx + 1) - 2 * c + win(a, P, 0, ny, -1, nx - 1)
                ) / dx**2 + (
                    win(a, P, 1, ny + 1, 0, nx) - 2 * c + win(a, P, -1, ny - 1, 0, nx)
                ) / dy**2

            du = du + self.viscosity * lap(u, u_c)
            dv = dv + self.viscosity * lap(v, v_c)
        if self.drag is not None:
            du = du - self.drag * u_c
            dv = dv - self.drag * v_c
        if self.wind_stress is not None:
            h_c = win(h, P, 0, ny, 0, nx)
            h_u = 0.5 * (h_c + win(h, P, 0, ny, -1, nx - 1))
            h_v = 0.5 * (h_c + win(h, P, -1, ny - 1, 0, nx))
            du = du + self.wind_stress[0] / (self.density * h_u)
            dv = dv + self.wind_stress[1] / (self.density * h_v)
        if not g.periodic[1]:
            du = jnp.where(g.local_index(1)[None, :] == 0, 0, du)
        if not g.periodic[0]:
            dv = jnp.where(g.local_index(0)[:, None] == 0, 0, dv)
        return ShallowWaterState(h=dh, u=du, v=dv)

    def _core_shared(self, padded, bottom, f_corner):
        """dh and the rotational and Bernoulli parts of du, dv on the interior: each
        intermediate (U, V, q, qU, qV, B) computed once over the window its consumers read."""
        g = self.grid
        ny, nx = g.local_shape
        dx, dy = g.dx, g.dy
        h, u, v = padded.h, padded.u, padded.v
        win = _win
        P = (-1, -1)  # origin of padded fields
        # Mass fluxes: U on x-faces rows -1..ny, columns 0..nx; V on y-faces rows 0..ny,
        # columns -1..nx.
        U = 0.5 * (win(h, P, -1, ny + 1, 0, nx + 1) + win(h, P, -1, ny + 1, -1, nx))
        U = U * win(u, P, -1, ny + 1, 0, nx + 1)
        V = 0.5 * (win(h, P, 0, ny + 1, -1, nx + 1) + win(h, P, -1, ny, -1, nx + 1))
        V = V * win(v, P, 0, ny + 1, -1, nx + 1)
        # Potential vorticity at corners 0..ny, 0..nx.
        zeta = (win(v, P, 0, ny + 1, 0, nx + 1) - win(v, P, 0, ny + 1, -1, nx)) / dx - (
            win(u, P, 0, ny + 1, 0, nx + 1) - win(u, P, -1, ny, 0, nx + 1)
        ) / dy
        h_corner = 0.25 * (
            win(h, P, 0, ny + 1, 0, nx + 1)
            + win(h, P, -1, ny, 0, nx + 1)
            + win(h, P, 0, ny + 1, -1, nx)
            + win(h, P, -1, ny, -1, nx)
        )
        q = (f_corner + zeta) / h_corner
        qV = q * 0.5 * (win(V, (0, -1), 0, ny + 1, 0, nx + 1) + win(V, (0, -1), 0, ny + 1, -1, nx))
        qU = q * 0.5 * (win(U, (-1, 0), 0, ny + 1, 0, nx + 1) + win(U, (-1, 0), -1, ny, 0, nx + 1))
        # Bernoulli function at centres -1..ny-1, -1..nx-1.
        u2 = win(u, P, -1, ny, -1, nx + 1) ** 2
        v2 = win(v, P, -1, ny + 1, -1, nx) ** 2
        kinetic = 0.25 * (u2[:, :-1] + u2[:, 1:] + v2[:-1] + v2[1:])
        surface = win(h, P, -1, ny, -1, nx)
        if bottom is not None:
            surface = surface + win(bottom, P, -1, ny, -1, nx)
        B = self.gravity * surface + kinetic

        dh = -(
            (win(U, (-1, 0), 0, ny, 1, nx + 1) - win(U, (-1, 0), 0, ny, 0, nx)) / dx
            + (win(V, (0, -1), 1, ny + 1, 0, nx) - win(V, (0, -1), 0, ny, 0, nx)) / dy
        )
        du = 0.5 * (qV[:-1, :-1] + qV[1:, :-1]) - (B[1:, 1:] - B[1:, :-1]) / dx
        dv = -0.5 * (qU[:-1, :-1] + qU[:-1, 1:]) - (B[1:, 1:] - B[:-1, 1:]) / dy
        return dh, du, dv

    def _core_pointwise(self, padded, bottom, f_corner):
        """The same terms as ``_core_shared``, every intermediate recomputed at each point
        that reads it from slices of the padded fields: no intermediate array, so that a
        backend that fuses elementwise work over slices (XLA:GPU) can make each tendency one
        kernel that reads the state once. More arithmetic, far less memory traffic."""
        g = self.grid
        ny, nx = g.local_shape
        dx, dy = g.dx, g.dy
        h, u, v = padded.h, padded.u, padded.v

        def at(a, dj, di):
            # a padded field at (j + dj, i + di) over the interior rows j and columns i
            return a[1 + dj : 1 + dj + ny, 1 + di : 1 + di + nx]

        def U(dj, di):
            return 0.5 * (at(h, dj, di) + at(h, dj, di - 1)) * at(u, dj, di)

        def V(dj, di):
            return 0.5 * (at(h, dj, di) + at(h, dj - 1, di)) * at(v, dj, di)

        def q(dj, di):
            zeta = (at(v, dj, di) - at(v, dj, di - 1)) / dx - (
                at(u, dj, di) - at(u, dj - 1, di)
            ) / dy
            h_corner = 0.25 * (
                at(h, dj, di) + at(h, dj - 1, di) + at(h, dj, di - 1) + at(h, dj - 1, di - 1)
            )
            return (f_corner[dj : dj + ny] + zeta) / h_corner

        def B(dj, di):
            kinetic = 0.25 * (
                at(u, dj, di) ** 2
                + at(u, dj, di + 1) ** 2
                + at(v, dj, di) ** 2
                + at(v, dj + 1, di) ** 2
            )
            surface = at(h, dj, di)
            if bottom is not None:
                surface = surface + at(bottom, dj, di)
            return self.gravity * surface + kinetic

        def qV(dj, di):
            return q(dj, di) * 0.5 * (V(dj, di) + V(dj, di - 1))

        def qU(dj, di):
            return q(dj, di) * 0.5 * (U(dj, di) + U(dj - 1, di))

        b00 = B(0, 0)
        dh = -((U(0, 1) - U(0, 0)) / dx + (V(1, 0) - V(0, 0)) / dy)
        du = 0.5 * (qV(0, 0) + qV(1, 0)) - (b00 - B(0, -1)) / dx
        dv = -0.5 * (qU(0, 0) + qU(0, 1)) - (b00 - B(-1, 0)) / dy
        return dh, du, dv

    def rhs(self, state: ShallowWaterState, t: ArrayLike = 0.0) -> ShallowWaterState:
        """Tendencies ``(∂h/∂t, ∂u/∂t, ∂v/∂t)`` at time ``t`` [s] (the state's type, shapes and
        dtype checked, as for every method taking a state)."""
        self._check_state(state, values=False)
        _check_time("t", t)
        # an array, not a Python number, which filter_jit would take as static and compile
        # again for every new t
        return _tendencies(self._in_grid_dtype(), state, jnp.asarray(t, self.grid.dtype))

    def _rhs(self, state: ShallowWaterState, t) -> ShallowWaterState:
        # unchecked: also on a device's block, whose shape is not the grid's
        return self._tendency(self._pad(state), t, self._padded_bottom())

    def _step(self, state, t, dt, bottom, f_corner=None):
        def rhs(y, t):
            # One materialised padded copy per field and stage; every stencil window below
            # is then a slice that XLA fuses into the loop consuming it.
            padded = jax.lax.optimization_barrier(self._pad(y))
            return self._tendency(padded, t, bottom, f_corner)

        return scheme(self.scheme)(rhs, state, t, dt)

    def step(
        self, state: ShallowWaterState, dt: ArrayLike, *, t: ArrayLike = 0.0
    ) -> ShallowWaterState:
        """One step of the fixed-step scheme from time ``t`` (keyword; the built-in forcing
        does not depend on it). The state's type, shapes and dtype are checked, and ``dt``
        must be a finite number > 0 when it has a value (the stability limit is not checked
        here: see [`check_dt`][physjax.solvers.ShallowWater.check_dt])."""
        # Not the values: that would cost a transfer from the device at every step.
        self._check_state(state, values=False)
        _check_time("dt", dt, positive=True)
        _check_time("t", t)
        # in the model's dtype, as run and advance take them: a NumPy float64 dt (x64 on)
        # would promote a float32 state
        t, dt = jnp.asarray(t, self.grid.dtype), jnp.asarray(dt, self.grid.dtype)
        return _one_step(self._in_grid_dtype(), state, t, dt)

    # -------------------------------------------------------------- diagnostics
    def mass(self, state: ShallowWaterState) -> Array:
        """Total volume Σ h ΔA [m³]."""
        self._check_state(state, values=False)
        # Sum deviations from one reference value: in float32 a plain sum of ~1e5 similar
        # numbers loses more digits than the scheme's own round-off.
        ref = state.h[0, 0]  # not reshape(-1)[0]: flattening gathers a sharded field whole
        return (jnp.sum(state.h - ref) + ref * state.h.size) * self.grid.cell_volume

    def energy(self, state: ShallowWaterState) -> Array:
        """Total energy per unit density Σ (h K + ½ g h² + g h b) ΔA [m⁵ s⁻²], the quantity the
        scheme conserves."""
        self._check_state(state, values=False)
        g = self.grid.unsharded()
        u = fill_halo(state.u, g, X_FACE, parity=(self._tangential_parity(), -1))
        v = fill_halo(state.v, g, Y_FACE, parity=(-1, self._tangential_parity()))
        kinetic = interior(0.5 * (interp_x_f2c(u * u) + interp_y_f2c(v * v)), g)
        # As in `mass`: h = r + η about one reference value r, so that the large, nearly
        # uniform part ½ g r² + g r η (+ g r b) is summed as Σ η (and Σ b) and only small
        # terms are summed cell by cell; a plain float32 sum of ½ g h² loses more digits
        # than a step changes the energy.
        model = self._in_grid_dtype()  # parameters set with eqx.tree_at may be float64
        gravity = model.gravity
        ref = state.h[0, 0]  # not reshape(-1)[0]: flattening gathers a sharded field whole
        eta = state.h - ref
        local = state.h * kinetic + 0.5 * gravity * eta * eta
        uniform = gravity * ref * (0.5 * ref * state.h.size + jnp.sum(eta))
        if model.bottom is not None:
            local = local + gravity * eta * model.bottom
            uniform = uniform + gravity * ref * jnp.sum(model.bottom)
        return (jnp.sum(local) + uniform) * g.cell_volume

    def relative_vorticity(self, state: ShallowWaterState) -> Field2D:
        """ζ = ∂v/∂x − ∂u/∂y [s⁻¹] at cell corners (``(j, i)`` at the south-west corner)."""
        self._check_state(state, values=False)
        g = self.grid.unsharded()
        p = self._tangential_parity()
        u = fill_halo(state.u, g, X_FACE, parity=(p, -1))
        v = fill_halo(state.v, g, Y_FACE, parity=(-1, p))
        return interior(diff_x_c2f(v, g) - diff_y_c2f(u, g), g)

    def potential_vorticity(self, state: ShallowWaterState) -> Field2D:
        """q = (f + ζ)/h [m⁻¹ s⁻¹] at cell corners."""
        self._check_state(state, values=False)
        g = self.grid.unsharded()
        h = fill_halo(state.h, g, CENTRE)
        h_corner = interior(interp_y_c2f(interp_x_c2f(h)), g)
        y = jnp.asarray(g.coordinates("y", "face"), g.dtype)[:, None]
        f = self._coriolis_at(y)
        return (f + self.relative_vorticity(state)) / h_corner

    def _check_state(
        self,
        state: ShallowWaterState,
        *,
        walls: bool = True,
        values: bool = True,
        thickness: bool = True,
    ) -> dict[str, np.ndarray] | None:
        """Refuse a state that is not a ``ShallowWaterState`` of real fields of the grid's shape
        and the model's dtype (checked before anything compiles, also on tracers), or, when it
        has values (and ``values``), one with NaN/Inf, (``thickness``) a thickness that is not
        positive, or (``walls``) normal flow through a wall. Returns, when they have values,
        the few scalars the checks need (see ``_state_stats``) as NumPy scalars: the fields
        are reduced on their devices, never copied to the host."""
        self._check_parameters(values=values)
        if not isinstance(state, ShallowWaterState):
            raise TypeError(
                f"state must be a physjax.solvers.ShallowWaterState (e.g. from "
                f"model.initial_state(h, u, v)), got {_describe(state)}"
            )
        g = self.grid
        want = np.dtype(g.dtype)
        for k in ("h", "u", "v"):
            a = getattr(state, k)
            if not hasattr(a, "dtype") or not hasattr(a, "shape"):
                raise TypeError(
                    f"state.{k} must be an array of shape {g.shape}, got {_describe(a)}"
                )
            _check_field(f"state.{k}", a, g)
            dtype = np.dtype(jax.dtypes.canonicalize_dtype(a.dtype))
            if dtype != want:
                raise TypeError(
                    f"state.{k} has dtype {dtype} but the model computes in {want}: build the "
                    f"state with model.initial_state(h, u, v), which converts, or cast it "
                    f"(e.g. jax.tree.map(lambda a: a.astype('{want}'), state))"
                )
        if not values or not all(is_concrete(getattr(state, k)) for k in ("h", "u", "v")):
            return None
        # reduced on the device: only these scalars come to the host, never the fields
        stats = _state_stats(state.h, state.u, state.v)
        for k in ("h", "u", "v"):
            bad = int(stats[f"bad_{k}"])
            if bad:
                raise ValueError(f"state.{k} must be finite everywhere, got {bad} NaN/Inf value(s)")
        if thickness and not stats["h_min"] > 0:
            raise ValueError(
                f"state.h (layer thickness) must be > 0 everywhere, got a minimum of "
                f"{float(stats['h_min']):g} m"
            )
        if walls:
            for k, axis, where, index in (
                ("u", 1, "west wall (x walled)", "u[:, 0]"),
                ("v", 0, "south wall (y walled)", "v[0, :]"),
            ):
                if g.periodic[axis]:
                    continue
                normal = stats[f"wall_{k}"]
                if normal != 0:
                    raise ValueError(
                        f"state.{k} must be 0 on the {where}: {index} is the velocity through "
                        f"the wall, got max |{index}| = {float(normal):g} m/s; "
                        f"build the state with model.initial_state(h, u, v), which sets it to 0"
                    )
        return stats

    def _check_parameters(self, *, values: bool = True) -> None:
        """The constructor's checks of the physical constants (on their values when they have
        them) and of the fields' shapes, again: a model edited with ``eqx.tree_at`` skips
        ``__init__``. Every method that takes a state runs them first; with ``values`` (the
        methods that check the state's values: ``run``, ``advance``, ``solve_diffrax``,
        ``max_stable_dt``, ``check_dt``) also the values of ``bottom`` and ``wind_stress``
        when they have them (finite in the grid's dtype), once at the call's Python entry;
        ``step`` and ``rhs``, called every step, check shapes only."""
        _check_grid(self.grid, self.boundary)
        for name, low in _SCALAR_PARAMETERS:
            value = getattr(self, name)
            if value is not None or name not in ("drag", "viscosity"):
                _check_scalar(name, value, low=low, dtype=self.grid.dtype)
        g = self.grid
        fields = [("bottom", self.bottom)]
        ws = self.wind_stress
        if ws is not None:
            if not isinstance(ws, (tuple, list)) or len(ws) != 2:
                raise ValueError(
                    f"wind_stress must be a pair (tau_x, tau_y) of fields of the grid shape "
                    f"(ny, nx)={g.shape}, got {_describe(ws)}"
                )
            fields += [("wind_stress[0] (tau_x)", ws[0]), ("wind_stress[1] (tau_y)", ws[1])]
        for name, f in fields:
            if f is None:
                continue
            if not hasattr(f, "shape") or not hasattr(f, "dtype"):
                raise TypeError(f"{name} must be an array of shape {g.shape}, got {_describe(f)}")
            if np.dtype(f.dtype).kind not in "iuf":
                raise TypeError(f"{name} must be real numbers, got {_describe(f)}")
            _check_field(name, f, g)
            if values and is_concrete(f):
                _check_field_values(name, f, g)

    def _in_grid_dtype(self) -> ShallowWater:
        """The model with its physical constants and fields in the grid's dtype: one set
        with ``eqx.tree_at`` keeps the value's dtype (a float64 drag in a float32 model when
        x64 is on, a Python float), which would otherwise promote the tendencies."""
        dtype = np.dtype(self.grid.dtype)
        old = [getattr(self, name) for name in _PARAMETERS]
        new = jax.tree.map(
            # hasattr first: np.dtype("float64") == None is True, which left a Python number
            # in a float64 model, static to jit (every new value compiled the run again)
            lambda x: x if hasattr(x, "dtype") and x.dtype == dtype else jnp.asarray(x, dtype),
            old,
        )
        if all(a is b for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new))):
            return self
        return eqx.tree_at(
            lambda m: [getattr(m, name) for name in _PARAMETERS],
            self,
            new,
            is_leaf=lambda x: x is None,
        )

    def _parameters_concrete(self) -> bool:
        return all(
            is_concrete(x)
            for x in (self.gravity, self.coriolis, self.beta, self.viscosity, self.drag)
            if x is not None
        )

    def max_stable_dt(self, state: ShallowWaterState, cfl: float = 1.0) -> float:
        """Largest stable time step [s] of the fixed-step scheme, times ``cfl`` (> 0).

        Gravity waves on the C-grid reach ω = (c + |u|)·2·√(1/dx² + 1/dy²); the scheme is
        stable for ω dt up to its imaginary-axis limit L (√3 for SSP-RK3, 2√2 for RK4).
        Rotation adds dt ≤ L / |f|max, and damping — linear drag and viscosity together —
        dt ≤ X / (r + 4ν(1/dx² + 1/dy²)), with X the damping limit that holds together with
        waves at L (1.64 for SSP-RK3, 0.68 for RK4; see
        ``physjax.solvers._time_stepping.DAMPING_LIMITS``). A Python float when the state and
        parameters have values; inside ``jit``/``grad``/``vmap`` over them, a traced array.
        """
        _check_time("cfl", cfl, positive=True, unit="a fraction of the stability limit")
        g = self.grid
        inv = math.sqrt(1 / g.dx**2 + 1 / g.dy**2)
        limit = SCHEMES[self.scheme][2]
        damping = DAMPING_LIMITS[self.scheme]
        fields = self._check_state(state, walls=False)
        if fields is None or not self._parameters_concrete() or not is_concrete(cfl):
            model = self._in_grid_dtype()
            return model._max_stable_dt_traced(state, cfl, inv, limit, damping)
        return self._stable_dt_of(fields, float(cfl))

    def _stable_dt_of(self, fields: dict[str, np.ndarray], cfl: float) -> float:
        """``max_stable_dt`` from the scalars ``_check_state`` returned, in Python floats
        (the state and parameters have values)."""
        g = self.grid
        inv = math.sqrt(1 / g.dx**2 + 1 / g.dy**2)
        limit = SCHEMES[self.scheme][2]
        damping = DAMPING_LIMITS[self.scheme]
        depth = float(fields["h_max"])
        speed = float(max(fields["u_max"], fields["v_max"]))
        c = math.sqrt(float(self.gravity) * depth) + speed
        dt = limit / (2 * c * inv)
        f = abs(float(self.coriolis)) + abs(float(self.beta)) * g.extent[0] / 2
        if f > 0:
            dt = min(dt, limit / f)
        nu = 0.0 if self.viscosity is None else float(self.viscosity)
        r = 0.0 if self.drag is None else float(self.drag)
        damping_rate = r + 4 * nu * inv**2  # the most negative real eigenvalue
        if damping_rate > 0:
            dt = min(dt, damping / damping_rate)
        return cfl * dt

    def _max_stable_dt_traced(self, state, cfl, inv, limit, damping):
        """``max_stable_dt`` in jnp operations, for traced state or parameters."""
        g = self.grid
        depth = jnp.max(state.h)
        speed = jnp.maximum(jnp.max(jnp.abs(state.u)), jnp.max(jnp.abs(state.v)))
        dt = limit / (2 * (jnp.sqrt(self.gravity * depth) + speed) * inv)
        f = jnp.abs(self.coriolis) + jnp.abs(self.beta) * g.extent[0] / 2
        # the division guarded, so that its unused branch gives no NaN gradient at f = 0
        dt = jnp.where(f > 0, jnp.minimum(dt, limit / jnp.where(f > 0, f, 1)), dt)
        nu = 0.0 if self.viscosity is None else self.viscosity
        r = 0.0 if self.drag is None else self.drag
        rate = r + 4 * nu * inv**2
        dt = jnp.where(rate > 0, jnp.minimum(dt, damping / jnp.where(rate > 0, rate, 1)), dt)
        return jnp.asarray(cfl, g.dtype) * dt  # a NumPy float64 cfl would promote it

    def check_dt(self, state: ShallowWaterState, dt: float) -> None:
        """Raise ``ValueError`` when ``dt`` is not one finite number > 0 (a Python or NumPy
        scalar or a 0-d array) or breaks the stability limit of
        [`max_stable_dt`][physjax.solvers.ShallowWater.max_stable_dt] by more than the
        round-off of the model's dtype (8 ulps: the limit cast to float32 passes). The limit
        is not checked
        while the state, ``dt`` or a parameter it needs is traced (inside ``jit``, ``grad``,
        ``vmap``): it has no value to compare then."""
        value = _check_time("dt", dt, positive=True)
        self._check_dt(value, self._check_state(state, walls=False))

    def _check_dt(self, value: float | None, fields: dict[str, np.ndarray] | None) -> None:
        """``check_dt`` of ``dt`` (``_check_time``'s float) on the scalars of a state that
        ``_check_state`` passed (``None`` when traced): the state is reduced once."""
        if value is None or fields is None or not self._parameters_concrete():
            return
        limit = self._stable_dt_of(fields, 1.0)
        # the limit itself in the model's dtype (rounded up, or computed under jit in its
        # arithmetic) is not a step above it
        if value > limit * (1 + 8 * np.finfo(self.grid.dtype).eps):
            raise ValueError(
                f"dt={value:g} s breaks the CFL stability limit of the {self.scheme} scheme on "
                f"this grid and state: allowed 0 < dt <= {limit:.4g} s (CFL number "
                f"{value / limit:.2f} > 1); lower dt, or take dt = model.max_stable_dt(state, "
                f"cfl) with 0 < cfl <= 1 (on the command line: lower --dt or give --cfl instead)"
            )

    def check_mesh(self, mesh: jax.sharding.Mesh) -> None:
        """Raise ``ValueError`` when ``mesh`` does not divide the grid or leaves a device
        fewer than 2 cells along a walled axis (``TypeError`` when it is not a mesh)."""
        if not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(
                f"mesh must be a jax.sharding.Mesh (from physjax.parallel.make_mesh) or None, "
                f"got {_describe(mesh)}"
            )
        local = decompose(self.grid, mesh)
        for axis, name in enumerate(("y", "x")):
            n, m = self.grid.shape[axis], local.mesh_shape[axis]
            if m > 1 and not self.grid.periodic[axis] and n // m < _MIN_WALLED:
                raise ValueError(
                    f"n{name}={n} split {m} ways leaves {n // m} cell(s) per device; a walled "
                    f"{name} axis needs at least {_MIN_WALLED} per device: use fewer devices "
                    f"along {name} or n{name} >= {_MIN_WALLED * m}"
                )

    # ----------------------------------------------------------------- running
    def run(
        self,
        state: ShallowWaterState,
        *,
        dt: float,
        n_steps: int,
        save_every: int | None = None,
        t0: float = 0.0,
        mesh: jax.sharding.Mesh | None = None,
        throw: bool = True,
    ) -> ShallowWaterSolution:
        """Advance ``n_steps`` fixed steps of size ``dt`` [s] in compiled ``lax.scan`` loops,
        returning a frame every ``save_every`` steps (default: only the last).

        With a ``mesh`` from [`physjax.parallel.make_mesh`][] the run is split over its
        devices by ``shard_map`` with halo exchange; the result equals the one-device run.

        Checked before anything compiles: the state (a ``ShallowWaterState`` of fields of the
        grid's shape and the model's dtype; when it has values, finite, with ``h > 0`` and no
        flow through walls — ``u[:, 0] = 0`` on a walled x axis, ``v[0, :] = 0`` on a walled y
        axis, as [`initial_state`][physjax.solvers.ShallowWater.initial_state] makes it), the
        counts, ``t0``, the mesh, and ``dt`` against the stability limit (see
        [`check_dt`][physjax.solvers.ShallowWater.check_dt]; not while traced). ``sol.ts``
        is held in the model's dtype: a ``t0`` and ``dt`` whose frame times it moves by more
        than 0.1% of the interval between frames (float32 far from ``t0 = 0``) are refused.

        A run that blows up — a frame with NaN/Inf or a layer thickness ``h <= 0``, as when the
        layer runs dry or the flow outgrows the ``dt`` checked on the initial state — raises a
        ``RuntimeError`` naming the first such frame, its step and time (``throw=False``
        returns the frames as they are; inside ``jit``/``vmap`` they are not checked).
        """
        if not isinstance(throw, (bool, np.bool_)):
            raise TypeError(f"throw must be True or False, got {throw!r}")
        fields = self._check_state(state)
        save_every = n_steps if save_every is None else save_every
        _check_counts(n_steps, save_every)
        n_steps, save_every = int(n_steps), int(save_every)
        a = _check_time("t0", t0)
        if mesh is not None:
            self.check_mesh(mesh)
        # check_dt on the scalars of the state checked above, not reduced again
        self._check_dt(_check_time("dt", dt, positive=True), fields)
        n_frames = n_steps // save_every
        dtype = self.grid.dtype
        if a is not None and is_concrete(dt):
            # the frame times in float64, rounded once to the model's dtype, and refused where
            # that moves them (float32 times 3e8 s from the origin are 32 s apart)
            ts = _frame_times(a, float(np.asarray(dt)), save_every, n_frames, dtype)
        else:
            ts = t0 + dt * save_every * jnp.arange(1, n_frames + 1, dtype=dtype)
            ts = ts.astype(dtype)  # a NumPy float64 dt or t0 made them float64
        t0_, dt_ = jnp.asarray(t0, dtype), jnp.asarray(dt, dtype)
        model, state = self._on_mesh(state, mesh)
        frames = _run_frames(model, state, t0_, dt_, n_frames, save_every, mesh)
        sol = ShallowWaterSolution(ts=ts, states=frames)
        if throw:
            _raise_if_run_blew_up(sol, save_every)
        return sol

    def advance(
        self,
        state: ShallowWaterState,
        *,
        t0: ArrayLike,
        dt: ArrayLike,
        n_steps: int,
        mesh: jax.sharding.Mesh | None = None,
        cfl_check: bool = False,
    ) -> ShallowWaterState:
        """The state after ``n_steps`` fixed steps from time ``t0`` (compiled once per
        ``n_steps`` and mesh); the building block of chunked runs that write as they go.

        The state, counts, ``t0`` and mesh are checked as in
        [`run`][physjax.solvers.ShallowWater.run], except that a thickness that is not
        positive is let through (a chunked run whose layer runs dry is left to blow up and be
        caught by its driver, which then re-advances the last good state step by step), and
        ``dt`` must be a finite number > 0. The stability limit is checked only with
        ``cfl_check=True``: a chunked run checks its ``dt`` once with
        [`check_dt`][physjax.solvers.ShallowWater.check_dt] (the command line's
        ``--no-cfl-check`` runs a ``dt`` above it on purpose); ``cfl_check`` is ``True`` or
        ``False`` (a ``TypeError`` otherwise).
        """
        if not isinstance(cfl_check, (bool, np.bool_)):
            # "no" would run the check and None skip it, by their truth values
            raise TypeError(f"cfl_check must be True or False, got {cfl_check!r}")
        self._check_state(state, thickness=False)
        _check_counts(n_steps, n_steps)
        n_steps = int(n_steps)
        _check_time("t0", t0)
        _check_time("dt", dt, positive=True)
        if mesh is not None:
            self.check_mesh(mesh)
        if cfl_check:
            self.check_dt(state, dt)
        # Times as arrays: filter_jit would treat Python floats as static and recompile.
        t0 = jnp.asarray(t0, self.grid.dtype)
        dt = jnp.asarray(dt, self.grid.dtype)
        model, state = self._on_mesh(state, mesh)
        return _advance(model, state, t0, dt, n_steps, mesh)

    def _on_mesh(self, state: ShallowWaterState, mesh) -> tuple[ShallowWater, ShallowWaterState]:
        """The model and state placed on ``mesh`` (split like the grid): arrays committed to
        one device, e.g. by ``jax.device_put``, would otherwise be refused by the compiled
        call's device check."""
        return place_on_mesh((self._in_grid_dtype(), state), self.grid, mesh)

    def solve_diffrax(
        self,
        state: ShallowWaterState,
        t0: float,
        t1: float,
        *,
        mesh: jax.sharding.Mesh | None = None,
        **kwargs,
    ):
        """Integrate with diffrax (adaptive Tsit5 with a PID controller by default); keyword
        arguments go to [`physjax.solvers.integrate_diffrax`][] (``solver``, ``saveat``,
        ``rtol``, ``atol``, ``stepsize_controller``, ``adjoint``, ``dt0``, ``max_steps``,
        ``throw``).
        The default tolerances are ``rtol=1e-6, atol=1e-8`` for a float64 model and
        ``rtol=1e-4, atol=1e-6`` for a float32 one, whose round-off would otherwise pass for
        truncation error and shrink the steps far below the stable step. They apply to
        every field alike (relative to the total depth for ``h``, absolute in m/s for ``u``
        and ``v``): lower ``atol`` for small-amplitude motions (docs/shallow_water.md).

        The model travels to the vector field through diffrax's ``args``, so gradients with
        respect to its parameters work with every adjoint that differentiates the solve
        (``diffrax.BacksolveAdjoint`` included; not ``diffrax.ImplicitAdjoint``, which
        assumes a steady state ``f(y1) = 0`` and is wrong for any other solve). Times are
        taken in the model's dtype (``sol.ts`` and ``sol.ys`` keep it):
        ``t0`` and ``t1`` whose span ``t1 - t0`` that dtype moves by more than 0.1% are
        refused (float32 times 1e9 s from the origin are 64 s apart; count them from a
        nearer origin, or use float64).
        With a ``mesh`` the right-hand side is evaluated split over its devices, by the same
        ``shard_map`` with halo exchange as [`run`][physjax.solvers.ShallowWater.run], and
        ``sol.ys`` comes back sharded like the fields; the result equals the one-device
        solve to round-off while both take the same steps (with adaptive steps a step on the
        edge of acceptance may go differently on another layout, whose results differ in the
        last bits; the runs then agree to the tolerance). The state,
        times, ``rtol``/``atol``, ``max_steps``, the mesh, the types of ``solver``,
        ``saveat``, ``stepsize_controller`` and ``adjoint`` and the save times of
        ``saveat=diffrax.SaveAt(ts=...)`` (within ``[t0, t1]``, in order) are checked first.
        A solve that reaches ``max_steps`` raises: called eagerly, a ``RuntimeError`` naming
        the steps it took and rejected and, when a state it saved holds NaN/Inf or
        ``h <= 0``, that frame (an adaptive solve through a layer that runs dry shrinks its
        steps until it runs out of them); inside ``jit``/``grad``/``vmap``, diffrax's own
        error. With ``throw=False`` it returns, ``sol.result`` saying how it ended (frames of
        ``SaveAt(ts=...)`` it did not reach are ``inf``; the default ``SaveAt(t1=True)``
        holds the state where it stopped, ``sol.ts`` that time).
        ``dt0`` is not checked against a stability limit (that depends on the diffrax solver);
        a solve that diffrax reports successful but whose saved states hold NaN/Inf — constant
        steps (``diffrax.ConstantStepSize()``) above the solver's limit, which nothing rejects
        — raises a ``RuntimeError`` naming the time of the first such frame and
        ``max_stable_dt`` (unless ``throw=False``, or while the solution is traced).
        """
        unknown = sorted(set(kwargs) - _DIFFRAX_OPTIONS)
        if unknown:
            raise TypeError(
                f"solve_diffrax() got unexpected keyword argument(s) {unknown}; it takes "
                f"mesh and {', '.join(sorted(_DIFFRAX_OPTIONS))}"
            )
        check_diffrax_options(**kwargs)
        self._check_state(state)
        dtype = self.grid.dtype
        a, b = _check_time("t0", t0), _check_time("t1", t1)
        if a is not None and b is not None:
            check_time_span(t0, t1, dtype, unit=" s")
        if dtype == "float32" and kwargs.get("stepsize_controller") is None:
            # 1e-6 is a few float32 ulps: the error estimate is then round-off and the
            # controller takes ~9× the steps (a day of a 24×16 channel: 1 363 against 155)
            kwargs.setdefault("rtol", FLOAT32_RTOL)
            kwargs.setdefault("atol", FLOAT32_ATOL)
        for name in ("rtol", "atol"):
            if name in kwargs:
                _check_time(name, kwargs[name], positive=True, unit="a tolerance")
                if is_concrete(kwargs[name]):  # a float64 tolerance would promote float32 times
                    kwargs[name] = float(kwargs[name])
        if kwargs.get("dt0") is not None:
            d = _check_time("dt0", kwargs["dt0"])
            if d is not None and (d == 0 or (a is not None and b is not None and (b - a) * d < 0)):
                # diffrax would take max_steps steps of zero length, or step away from t1
                raise ValueError(
                    f"dt0 must be a nonzero number of seconds with the sign of t1 - t0 = "
                    f"{b - a if a is not None and b is not None else 't1 - t0'}, got {d!r}"
                )
            kwargs["dt0"] = jnp.asarray(kwargs["dt0"], dtype)
        if mesh is not None:
            self.check_mesh(mesh)
        t0, t1 = jnp.asarray(t0, dtype), jnp.asarray(t1, dtype)
        if kwargs.get("saveat") is not None:
            # SaveAt(ts=[...]) of Python floats or float64 (with x64 on) would promote the
            # whole solve of a float32 model, states included, to float64
            kwargs["saveat"] = saveat_in_dtype(kwargs["saveat"], dtype)
            if a is not None and b is not None:
                _check_saveat_ts(kwargs["saveat"], np.asarray(t0), np.asarray(t1))
        model, state = self._on_mesh(state, mesh)
        split = mesh is not None and mesh.size > 1
        throw = kwargs.get("throw", True)
        # Called eagerly (nothing traced), a failed solve raises here, in Python, with what
        # physjax knows of it (where it stopped, whether the layer ran dry there) rather
        # than by diffrax's check inside the compiled solve, which names only the failure
        eager = (
            isinstance(throw, (bool, np.bool_))
            and bool(throw)
            and all(is_concrete(x) for x in jax.tree.leaves((model, state, t0, t1, kwargs)))
        )
        if eager:
            kwargs["throw"] = False
        if split:
            # diffrax's own check (eqx.error_if on the whole solution) runs its callback on
            # device 0 alone: a solve that reached max_steps left the other devices waiting
            # at the next collective until XLA aborted the process
            kwargs["throw"] = False
            # diffrax's default error norm flattens each field, which XLA does by gathering
            # the whole field onto every device at every step: the same norm, reduced in place
            controller = kwargs.get("stepsize_controller")
            if controller is None:
                controller = default_controller(
                    kwargs.pop("rtol", None),
                    kwargs.pop("atol", None),
                    norm=blockwise_rms_norm,
                    dtype=dtype,
                )
            kwargs["stepsize_controller"] = controller_for_sharded_fields(controller)
            state = _check_traced_save_times(state, t0, t1, kwargs, self.grid, mesh)
            state = _check_traced_dt0(state, t0, t1, kwargs, self.grid, mesh)
            if isinstance(kwargs.get("adjoint"), diffrax.BacksolveAdjoint):
                # its backward solves take the forward's throw=False: one that reached
                # max_steps gave a gradient 5% off without a word (one device raises)
                kwargs["adjoint"] = _BacksolveOnMesh(kwargs["adjoint"], throw, self.grid, mesh)
        sol = integrate_diffrax(_DiffraxRHS(mesh), state, t0, t1, args=model, **kwargs)
        if eager and not all(is_concrete(x) for x in jax.tree.leaves(sol.result)):
            # concrete inputs, but called inside a trace (a function under jax.jit whose
            # arguments the solve does not read): its result cannot be read in Python, so
            # the solve is staged again with diffrax's check in the graph (the first, with
            # nothing to raise and no result used, is dropped from the program)
            eager = False
            if not split:
                kwargs["throw"] = True
                sol = integrate_diffrax(_DiffraxRHS(mesh), state, t0, t1, args=model, **kwargs)
        if split and sol.ys is not None:
            sol = eqx.tree_at(lambda s: s.ys, sol, shard(sol.ys, self.grid, mesh))
        if split and throw and not eager:
            sol = _raise_on_mesh(sol, self.grid, mesh)
        if eager and not bool(diffrax.is_okay(sol.result)):
            raise RuntimeError(self._failure_message(sol, t1))
        if throw:
            self._raise_if_blew_up(sol, state, kwargs)
        return sol

    def _failure_message(self, sol: diffrax.Solution, t1) -> str:
        """What a failed eager solve says: diffrax's reason, the steps it took, and, when a
        state it saved holds NaN/Inf or ``h <= 0``, that frame (the usual cause of an
        adaptive solve that runs out of steps: the layer ran dry, and the controller shrank
        the steps towards zero)."""
        stats = jax.device_get(sol.stats)
        steps = (
            f" after {int(stats['num_steps'])} steps ({int(stats['num_rejected_steps'])} of "
            f"them rejected)"
            if "num_steps" in stats and "num_rejected_steps" in stats
            else ""
        )
        reason = str(diffrax.RESULTS[sol.result]).rstrip(".")
        message = f"solve_diffrax failed before t1 = {float(t1):.6g} s{steps}: "
        bad = _first_bad_frame(sol)
        if bad is None:
            message += reason
        else:
            k, n, t, h_min = bad
            what = f"a layer thickness h <= 0 (min {h_min:g} m)" if h_min is not None else "NaN/Inf"
            message += (
                f"the state saved at t = {t:.6g} s (frame {k} of {n}) holds {what}: the layer "
                f"ran dry, or the flow blew up, and the adaptive steps shrank towards zero, so "
                f"a larger max_steps will not help (diffrax: {reason})"
            )
        return message + " (throw=False returns the solution as it is)"

    def _raise_if_blew_up(self, sol: diffrax.Solution, state, kwargs) -> None:
        """Raise when a solve that diffrax reports successful saved NaN/Inf, or states with
        ``h <= 0`` (frames it did not reach, padded with ``ts = inf``, aside): with
        ``diffrax.ConstantStepSize()`` and a ``dt0`` above the solver's stability limit the
        state overflowed to NaN and came back as a successful solution, where ``run`` refuses
        such a ``dt``. Skipped while traced."""
        arrays = jax.tree.leaves(eqx.filter((sol.ts, sol.ys, sol.result), eqx.is_array))
        if not all(is_concrete(a) for a in arrays) or not bool(diffrax.is_okay(sol.result)):
            return
        bad = _first_bad_frame(sol)
        if bad is not None:
            k, n, t, h_min = bad
            dt0 = kwargs.get("dt0")
            controller = kwargs.get("stepsize_controller")
            solver = type(kwargs.get("solver") or diffrax.Tsit5()).__name__
            hint = (
                f"with stepsize_controller={type(controller).__name__}() the steps are not "
                f"checked, and dt0={float(dt0)!r} s is likely above the stability limit of "
                f"the {solver} solver (the model's own {self.scheme} scheme's limit, "
                f"max_stable_dt(state), is {self.max_stable_dt(state):.4g} s): lower dt0, or "
                f"leave stepsize_controller out for adaptive steps, which reject such steps"
                if isinstance(controller, diffrax.ConstantStepSize) and dt0 is not None
                else "lower the step size or the tolerances"
            )
            what = (
                f"a layer thickness h <= 0 (min {h_min:g} m: the layer ran dry, or the steps "
                f"outgrew the flow)"
                if h_min is not None
                else "NaN/Inf"
            )
            raise RuntimeError(
                f"solve_diffrax blew up: the state saved at t = {t:.6g} s (frame "
                f"{k} of {n}) holds {what} although diffrax reported success; {hint} "
                f"(throw=False returns the solution as it is)"
            )


def _first_bad_frame(sol: diffrax.Solution) -> tuple[int, int, float, float | None] | None:
    """The first frame a concrete solution saved (frames it did not reach, padded with
    ``ts = inf``, aside) holding NaN/Inf or a state with ``h <= 0``: ``(k, n, t, h_min)``,
    ``h_min`` the frame's least ``h`` when the layer ran dry there, ``None`` for NaN/Inf
    alone; ``None`` when every frame is sound (or nothing was saved)."""
    if sol.ys is None or sol.ts is None:
        return None
    times, tree = jax.tree.flatten(sol.ts)
    frames = tree.flatten_up_to(sol.ys)  # one tree of saved values per SubSaveAt
    for ts, ys in zip(times, frames):
        n = ts.shape[0]
        bad, dry = (np.asarray(a) for a in _bad_saved_frames(ts, ys))
        bad = bad | dry
        if bad.any():
            k = int(np.argmax(bad))
            h_min = None
            if dry[k]:
                # reduced where the frames live: one scalar comes to the host, not the frame
                with jax.ensure_compile_time_eval():
                    h_min = float(jax.device_get(_frame_least_h(ys.h, k)))
            return k, n, float(ts[k]), h_min
    return None


@jax.jit
def _frame_least_h(h: Array, k) -> Array:
    """The least ``h`` of the saved frame ``k`` of ``h`` (frames first), NaN aside: one
    compiled function for every ``k`` (per shape, dtype and sharding); on a mesh each device
    reduces its block of the frame and only the scalar is all-reduced."""
    return jnp.nanmin(jax.lax.dynamic_index_in_dim(h, k, axis=0, keepdims=False))


@jax.jit
def _bad_saved_frames(ts: Array, ys) -> tuple[Array, Array]:
    """Per frame saved at the times ``ts`` (frames not reached, ``ts = inf``, count as
    sound): whether it holds NaN/Inf, and (saved states, not ``SaveAt(fn=...)``) whether
    some ``h <= 0``. Each frame is reduced over its own axes: flattened first
    (``reshape(n, -1)``), frames split over a mesh were gathered whole onto every device."""
    n = ts.shape[0]
    bad = jnp.zeros((n,), bool)
    for leaf in jax.tree.leaves(ys):
        if jnp.issubdtype(leaf.dtype, jnp.inexact) and leaf.shape[:1] == (n,):
            bad = bad | ~jnp.isfinite(leaf).all(axis=tuple(range(1, leaf.ndim)))
    dry = jnp.zeros((n,), bool)
    if isinstance(ys, ShallowWaterState) and ys.h.shape[:1] == (n,):
        # a layer that ran dry, as run reports it
        dry = (ys.h <= 0).any(axis=tuple(range(1, ys.h.ndim)))
    reached = jnp.isfinite(ts)
    return bad & reached, dry & reached


def _raise_if_run_blew_up(sol: ShallowWaterSolution, save_every: int) -> None:
    """Raise when a frame of ``run`` holds NaN/Inf or ``h <= 0`` (skipped while traced): the
    run returned such frames without a word (a dam break in a 16×24 channel: h down to -117
    m four frames before NaN), where ``solve_diffrax`` and the command line report them."""
    arrays = (sol.ts, sol.states.h, sol.states.u, sol.states.v)
    if not all(is_concrete(a) for a in arrays):
        return
    h = sol.states.h
    bad_values, dry = (np.asarray(a) for a in _bad_frames(sol.states))
    bad = bad_values | dry
    if not bad.any():
        return
    k = int(np.argmax(bad))
    what = "NaN/Inf" if bad_values[k] else f"a layer thickness h <= 0 (min {float(h[k].min()):g} m)"
    before = "no frame" if k == 0 else ("1 frame" if k == 1 else f"{k} frames")
    raise RuntimeError(
        f"run blew up: frame {k} of {bad.size} (after step {(k + 1) * save_every}, t = "
        f"{float(sol.ts[k]):.6g} s) holds {what}; {before} before it "
        f"{'is' if k == 1 else 'are'} whole. The layer ran dry or the flow outgrew dt (checked "
        f"against max_stable_dt of the initial state only): lower dt, or add viscosity or "
        f"drag (throw=False returns the frames as they are)"
    )


@jax.jit
def _bad_frames(states: ShallowWaterState) -> tuple[Array, Array]:
    """Per frame: whether it holds NaN/Inf, and whether some ``h <= 0`` (one compiled call
    over the frames, after the run)."""
    finite = jnp.isfinite(states.h) & jnp.isfinite(states.u) & jnp.isfinite(states.v)
    return jnp.any(~finite, axis=(1, 2)), jnp.any(states.h <= 0, axis=(1, 2))


def _frame_times(t0: float, dt: float, save_every: int, n_frames: int, dtype) -> Array:
    """``run``'s frame times ``t0 + dt·save_every·k`` (k = 1 … n_frames) in ``dtype``, refused
    (``ValueError``) where that dtype moves one by more than ``SPAN_RTOL`` of the interval
    between frames, as ``solve_diffrax`` refuses such a span: a float32 run from
    ``t0=3.1536e8`` (10 years) with ``dt=100`` returned frames 96, 192, 288, 384, 512 s
    after ``t0``."""
    interval = dt * save_every
    exact = t0 + interval * np.arange(1, n_frames + 1, dtype=np.float64)
    with np.errstate(over="ignore"):
        held = exact.astype(dtype)
    error = np.abs(held.astype(np.float64) - exact)  # inf where the dtype overflows
    if not error.max() <= SPAN_RTOL * interval:
        k = int(np.argmax(np.where(np.isnan(error), np.inf, error)))
        raise ValueError(
            f"t0={t0!r} s with dt={dt!r} s: the model's dtype {np.dtype(dtype)} holds frame "
            f"{k}'s time {float(exact[k])!r} s as {float(held[k])!r} s, {error[k]:.3g} s off, more "
            f"than {SPAN_RTOL:g} of the {interval:g} s between frames: count the times from a "
            f"nearer origin (e.g. t0=0) or use float64"
        )
    return jnp.asarray(held)


def _check_traced_save_times(state, t0, t1, kwargs: dict, grid: Grid, mesh):
    """On a mesh, ``SaveAt(ts=...)`` times that cannot be checked eagerly (traced: ``t0``,
    ``t1`` or ``ts`` inside ``jit``/``grad``/``vmap``) are checked here, raising on every
    device's block (``physjax.parallel.error_if`` on ``state.h``, which the solve then
    reads); ``kwargs["saveat"]`` gets times diffrax's own check passes (``t0`` to ``t1``
    evenly where any is bad, so that its error never fires): that check is ``eqx.error_if``
    on device 0 alone, and a time outside the span left the other devices waiting at the
    next collective until XLA aborted the process (40 s). Returns the state."""
    saveat = kwargs.get("saveat")
    if saveat is None:
        return state
    is_sub = lambda x: isinstance(x, diffrax.SubSaveAt)  # noqa: E731
    subs = jax.tree.leaves(saveat.subs, is_leaf=is_sub)
    if all(s.ts is None or is_concrete(s.ts) for s in subs) and is_concrete(t0) and is_concrete(t1):
        return state  # checked already by _check_saveat_ts
    preds = []

    def check(sub):
        if not is_sub(sub) or sub.ts is None or jnp.ndim(sub.ts) != 1 or sub.ts.shape[0] == 0:
            return sub
        ts = sub.ts
        forward = t1 >= t0
        order = jnp.where(forward, ts[1:] < ts[:-1], ts[1:] > ts[:-1])
        bad = jnp.any(order) | jnp.any(
            (ts > jnp.maximum(t0, t1)) | (ts < jnp.minimum(t0, t1)) | jnp.isnan(ts)
        )
        preds.append(bad)
        safe = jnp.where(bad, jnp.linspace(t0, t1, ts.shape[0], dtype=ts.dtype), ts)
        return eqx.tree_at(lambda s: s.ts, sub, safe)

    subs = jax.tree.map(check, saveat.subs, is_leaf=is_sub)
    if not preds:
        return state
    kwargs["saveat"] = eqx.tree_at(lambda s: s.subs, saveat, subs)
    h = error_if(
        state.h,
        jnp.any(jnp.stack(preds)),
        "saveat.ts must lie between t0 and t1 and run from t0 towards t1",
        grid,
        mesh,
    )
    return eqx.tree_at(lambda s: s.h, state, h)


def _check_traced_dt0(state, t0, t1, kwargs: dict, grid: Grid, mesh):
    """On a mesh, a ``dt0`` whose sign cannot be checked eagerly (it, ``t0`` or ``t1``
    traced) is checked here on every device's block, as ``_check_traced_save_times`` does
    for save times, and diffrax gets it with the sign of ``t1 - t0``: diffrax's own check
    (``eqx.error_if`` on device 0 alone) left the other devices waiting until XLA aborted
    the process. Returns the state."""
    dt0 = kwargs.get("dt0")
    if dt0 is None or (is_concrete(dt0) and is_concrete(t0) and is_concrete(t1)):
        return state
    bad = (t1 - t0) * dt0 < 0
    kwargs["dt0"] = jnp.where(bad, -dt0, dt0)
    h = error_if(state.h, bad, "dt0 must have the sign of t1 - t0", grid, mesh)
    return eqx.tree_at(lambda s: s.h, state, h)


def _check_saveat_ts(saveat, t0: np.ndarray, t1: np.ndarray) -> None:
    """Refuse, before anything compiles, ``SaveAt(ts=...)`` times (with values, in the
    model's dtype) that diffrax would refuse only when the solve runs: outside
    ``[t0, t1]``, not finite, or not monotone in the direction from ``t0`` to ``t1``."""
    subs = jax.tree.leaves(saveat.subs, is_leaf=lambda x: isinstance(x, diffrax.SubSaveAt))
    for sub in subs:
        ts = getattr(sub, "ts", None)
        if ts is None or not is_concrete(ts):
            continue
        ts = np.asarray(ts).reshape(-1)
        if ts.size == 0:
            continue
        lo, hi = min(t0, t1), max(t0, t1)
        outside = ~((ts >= lo) & (ts <= hi))  # NaN counts as outside
        if outside.any():
            raise ValueError(
                f"saveat.ts must lie between t0={float(t0)!r} s and t1={float(t1)!r} s (in "
                f"the model's dtype {ts.dtype}), got {int(outside.sum())} time(s) outside, "
                f"e.g. {float(ts[outside][0])!r}"
            )
        steps = np.diff(ts) if t1 >= t0 else -np.diff(ts)
        if (steps < 0).any():
            order = "increasing" if t1 >= t0 else "decreasing (t1 < t0)"
            raise ValueError(f"saveat.ts must be {order}, got {ts.tolist()}")


#: The physical constants of a ``ShallowWater`` and the bound each must respect.
_SCALAR_PARAMETERS = (
    ("gravity", ">0"),
    ("coriolis", None),
    ("beta", None),
    ("density", ">0"),
    ("drag", ">=0"),
    ("viscosity", ">=0"),
)
#: Every physical parameter (array leaves, or ``None`` for a term left out).
_PARAMETERS = tuple(name for name, _ in _SCALAR_PARAMETERS) + ("bottom", "wind_stress")

#: ``solve_diffrax``'s default tolerances for a float32 model (float64: those of
#: [`physjax.solvers.integrate_diffrax`][], 1e-6 / 1e-8).
FLOAT32_RTOL, FLOAT32_ATOL = 1e-4, 1e-6

#: The keyword arguments ``solve_diffrax`` passes on to ``integrate_diffrax``.
_DIFFRAX_OPTIONS = frozenset(inspect.signature(integrate_diffrax).parameters) - {
    "rhs",
    "y0",
    "t0",
    "t1",
    "args",
}


def _raise_on_mesh(sol: diffrax.Solution, grid: Grid, mesh) -> diffrax.Solution:
    """diffrax's ``throw=True`` for a solution sharded over ``mesh``: its error (the message
    of ``sol.result``) raised inside ``shard_map`` on every device's block at once, as
    [`physjax.parallel.error_if`][] does, with every array of the solution threaded on it
    (as diffrax does; ``sol.ts`` and ``sol.ys`` are ``None`` for ``SaveAt(dense=True)``)."""
    arrays, static = eqx.partition(sol, eqx.is_array)
    arrays = place_on_mesh(arrays, grid, mesh)
    return eqx.combine(_raise_result_on_blocks(arrays, sol.result, grid, mesh), static)


@eqx.filter_jit
def _raise_result_on_blocks(arrays, result, grid: Grid, mesh):
    """``_raise_on_mesh``'s ``shard_map``, compiled once per solution layout, grid and mesh:
    called eagerly, a ``jax.shard_map`` of a new function compiled its body again at every
    solve (23 programs, 0.7 s for a 16² solve that itself took 0.03 s)."""
    spec = _specs(arrays, grid, mesh)
    failed = jnp.invert(diffrax.is_okay(result))
    return jax.shard_map(
        lambda block, result, pred: result.error_if(block, pred),
        mesh=mesh,
        in_specs=(spec, PartitionSpec(), PartitionSpec()),
        out_specs=spec,
        check_vma=False,
    )(arrays, result, failed)


class _BacksolveOnMesh(diffrax.BacksolveAdjoint):
    """``diffrax.BacksolveAdjoint`` for a solve on a mesh: each backward solve runs with
    ``throw=False`` and, when it should throw (the solve's ``throw``, or the adjoint's own
    ``throw=`` option), raises its failure (``max_steps`` reached) on every device's block at
    once, as ``_raise_on_mesh`` does for the forward solve, rather than by diffrax's check on
    device 0 alone."""

    grid: Grid = eqx.field(static=True)
    mesh: jax.sharding.Mesh = eqx.field(static=True)

    def __init__(self, adjoint: diffrax.BacksolveAdjoint, throw: bool, grid: Grid, mesh):
        self.kwargs = {"throw": throw, **adjoint.kwargs}
        self.grid, self.mesh = grid, mesh

    @property
    def _diffeqsolve(self):
        def diffeqsolve(*args, throw: bool = True, **kwargs):
            sol = diffrax.diffeqsolve(*args, throw=False, **kwargs)
            return _raise_on_mesh(sol, self.grid, self.mesh) if throw else sol

        return diffeqsolve


class _DiffraxRHS(eqx.Module):
    """The vector field of ``solve_diffrax``: the model comes in as diffrax's ``args``."""

    mesh: jax.sharding.Mesh | None = eqx.field(static=True)

    def __call__(self, y: ShallowWaterState, t, model: ShallowWater) -> ShallowWaterState:
        def body(grid, model, y, t):
            return _with_grid(model, grid)._rhs(y, t)

        return shard_map_fields(body, model.grid, self.mesh)(model, y, t)


def _check_field(name: str, f: Array, grid: Grid) -> None:
    if tuple(f.shape) != grid.shape:
        raise ValueError(f"{name} must have the grid shape (ny, nx)={grid.shape}, got {f.shape}")


def _win(a, origin, j0, j1, i0, i1):
    """Rows j0..j1-1, columns i0..i1-1 (local indices; the halo is -1 and n) of an array
    whose first element sits at local index ``origin``."""
    return a[j0 - origin[0] : j1 - origin[0], i0 - origin[1] : i1 - origin[1]]


def _pointwise_core() -> bool:
    """Whether tendencies recompute their intermediates at every point (``_core_pointwise``)
    rather than computing each once (``_core_shared``): on accelerators, where it moves a
    third fewer bytes per step (25% → 35% of the copy bandwidth at 4096² float32 on an
    H200, docs/benchmarks.md); not on the CPU, where it measured no faster and the strips
    were tuned with the shared form. Read when a step is traced."""
    return jax.default_backend() != "cpu"


def _check_counts(n_steps, save_every) -> None:
    for name, n in (("n_steps", n_steps), ("save_every", save_every)):
        if not is_concrete(n):
            raise ValueError(
                f"{name} must be a fixed positive integer, not a traced value: it sets the "
                f"length of the compiled loop; inside jax.jit pass it as a static argument "
                f"(static_argnums/static_argnames) or close over a Python int"
            )
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{name} must be a positive integer, got {n!r}")
    if n_steps % save_every:
        raise ValueError(f"n_steps={n_steps} must be a multiple of save_every={save_every}")


def _with_grid(model: ShallowWater, grid: Grid) -> ShallowWater:
    return eqx.tree_at(lambda m: m.grid, model, grid)


def _strip_plan(model: ShallowWater) -> tuple[int, int]:
    """Rows per strip (0 for the plain step) and steps per visit of the blocked step for
    this (local) grid."""
    g = model.grid
    if model.scheme != "ssprk3" or any(b > 1 for b in g.mesh_shape) or model.strip_rows == 0:
        return 0, 1
    if model.strip_rows is not None:
        m = model.strip_rows
        return m, model.strip_steps or min(AUTO_STRIP_STEPS, m // OVERLAP)
    if jax.default_backend() != "cpu":
        return 0, 1
    steps = model.strip_steps or AUTO_STRIP_STEPS
    m = auto_strip_rows(g, min_rows=OVERLAP * steps)
    return m, steps if m else 1


def _strip_rows(model: ShallowWater) -> int:
    """Rows per strip of the blocked step for this (local) grid, 0 for the plain step."""
    return _strip_plan(model)[0]


def _stepper(model: ShallowWater):
    """``step(y, t, dt)`` of the fixed-step scheme, with what it reads padded once, and
    ``None`` or ``(S, step_S)`` taking ``S`` steps at once (``advance``'s ``block``)."""
    m, steps = _strip_plan(model)
    if m:
        aux = strip_aux(model, steps)

        def step_S(y, ts, dt):
            return blocked_ssprk3_steps(model, y, ts, dt, aux, m)

        block = (steps, step_S) if steps > 1 else None
        return (lambda y, t, dt: blocked_ssprk3_step(model, y, t, dt, aux, m)), block
    bottom = model._padded_bottom()
    # f at the corners computed once, outside the loop, rather than left to XLA to hoist: with
    # the model compiled in as constants (closed over by a jax.jit), it hoisted f = f0 +
    # beta (y - y_mid) out of the nested loops of the checkpointed run into another fusion,
    # and a beta-plane advance differed from the plain loop's in the last bits (2e-12 m in h)
    f_corner = model._coriolis_at_corner_rows(model.grid.local_index(0, padded=True)[1:])
    return (lambda y, t, dt: model._step(y, t, dt, bottom, f_corner)), None


# step and rhs called eagerly, in a Python loop of the user's, ran op by op: 50 ms a step at
# 64² against 0.1 ms compiled. Compiled once per model structure and shapes; under an outer
# jit, grad or vmap they are traced inline as before.
@eqx.filter_jit
def _one_step(model, state, t, dt):
    return _stepper(model)[0](state, t, dt)


@eqx.filter_jit
def _tendencies(model, state, t):
    return model._rhs(state, t)


@eqx.filter_jit
def _advance(model, state, t0, dt, n_steps, mesh):
    def body(grid, model, state, t0, dt):
        model = _with_grid(model, grid)
        step, block = _stepper(model)
        return advance(step, state, t0, dt, n_steps, block)

    return shard_map_fields(body, model.grid, mesh)(model, state, t0, dt)


@eqx.filter_jit
def _run_frames(model, state, t0, dt, n_frames, save_every, mesh):
    def body(grid, model, state, t0, dt):
        model = _with_grid(model, grid)
        step, block = _stepper(model)
        return integrate(step, state, t0, dt, n_frames, save_every, block=block)

    return shard_map_fields(body, model.grid, mesh)(model, state, t0, dt)
