"""Built-in shallow-water cases, each named for ``--case``.

Every case is a function of the grid size and of physical parameters (SI units) with
defaults; [`make_case`][] validates the parameters and returns a [`Case`][]: the model, its
initial state and the run's default end time.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from typing import Any

import numpy as np

from ..._custom_types import is_concrete
from ...grids import CENTRE, X_FACE, Y_FACE, Grid
from ...grids._grid import spacing_out_of_range
from ._model import Boundary, ShallowWater, ShallowWaterState

DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class Case:
    """A ready-to-run problem.

    - `name`: the case's name, e.g. ``"zonal-jet"``.
    - `description`: one sentence.
    - `model`: the [`physjax.solvers.ShallowWater`][] model.
    - `state`: its initial [`physjax.solvers.ShallowWaterState`][].
    - `t_end`: default end time [s].
    - `parameters`: every parameter used, defaults filled in (recorded in output files).
    """

    name: str
    description: str
    model: ShallowWater
    state: ShallowWaterState
    t_end: float
    parameters: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class _CaseSpec:
    build: Callable[..., tuple[ShallowWater, ShallowWaterState]]
    description: str
    shape: tuple[int, int]
    defaults: dict[str, Any]
    # the end time when none is given, from the filled-in parameters (else defaults["t_end"])
    end_time: Callable[[dict[str, Any]], float] | None = None


def _is_real(value: Any) -> bool:
    """A real number: Python or NumPy integer or float, not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )


def _number_of(value: Any) -> Any:
    """The Python number held by a 0-d array that has a value; anything else unchanged."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "dtype") and is_concrete(value):
        return np.asarray(value).item()
    return value


def _positive(params: dict, *names: str) -> None:
    for name in names:
        value = params[name]
        if not (_is_real(value) and math.isfinite(value) and value > 0):
            raise ValueError(f"parameter {name} must be a finite number > 0, got {value!r}")


def _nonnegative(params: dict, *names: str) -> None:
    for name in names:
        value = params[name]
        if not (_is_real(value) and math.isfinite(value) and value >= 0):
            raise ValueError(f"parameter {name} must be a finite number >= 0, got {value!r}")


def _damping(p: dict) -> dict:
    """``drag`` and ``viscosity`` for the model, every case's parameters: 0 leaves the term
    out of the compiled step (as a model built without it), any other value puts it in."""
    _nonnegative(p, "drag", "viscosity")
    return {name: p[name] or None for name in ("drag", "viscosity")}


# ----------------------------------------------------------------- geostrophic adjustment
def _geostrophic_adjustment(grid: Grid, p: dict) -> tuple[ShallowWater, ShallowWaterState]:
    _positive(p, "mean_depth", "radius", "width", "gravity")
    # a step whose edge lies beyond the domain's corners covers every cell: the state is
    # uniform (mean_depth + step_height), with nothing to adjust
    reach = 0.5 * math.hypot(p["Lx"], p["Ly"])
    if p["radius"] >= reach:
        raise ValueError(
            f"parameter radius = {p['radius']:g} m: the step covers the whole "
            f"{p['Lx']:g} x {p['Ly']:g} m domain (its edge lies beyond the corners, "
            f"{reach:g} m from the centre), leaving a uniform state with nothing to adjust; "
            f"radius must be < {reach:g} m (or Lx, Ly larger)"
        )
    model = ShallowWater(grid, gravity=p["gravity"], coriolis=p["coriolis"], **_damping(p))
    y, x = grid.mesh_coordinates(CENTRE)
    xc, yc = grid.origin[1] + grid.extent[1] / 2, grid.origin[0] + grid.extent[0] / 2
    r = np.hypot(x - xc, y - yc)
    h = p["mean_depth"] + p["step_height"] * 0.5 * (1 - np.tanh((r - p["radius"]) / p["width"]))
    if np.ptp(h) <= 1e-12 * np.max(np.abs(h)):
        # no step, or a grid whose cell centres all sample it alike (one cell, or 2 x 2
        # around the centre): a resting, uniform layer with nothing to adjust
        if p["step_height"] == 0:
            raise ValueError(
                "parameter step_height = 0: no step, leaving a uniform state with nothing to "
                "adjust; give a step_height other than 0"
            )
        ny, nx = grid.shape
        raise ValueError(
            f"grid size nx={nx}, ny={ny} is too coarse for the geostrophic-adjustment step "
            f"(radius {p['radius']:g} m, width {p['width']:g} m): every cell centre samples "
            f"it alike, leaving a uniform h = {h.flat[0]:g} m with nothing to adjust; use more "
            f"cells (the default is 128 x 128)"
        )
    return model, model.initial_state(h)


# -------------------------------------------------------------- balanced zonal jets
def balanced_jet_thickness(
    grid: Grid,
    u_jet: np.ndarray,
    *,
    mean_depth: float,
    gravity: float,
    coriolis: float,
    beta: float,
) -> np.ndarray:
    """Thickness profile h(y) that holds a zonal flow u(y) in *discrete* geostrophic balance.

    With v = 0 and fields independent of x, the discrete v-equation of
    [`physjax.solvers.ShallowWater`][] at each interior y-face ``j`` reads
    ``q_j (U_j + U_{j-1})/2 + (B_j − B_{j−1})/dy = 0``; it is solved for ``h_j`` by Newton's
    method, marching north from the southern row (float64), and the southern value is
    adjusted until the mean is ``mean_depth`` (to 1e-12 of it). A jet that no thickness of
    that mean holds in balance (each row's solve must converge) raises a ``ValueError``.
    """
    # Overflow on the way (an absurd coriolis or jet speed) ends in the ValueError below,
    # not in NumPy's warnings.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _balanced_jet_thickness(
            grid,
            u_jet,
            mean_depth=mean_depth,
            gravity=gravity,
            coriolis=coriolis,
            beta=beta,
        )


def _too_strong(coriolis: float) -> str:
    if coriolis == 0:
        return "the jet is too strong for the depth; weaken the jet or deepen the layer"
    return (
        f"the jet is too strong for the depth at f = {coriolis:g} s^-1; weaken the jet, "
        f"deepen the layer or give a smaller |coriolis|"
    )


def _balanced_jet_thickness(grid, u_jet, *, mean_depth, gravity, coriolis, beta):
    ny = grid.shape[0]
    dy = grid.dy
    y_face = grid.coordinates("y", "face")
    f = coriolis + beta * (y_face - (grid.origin[0] + 0.5 * grid.extent[0]))
    u = np.asarray(u_jet, dtype=np.float64)

    def march(h0: float) -> np.ndarray:
        h = np.empty(ny)
        h[0] = h0
        for j in range(1, ny):
            zeta = -(u[j] - u[j - 1]) / dy
            a = f[j] + zeta
            hp, up, uj = h[j - 1], u[j - 1], u[j]
            dk = 0.5 * (uj**2 - up**2)

            def F(hj, a=a, uj=uj, hp=hp, up=up, dk=dk):
                return a * (hj * uj + hp * up) / (hj + hp) + (gravity * (hj - hp) + dk) / dy

            hj = hp
            for _ in range(50):
                eps = 1e-7 * max(abs(hj), 1.0)
                dF = (F(hj + eps) - F(hj - eps)) / (2 * eps)
                step = F(hj) / dF
                hj -= step
                if abs(step) <= 1e-15 * abs(hj):
                    break
            if not abs(step) <= 1e-9 * max(abs(hj), 1.0):
                raise ValueError(
                    f"no layer thickness of mean depth {mean_depth:g} m holds this jet in "
                    f"discrete geostrophic balance (the balance of y-face row {j} has no "
                    f"solution near the row south of it): {_too_strong(coriolis)}"
                )
            h[j] = hj
        return h

    # start from the balance with the two rows' thickness weighted alike (nearly the
    # discrete one), then move the southern value until the mean is mean_depth
    a = f[1:] - np.diff(u) / dy
    drop = (dy * a * (u[1:] + u[:-1]) / 2 + 0.5 * np.diff(u**2)) / gravity
    h0 = mean_depth + np.mean(np.concatenate(([0.0], np.cumsum(drop))))
    for _ in range(50):
        h = march(h0)
        miss = h.mean() - mean_depth
        if abs(miss) <= 1e-12 * mean_depth:
            return np.broadcast_to(h[:, None], grid.shape).copy()
        h0 -= miss
    raise ValueError(
        f"no layer thickness of mean depth {mean_depth:g} m holds this jet in discrete "
        f"geostrophic balance (the mean could not be brought to {mean_depth:g} m, missing "
        f"by {miss:.3g} m): {_too_strong(coriolis)}"
    )


def _balanced_jet(grid: Grid, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """A Bickley jet u = U sech²(y/L) (u at the y of cell centres) and the thickness that
    balances it discretely."""
    _positive(p, "mean_depth", "jet_width", "gravity")
    y = grid.coordinates("y", "centre") - (grid.origin[0] + 0.5 * grid.extent[0])
    with np.errstate(over="ignore"):  # cosh overflows far from a narrow jet, where u = 0
        u1 = p["jet_speed"] / np.cosh(y / p["jet_width"]) ** 2
    h = balanced_jet_thickness(
        grid,
        u1,
        mean_depth=p["mean_depth"],
        gravity=p["gravity"],
        coriolis=p["coriolis"],
        beta=p["beta"],
    )
    return np.broadcast_to(u1[:, None], grid.shape), h


def _zonal_jet(grid: Grid, p: dict) -> tuple[ShallowWater, ShallowWaterState]:
    damping = _damping(p)
    u, h = _balanced_jet(grid, p)
    model = ShallowWater(
        grid, gravity=p["gravity"], coriolis=p["coriolis"], beta=p["beta"], **damping
    )
    return model, model.initial_state(h, u)


def _barotropic_instability(grid: Grid, p: dict) -> tuple[ShallowWater, ShallowWaterState]:
    _nonnegative(p, "perturbation")
    damping = _damping(p)
    u, h = _balanced_jet(grid, p)
    # A small height bump along the jet axis, made of zonal modes 3-6 with fixed phases, as a
    # fraction of the jet's height scale: the balanced height range, or U²/g where that is
    # larger (a jet with little or no rotation, whose balanced h is nearly or exactly flat).
    y, x = grid.mesh_coordinates(CENTRE)
    yc = y - (grid.origin[0] + 0.5 * grid.extent[0])
    kx = 2 * np.pi / grid.extent[1]
    wave = sum(np.cos(m * kx * x + 0.7 * m) for m in (3, 4, 5, 6)) / 4
    dh = max(np.ptp(h), p["jet_speed"] ** 2 / p["gravity"])
    h = h + p["perturbation"] * dh * wave * np.exp(-((yc / p["jet_width"]) ** 2))
    model = ShallowWater(
        grid,
        gravity=p["gravity"],
        coriolis=p["coriolis"],
        beta=p["beta"],
        **damping,
    )
    return model, model.initial_state(h, u)


# ---------------------------------------------------------------------- gravity wave
def _check_wave_resolved(grid: Grid, mode_x: int, mode_y: int) -> None:
    """The wave needs a non-zero wavenumber on the grid: mode_x a multiple of nx together with
    mode_y a multiple of ny alias to a uniform state, which has no wave to normalise."""
    ny, nx = grid.shape
    if mode_x % nx or mode_y % ny:
        return
    if mode_x == 0 and mode_y == 0:
        raise ValueError(
            "the gravity-wave mode (mode_x=0, mode_y=0) is a uniform state, not a wave: give a "
            "non-zero mode_x or mode_y"
        )
    hints = []
    for name, m, n_now in (("nx", mode_x, nx), ("ny", mode_y, ny)):
        # the smallest grid size on which mode m is not aliased to zero, when it is larger
        # than the grid's (a grid too small for the mode)
        n = next((n for n in range(2, abs(m) + 2) if m % n), None)
        if n is not None and n > n_now:
            hints.append(f"{name} >= {n}")
    if hints:
        raise ValueError(
            f"grid size nx={nx}, ny={ny} is too small for the gravity-wave mode (mode_x="
            f"{mode_x}, mode_y={mode_y}): both wavenumbers alias to zero; it needs "
            + " or ".join(hints)
        )
    raise ValueError(
        f"the gravity-wave mode (mode_x={mode_x}, mode_y={mode_y}) aliases to a uniform state on "
        f"this nx={nx}, ny={ny} grid: mode_x is a multiple of nx and mode_y a multiple of ny, so "
        f"both wavenumbers are zero on the grid; choose a mode_x that is not a multiple of nx "
        f"or a mode_y that is not a multiple of ny"
    )


def gravity_wave_mode(grid: Grid, *, mean_depth, gravity, coriolis, mode_x, mode_y):
    """Wavenumbers, frequency and complex amplitudes (h, u, v) per unit height amplitude of
    the discrete C-grid Poincaré wave travelling towards +k on ``grid`` (linearised, f-plane).

    ω² = f² cos²(kΔx/2) cos²(lΔy/2) + 4gH [sin²(kΔx/2)/Δx² + sin²(lΔy/2)/Δy²].
    """
    k = 2 * np.pi * mode_x / grid.extent[1]
    l = 2 * np.pi * mode_y / grid.extent[0]
    sx, sy = 2 * np.sin(k * grid.dx / 2) / grid.dx, 2 * np.sin(l * grid.dy / 2) / grid.dy
    fc = coriolis * np.cos(k * grid.dx / 2) * np.cos(l * grid.dy / 2)
    H, g = mean_depth, gravity
    # d/dt (h, u, v) = M (h, u, v), each amplitude referred to its own grid points.
    M = np.array([[0, -1j * H * sx, -1j * H * sy], [-1j * g * sx, 0, fc], [-1j * g * sy, -fc, 0]])
    lam, vec = np.linalg.eig(M)
    idx = int(np.argmin(lam.imag))  # λ = −iω with ω > 0: e^{i(kx + ly − ωt)}
    a = vec[:, idx] / vec[0, idx]
    omega = -lam[idx].imag
    return k, l, omega, a


def _gravity_wave(grid: Grid, p: dict) -> tuple[ShallowWater, ShallowWaterState]:
    _positive(p, "mean_depth", "gravity")
    _check_wave_resolved(grid, p["mode_x"], p["mode_y"])
    model = ShallowWater(grid, gravity=p["gravity"], coriolis=p["coriolis"], **_damping(p))
    k, l, _, a = gravity_wave_mode(
        grid,
        mean_depth=p["mean_depth"],
        gravity=p["gravity"],
        coriolis=p["coriolis"],
        mode_x=p["mode_x"],
        mode_y=p["mode_y"],
    )
    fields = []
    for amp, loc in zip(a, (CENTRE, X_FACE, Y_FACE)):
        y, x = grid.mesh_coordinates(loc)
        fields.append(np.real(p["amplitude"] * amp * np.exp(1j * (k * x + l * y))))
    h, u, v = fields
    return model, model.initial_state(p["mean_depth"] + h, u, v)


# ------------------------------------------------------------------------- wind gyre
def _wind_gyre(grid: Grid, p: dict) -> tuple[ShallowWater, ShallowWaterState]:
    _positive(p, "mean_depth", "gravity", "density")
    damping = _damping(p)
    y, _ = grid.mesh_coordinates(X_FACE)
    tau_x = -p["wind_stress"] * np.cos(np.pi * (y - grid.origin[0]) / grid.extent[0])
    model = ShallowWater(
        grid,
        gravity=p["gravity"],
        coriolis=p["coriolis"],
        beta=p["beta"],
        **damping,
        density=p["density"],
        wind_stress=(tau_x, np.zeros(grid.shape)),
        boundary=p["boundary"],
    )
    return model, model.initial_state(np.full(grid.shape, p["mean_depth"]))


#: Parameters of every case but the reduced-gravity ``wind-gyre`` (which sets its own);
#: ``drag`` [1/s] and ``viscosity`` [m²/s] at 0 leave those terms out of the step.
_COMMON = {"gravity": 9.81, "coriolis": 1e-4, "drag": 0.0, "viscosity": 0.0}


def _ten_inertial_periods(p: dict[str, Any]) -> float:
    """10 inertial periods, 20π/|f|; the nominal default when f = 0 (no inertial period),
    or so close to 0 (|f| < 3.5e-307) that 20π/|f| overflows."""
    f = p["coriolis"]
    if _is_real(f) and math.isfinite(f) and f != 0 and math.isfinite(20 * math.pi / abs(f)):
        return 20 * math.pi / abs(f)
    return 20 * math.pi / _COMMON["coriolis"]


CASES: dict[str, _CaseSpec] = {
    "geostrophic-adjustment": _CaseSpec(
        _geostrophic_adjustment,
        "a circular height step on a doubly periodic f-plane adjusts to a geostrophic vortex, "
        "radiating inertia-gravity waves",
        (128, 128),
        {
            **_COMMON,
            "Lx": 2000e3,
            "Ly": 2000e3,
            "mean_depth": 100.0,
            "step_height": 10.0,
            "radius": 250e3,
            "width": 30e3,
            "t_end": 2 * DAY,
        },
    ),
    "zonal-jet": _CaseSpec(
        _zonal_jet,
        "a Bickley jet in a periodic channel held in discrete geostrophic balance: it stays "
        "steady to round-off",
        (64, 128),
        {
            **_COMMON,
            "beta": 0.0,
            "Lx": 4000e3,
            "Ly": 2000e3,
            "mean_depth": 1000.0,
            "jet_speed": 5.0,
            "jet_width": 300e3,
            # nominal: 10 inertial periods at the default f; make_case uses 20π/|f| of the
            # coriolis actually given (end_time below)
            "t_end": 20 * np.pi / _COMMON["coriolis"],
        },
        end_time=_ten_inertial_periods,
    ),
    "barotropic-instability": _CaseSpec(
        _barotropic_instability,
        "an unstable Bickley jet in a periodic beta-plane channel rolls up into eddies",
        (128, 256),
        {
            **_COMMON,
            "beta": 1.6e-11,
            "Lx": 6000e3,
            "Ly": 3000e3,
            "mean_depth": 1000.0,
            "jet_speed": 20.0,
            "jet_width": 250e3,
            "perturbation": 0.02,
            "viscosity": 2000.0,
            # the fastest modes grow at ~0.9/day; the meander saturates and rolls up at
            # days 9-11 (docs/shallow_water.md, "What the cases show")
            "t_end": 12 * DAY,
        },
    ),
    "gravity-wave": _CaseSpec(
        _gravity_wave,
        "a small-amplitude inertia-gravity (Poincaré) wave, the exact discrete eigenmode, "
        "on a doubly periodic f-plane",
        (64, 64),
        {
            **_COMMON,
            "Lx": 1000e3,
            "Ly": 1000e3,
            "mean_depth": 100.0,
            "amplitude": 0.01,
            "mode_x": 2,
            "mode_y": 1,
            "t_end": DAY,
        },
    ),
    "wind-gyre": _CaseSpec(
        _wind_gyre,
        "a closed reduced-gravity basin on a beta-plane spun up by a zonal wind stress: a "
        "subtropical gyre with a western boundary current",
        (128, 128),
        # Ld = sqrt(g' H)/f = 100 km: long Rossby waves (beta Ld² = 0.2 m/s) cross the basin
        # in 115-165 days, so the Sverdrup interior is set up within the year; Munk scale
        # (nu/beta)^(1/3) = 50 km, three cells at the default 128²; drag spins down the
        # basin modes in 23 days (docs/shallow_water.md, "What the cases show").
        {
            "gravity": 0.2,
            "coriolis": 1e-4,
            "beta": 2e-11,
            "Lx": 2000e3,
            "Ly": 2000e3,
            "mean_depth": 500.0,
            "wind_stress": 0.1,
            "density": 1025.0,
            "drag": 5e-7,
            "viscosity": 2500.0,
            "boundary": "free-slip",
            "t_end": 360 * DAY,
        },
    ),
}

#: Whether each case's axes are ``(periodic_y, periodic_x)``.
_PERIODIC = {
    "geostrophic-adjustment": (True, True),
    "zonal-jet": (False, True),
    "barotropic-instability": (False, True),
    "gravity-wave": (True, True),
    "wind-gyre": (False, False),
}


#: The values a parameter that names a choice may take.
_CHOICES = {"boundary": typing.get_args(Boundary)}


def _check_type(name: str, value: Any, default: Any) -> None:
    """A parameter takes the type of its default: a number (int or float, not bool), an
    integer (not bool) or a string, and one that names a choice (``boundary``) one of its
    values."""
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if isinstance(default, str):
        ok, kind = isinstance(value, str), "a string"
    elif isinstance(default, (int, np.integer)) and not isinstance(default, bool):
        ok, kind = integer, "an integer"
    else:
        ok, kind = integer or isinstance(value, (float, np.floating)), "a number"
    if hasattr(value, "dtype") and not is_concrete(value):
        raise TypeError(
            f"parameter {name} must be a fixed number, not a traced value (make_case "
            f"builds the case with NumPy before any transformation): to differentiate or "
            f"vmap over a physical constant, build the case outside and set the constant on "
            f"its model inside, e.g. eqx.tree_at(lambda m: m.drag, case.model, r, "
            f"is_leaf=lambda x: x is None) (is_leaf for a term the case left out, as it "
            f"does drag and viscosity at 0; docs/shallow_water.md)"
        )
    if not ok:
        raise TypeError(
            f"parameter {name} must be {kind} (default {default!r}), got {value!r} "
            f"({type(value).__name__})"
        )
    big = isinstance(value, int) and abs(value) > np.iinfo(np.int64).max
    if big and isinstance(default, int):  # the output file records it as a 64-bit integer
        raise ValueError(
            f"parameter {name} must be an integer between -(2**63 - 1) and 2**63 - 1, got "
            f"one of {value.bit_length()} bits"
        )
    if big:
        try:
            float(value)
        except OverflowError:
            raise ValueError(
                f"parameter {name} must be a finite number, got an integer of "
                f"{value.bit_length()} bits, beyond the range of a float"
            ) from None
    choices = _CHOICES.get(name)
    if choices is not None and value not in choices:
        names = " or ".join(", ".join(map(repr, choices)).rsplit(", ", 1))
        raise ValueError(f"parameter {name} must be {names}, got {value!r}")


def make_case(
    name: str = "geostrophic-adjustment",
    *,
    nx: int | None = None,
    ny: int | None = None,
    precision: str = "float32",
    **parameters: Any,
) -> Case:
    """Build the named case on an ``ny × nx`` grid.

    **Arguments:**

    - `name`: one of ``CASES``: ``geostrophic-adjustment`` (default), ``zonal-jet``,
      ``barotropic-instability``, ``gravity-wave``, ``wind-gyre``.
    - `nx`, `ny`: cells per axis (defaults per case).
    - `precision`: ``"float32"`` or ``"float64"`` (float64 needs ``jax_enable_x64``).
    - `parameters`: overrides of the case's physical parameters (see ``CASES[name].defaults``),
      e.g. ``mean_depth=500.0``; ``Lx``/``Ly`` set the domain [m] and ``t_end`` the default
      end time [s] (for ``zonal-jet`` it defaults to 10 inertial periods, 20π/|coriolis|).
    """
    if name not in CASES:
        raise ValueError(f"unknown case {name!r}: choose one of {', '.join(CASES)}")
    spec = CASES[name]
    unknown = sorted(set(parameters) - set(spec.defaults))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for case {name!r}; allowed: "
            f"{', '.join(sorted(spec.defaults))}"
        )
    # 0-d arrays with values (np.array(50.0), jnp.array(9.81)) are numbers, as elsewhere
    parameters = {key: _number_of(value) for key, value in parameters.items()}
    for key, value in parameters.items():
        _check_type(key, value, spec.defaults[key])
        if isinstance(spec.defaults[key], float):  # 0 for a float parameter is 0.0, and kept so
            parameters[key] = float(value)
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision must be 'float32' or 'float64', got {precision!r}")
    if precision == "float64":
        import jax

        if not jax.config.jax_enable_x64:
            raise ValueError(
                "precision='float64' needs jax_enable_x64: call "
                "jax.config.update('jax_enable_x64', True) first"
            )
    p = {**spec.defaults, **parameters}
    if spec.end_time is not None and "t_end" not in parameters:
        p["t_end"] = spec.end_time(p)
    for key, value in p.items():
        if _is_real(value) and not math.isfinite(value):
            raise ValueError(f"parameter {key} must be a finite number, got {value!r}")
    if "mean_depth" in p and not (_is_real(p["mean_depth"]) and p["mean_depth"] > 0):
        raise ValueError(f"parameter mean_depth must be > 0 (metres), got {p['mean_depth']!r}")
    ny = spec.shape[0] if ny is None else ny
    nx = spec.shape[1] if nx is None else nx
    for axis, n in (("nx", nx), ("ny", ny)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"grid size {axis} must be a positive integer, got {n!r}")
    _positive(p, "Lx", "Ly", "t_end")
    for key, n in (("Lx", nx), ("Ly", ny)):
        problem = spacing_out_of_range(p[key], n, precision)
        if problem:
            raise ValueError(f"parameter {key} = {p[key]:g} m {problem}")
    grid = Grid((ny, nx), (p["Ly"], p["Lx"]), periodic=_PERIODIC[name], dtype=precision)
    try:
        model, state = spec.build(grid, p)
    except ValueError as e:
        if not parameters or any(key in str(e) for key in parameters):
            raise  # nothing changed, or the message names what did
        given = ", ".join(f"{k}={v!r}" for k, v in parameters.items())
        raise ValueError(f"case {name!r} with {given} gives no valid initial state: {e}") from None
    params = {"nx": int(nx), "ny": int(ny), "precision": precision, **p}
    return Case(name, spec.description, model, state, float(p["t_end"]), params)
