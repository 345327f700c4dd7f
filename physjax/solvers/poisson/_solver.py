"""The Poisson solver: spectral, multigrid and multigrid-preconditioned CG."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec
from jaxtyping import Array, Float

from ..._custom_types import is_concrete
from ...grids import Grid
from ...grids._grid import require_enabled_dtype
from ...parallel import decompose, error_if, field_spec, place_on_mesh
from . import _multigrid as mg
from ._operator import (
    apply_operator,
    face_coefficients,
    fold_boundary_values,
    is_singular,
    normalise_bc,
    operator_diagonal,
    parity_of,
)
from ._spectral import spectral_solve_local, spectral_solve_sharded

Method = Literal["auto", "spectral", "multigrid", "cg"]
METHODS = ("spectral", "multigrid", "cg")
Field = Float[Array, "*shape"]


class PoissonSolution(eqx.Module):
    """Result of [`physjax.solvers.poisson.PoissonSolver.solve`][].

    - `u`: the solution, the grid's shape.
    - `residual_norm`: ``‖f - A u‖₂ / ‖f‖₂`` of the homogeneous problem (after folding
      boundary values into ``f``); 0 when ``f = 0``.
    - `iterations`: V-cycles (``multigrid``) or CG iterations (``cg``); 0 for ``spectral``;
      an int32 scalar.
    - `converged`: whether the tolerance was met, with a finite residual (for ``spectral``
      false only when the result is not finite, NaN or Inf in ``f``, or no better than
      ``u = 0``: a solution below the dtype's smallest normal number, flushed to zero).
    """

    u: Field
    residual_norm: Float[Array, ""]
    iterations: Array
    converged: Array


def _internal_grid(grid: Grid) -> Grid:
    """The same geometry with a halo of 1 (what the solvers use) and no decomposition."""
    return Grid(
        grid.shape, grid.extent, grid.periodic, grid.origin, grid.dtype, 1, _spacing=grid.spacing
    )


class PoissonSolver(eqx.Module):
    r"""Solver for the elliptic problem ∇·(a∇u) = f (``a = 1``: ∇²u = f) on cell centres,
    or, with a Helmholtz term, ∇·(a∇u) - c u = f (``shift=c``).

    The discrete operator is the conservative second-order stencil (five points in 2-D,
    seven in 3-D) with walls half a cell beyond the first and last centres:

    $$(A u)_i = \sum_{axes} \frac{a_{i+1/2}(u_{i+1} - u_i) - a_{i-1/2}(u_i - u_{i-1})}{h^2},$$

    with face coefficients the mean of the two adjacent cells. Build once, call every step:
    the boundary conditions, the eigenvalue layout, the multigrid hierarchy and, for
    constant coefficients, the coarsest-level inverse are prepared here.

    **Arguments:**

    - `grid`: the [`physjax.grids.Grid`][] (2-D ``(y, x)`` or 3-D ``(z, y, x)``), undecomposed.
    - `bc`: boundary condition per axis: ``"periodic"``, ``"dirichlet"`` or ``"neumann"``,
      given as one string (applied to every walled axis), a sequence in grid axis order,
      or a mapping such as ``{"x": "periodic", "y": "neumann"}``. Periodic grid axes must
      be periodic. Default: periodic axes periodic, walled axes Dirichlet.
    - `method`: ``"spectral"`` (exact, constant coefficient only), ``"multigrid"``
      (stand-alone cycles), ``"cg"`` (conjugate gradients preconditioned by one multigrid
      cycle) or ``"auto"`` (default: spectral, or cg when a coefficient or a shift field
      is given, or when ``mesh`` cannot split the grid for the spectral method — its slab
      transposes need the first and last grid sizes divisible by the number of devices).
    - `coefficient`: cell-centred ``a > 0`` of the grid's shape, or one number (possibly
      traced) for every cell (multigrid and cg only).
    - `shift`: ``c > 0`` of the Helmholtz (screened Poisson) term: solve
      ∇·(a∇u) - c u = f, as implicit free-surface and implicit (IMEX) diffusion steps need
      (e.g. ``c = 1/(ν Δt)``). A scalar (a Python number or a 0-d array, possibly traced)
      for every method, or a cell-centred field of the grid's shape for ``multigrid`` and
      ``cg`` (``"auto"`` then picks cg). The operator is then regular whatever the
      boundary conditions: no compatibility condition on ``f``, and the zero mode is
      solved (no zero-mean gauge; ``compatibility`` has no effect). Default ``None``: no
      Helmholtz term.
    - `mesh`: a device mesh from [`physjax.parallel.make_mesh`][] to run under
      ``shard_map`` (default: one device).
    - `rtol`, `atol`: stop when ``‖f - A u‖₂ ≤ max(rtol ‖f‖₂, atol)`` (iterative methods;
      default ``rtol`` 1e-10 in float64 and 1e-5 in float32), or when an iteration
      changes ``u`` by less than 10 ulps; converged when the residual is within
      ``max(rtol ‖f‖₂, atol) + eps ‖|A| |u|‖``, the residual that rounding ``u`` leaves (in
      float32 above ``rtol`` on most grids: docs/poisson.md).
    - `max_iterations`: cycles or CG iterations before giving up (default 100).
    - `cycle`: ``"V"`` (default) or ``"F"``.
    - `smoothing`: red–black Gauss–Seidel sweeps ``(before, after)`` the coarse correction
      (default ``(2, 2)``); equal counts for ``"cg"``, whose preconditioner must be symmetric.
    - `max_coarse`: most cells on the coarsest level, solved by a dense inverse (default
      1024). Halving stops at 256 cells or at ``max_coarse``, whichever is smaller; grids
      that cannot be halved down to ``max_coarse`` cells are rejected.
    - `compatibility`: for problems without Dirichlet axes (periodic/Neumann), ``"check"``
      (default) raises when the mean of ``f`` is not zero to round-off; ``"project"``
      subtracts the mean of ``f`` first (solving ∇·(a∇u) = f - ⟨f⟩).
    - `laplacian`: ``"discrete"`` (default): solve the second-order stencil exactly;
      ``"spectral"`` (``method="spectral"`` only): use the exact eigenvalues ``-κ²`` of the
      continuous Laplacian on the same Fourier/sine/cosine modes, which converges
      exponentially for smooth solutions (periodic, or with a smooth even/odd extension).
      Residuals reported against the stencil are then O(h²), not round-off. Homogeneous
      walls only: ``boundary_values`` are refused (they are folded for the stencil).
    - `throw`: raise (through ``eqx.error_if``) when an iterative solve does not converge
      (default ``True``), a solve that ``jax.grad``/``jax.jvp`` add for a derivative
      included; with ``False`` check ``PoissonSolution.converged`` (which those solves do
      not report).

    The solution of a problem without Dirichlet axes (and without `shift`) is fixed by
    zero mean.

    References: Schumann & Sweet, J. Comput. Phys. 20 (1976) 171–182,
    doi:10.1016/0021-9991(76)90062-3 (fast transforms for staggered grids); Trottenberg,
    Oosterlee & Schüller, *Multigrid* (2001).
    """

    grid: Grid
    bc: tuple[str, ...] = eqx.field(static=True)
    method: str = eqx.field(static=True)
    mesh: Mesh | None = eqx.field(static=True)
    coefficient: Field | None
    shift: Array | None
    rtol: float = eqx.field(static=True)
    atol: float = eqx.field(static=True)
    max_iterations: int = eqx.field(static=True)
    cycle: str = eqx.field(static=True)
    smoothing: tuple[int, int] = eqx.field(static=True)
    compatibility: str = eqx.field(static=True)
    laplacian: str = eqx.field(static=True)
    throw: bool = eqx.field(static=True)
    levels: tuple | None = eqx.field(static=True)
    coarse_inverse: Array | None
    coarse_shift: Array | None

    def __init__(
        self,
        grid: Grid,
        bc: Any = None,
        method: Method = "auto",
        *,
        coefficient: Any = None,
        shift: Any = None,
        mesh: Mesh | None = None,
        rtol: float | None = None,
        atol: float = 0.0,
        max_iterations: int = 100,
        cycle: str = "V",
        smoothing: tuple[int, int] = (2, 2),
        max_coarse: int = 1024,
        compatibility: str = "check",
        laplacian: str = "discrete",
        throw: bool = True,
    ):
        if not isinstance(grid, Grid):
            raise ValueError(f"grid must be a physjax.grids.Grid, got {type(grid).__name__}")
        if grid.is_sharded:
            raise ValueError("grid must be undecomposed; pass the device layout as mesh=")
        if mesh is not None and not isinstance(mesh, jax.sharding.Mesh):
            raise TypeError(
                f"mesh must be a jax.sharding.Mesh (from physjax.parallel.make_mesh) or None, "
                f"got {mesh!r} ({type(mesh).__name__})"
            )
        require_enabled_dtype(grid)
        self.bc = normalise_bc(bc, grid)
        # what keeps the spectral method off this mesh, if anything
        spectral_refusal = _spectral_mesh_refusal(grid, mesh)
        auto_off_spectral = None  # why "auto" did not take spectral on this mesh
        if method == "auto":
            field_shift = shift is not None and np.ndim(shift) > 0
            if laplacian == "spectral":
                # only the spectral method has it: refused below, if at all, for the reason
                # that keeps it from this problem (a coefficient, the mesh), not for a method
                # that was not asked for
                method = "spectral"
            elif coefficient is not None or field_shift:
                method = "cg"
            elif spectral_refusal is not None:
                # the slab transposes cannot split this grid over the mesh: the iterative
                # solve takes any grid the layout divides
                method, auto_off_spectral = "cg", spectral_refusal
            else:
                method = "spectral"
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS} or 'auto', got {method!r}")
        if compatibility not in ("check", "project"):
            raise ValueError(f"compatibility must be 'check' or 'project', got {compatibility!r}")
        if laplacian not in ("discrete", "spectral"):
            raise ValueError(f"laplacian must be 'discrete' or 'spectral', got {laplacian!r}")
        if laplacian == "spectral" and method != "spectral":
            raise ValueError(
                f"laplacian='spectral' (exact eigenvalues) needs method='spectral', got {method!r}"
            )
        if not isinstance(throw, (bool, np.bool_)):  # "no" and 0.0 were taken by truth value
            raise TypeError(f"throw must be True or False, got {throw!r}")
        if cycle not in ("V", "F"):
            raise ValueError(f"cycle must be 'V' or 'F', got {cycle!r}")
        if (
            not isinstance(max_iterations, (int, np.integer))
            or isinstance(max_iterations, bool)
            or max_iterations < 1
        ):
            raise ValueError(f"max_iterations must be a positive integer, got {max_iterations!r}")
        given_smoothing = smoothing
        try:
            if not all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in smoothing
            ):  # 1.5 sweeps was taken as 1
                raise TypeError
            smoothing = tuple(int(s) for s in smoothing)
        except TypeError:
            smoothing = (-1,)  # reported below
        if len(smoothing) != 2 or min(smoothing) < 0 or sum(smoothing) < 1:
            raise ValueError(
                f"smoothing must be two integer sweep counts (before, after), ≥ 0 and not "
                f"both 0, got {given_smoothing!r}"
            )
        if method == "cg" and smoothing[0] != smoothing[1]:
            raise ValueError(
                f"smoothing={smoothing}: method='cg' needs a symmetric preconditioner, as many "
                "sweeps after the coarse correction as before, e.g. (2, 2)"
            )
        if (
            not isinstance(max_coarse, (int, np.integer))
            or isinstance(max_coarse, bool)
            or max_coarse < 1
        ):
            raise ValueError(f"max_coarse must be a positive integer, got {max_coarse!r}")
        if rtol is None:
            rtol = 1e-10 if grid.dtype == "float64" else 1e-5
        for name, value in (("rtol", rtol), ("atol", atol)):
            # static settings of the solve (they pick the stopping rule), not traced values
            if isinstance(value, np.ndarray) and value.ndim == 0:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise ValueError(
                    f"{name} must be a Python or NumPy number (a fixed setting of the solver, "
                    f"not an array or a traced value), got {value!r}"
                )
            if not np.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
            if name == "rtol":
                rtol = value
            else:
                atol = value
        if not (0 <= rtol < 1) or atol < 0 or rtol == atol == 0:
            raise ValueError(f"need 0 ≤ rtol < 1 and atol ≥ 0, not both 0; got {rtol}, {atol}")
        self.grid = grid
        # plain str (as bc): a NumPy string in a static field made equinox warn "A JAX
        # array is being set as static!"
        self.method = str(method)
        self.mesh = mesh
        self.rtol = float(rtol)
        self.atol = float(atol)
        self.max_iterations = int(max_iterations)
        self.cycle = str(cycle)
        self.smoothing = smoothing
        self.compatibility = str(compatibility)
        self.laplacian = str(laplacian)
        self.throw = bool(throw)

        self.coefficient = _check_coefficient(coefficient, grid, method, mesh)
        self.shift = _check_shift(shift, grid, method, mesh)

        local = _internal_grid(grid)
        if mesh is not None and mesh.size > 1:
            local = decompose(local, mesh)
            if method == "spectral" and spectral_refusal is not None:
                other = "laplacian='discrete' and " if laplacian == "spectral" else ""
                raise ValueError(
                    f"{spectral_refusal}; use {other}method='multigrid' or 'cg', which take "
                    f"any grid the layout divides, or fewer devices"
                )
        self.levels = None
        self.coarse_inverse = None
        self.coarse_shift = None
        if method != "spectral":
            try:
                self._prepare_hierarchy(local, grid, coefficient, max_coarse)
            except ValueError as err:
                if auto_off_spectral is None:
                    raise
                raise ValueError(
                    f"method='auto' found no method for grid.shape={grid.shape} on "
                    f"{mesh.size} devices. cg (picked because {auto_off_spectral}): {err}. On this "
                    f"mesh that is no way out: use fewer devices, or sizes that both allow"
                ) from None

    def _prepare_hierarchy(self, local: Grid, grid: Grid, coefficient, max_coarse: int):
        """The multigrid hierarchy of ``local`` (and the coarsest-level inverse, when it
        does not depend on the solve's data), or a ``ValueError`` saying why there is none."""
        levels = mg.build_hierarchy(local, max_coarse)
        spacing = grid.spacing
        stop, line = (None, None) if levels else mg.coarsening_stop(local, max_coarse)
        if levels is None and line is not None:
            names = grid.axis_names
            odd = [
                f"n{names[a]}={n}"
                for a, n in enumerate(stop.shape)
                if a != line and (n % 2 or n < 4)
            ]
            raise ValueError(
                f"multigrid cannot coarsen grid.shape={grid.shape}: it relaxes lines along "
                f"{names[line]} (a thin axis) and halves the other axes, which reach "
                f"{', '.join(odd) or 'sizes that cannot be halved'} at a level of shape "
                f"{stop.shape} with more than max_coarse={max_coarse} cells; use sizes "
                f"c·2^k with a small c (e.g. 96, 128, 160) along the other axes, or "
                f"method='spectral' (constant coefficient)"
            )
        if levels is None and max(spacing) >= mg.ANISOTROPY_FACTOR * min(spacing):
            raise ValueError(
                f"multigrid cannot coarsen grid.shape={grid.shape} with spacings "
                f"{tuple(float(f'{h:.3g}') for h in spacing)}: on an anisotropic grid only "
                f"the finely spaced axes are halved (semi-coarsening), and those run out of "
                f"cells before a level has ≤ max_coarse={max_coarse} cells; line "
                f"relaxation takes over only along a single finest axis that has walls "
                f"(not periodic) and is not split across devices, with every other axis "
                f"≥ {mg.ANISOTROPY_FACTOR:g}× coarser, or along the one axis that stops the "
                f"halving when it has walls; use method='spectral' (constant "
                f"coefficient), or more cells along the finely spaced axes"
            )
        if levels is None:
            names = grid.axis_names
            stops = [a for a, n in enumerate(stop.shape) if n % 2 or n < 4]
            short = [f"n{names[a]}={stop.shape[a]}" for a in stops]
            # one such axis with walls would be relaxed by lines (128×97 walled is solved):
            # a periodic one is refused, and the message said nothing of why that differs
            periodic = (
                f"; one such axis with walls would be relaxed by lines instead, but "
                f"n{names[stops[0]]} is periodic"
                if len(stops) == 1 and grid.periodic[stops[0]]
                else ""
            )
            raise ValueError(
                f"multigrid cannot coarsen grid.shape={grid.shape}: the finely spaced axes "
                f"(every axis of an isotropic grid) are halved together while each stays "
                f"even and ≥ 4, which stops at a level of shape {stop.shape} "
                f"({', '.join(short) or 'its sizes'} cannot be halved), more than "
                f"max_coarse={max_coarse} cells{periodic}; use sizes c·2^k with a small c "
                f"(e.g. 96, 128, 160) and enough cells along the shortest axis, or "
                f"method='spectral'"
            )
        self.levels = levels
        # prepared once unless it depends on a coefficient or on a field or traced
        # shift (then rebuilt inside each solve)
        constant_shift = self.shift is None or (self.shift.ndim == 0 and is_concrete(self.shift))
        if coefficient is None and constant_shift:
            self.coarse_inverse = _dense_inverse(
                levels[-1].grid,
                parity_of(self.bc),
                None,
                self.singular,
                grid.dtype,
                self.shift,
            )
            # kept beside it: a shift edited later (eqx.tree_at) needs another inverse
            self.coarse_shift = self.shift

    def __hash__(self) -> int:
        # jax.jit(solver) hashes the function it is given: a solver holding arrays (a
        # coefficient, a shift, the coarse-level inverse of multigrid/cg) stopped with
        # "unhashable type: 'jaxlib._jax.ArrayImpl'", which named neither the solver nor
        # what to do instead.
        try:
            return super().__hash__()
        except TypeError:
            held = [
                name
                for name in ("coefficient", "shift", "coarse_inverse")
                if getattr(self, name) is not None
            ]
            raise TypeError(
                f"a PoissonSolver holding arrays ({', '.join(held)}) is not hashable, so it "
                "cannot be the function given to jax.jit (which hashes it): use "
                "eqx.filter_jit(solver), or jax.jit of a function that takes the solver as "
                "an argument, e.g. jax.jit(lambda solver, f: solver(f))(solver, f)"
            ) from None

    # ---------------------------------------------------------------- helpers
    @property
    def singular(self) -> bool:
        """True when constants solve the homogeneous problem (no Dirichlet axis and no
        Helmholtz ``shift``)."""
        return self.shift is None and is_singular(self.bc)

    def _check_field(self, f, name: str) -> jax.Array:
        grid = self.grid
        if isinstance(f, jax.Array) and f.shape == grid.shape and f.dtype == grid.dtype:
            # the common case, without the conversions and dtype queries below: they were
            # ~12% of an eager 64² periodic spectral call
            return f

        def not_an_array(got: str) -> ValueError:
            return ValueError(
                f"{name} must be a real array of the grid's shape {self.grid.shape}, got {got}"
            )

        if f is None or isinstance(f, (str, bytes)):
            raise not_an_array(f"{f!r:.80}")
        try:
            f = jnp.asarray(f)
        except (TypeError, ValueError) as err:  # ragged lists, objects
            raise not_an_array(f"{f!r:.80} ({err!s:.80})") from None
        if not (jnp.issubdtype(f.dtype, jnp.number) or f.dtype == bool):
            raise not_an_array(f"dtype {f.dtype}")
        if f.shape != self.grid.shape:
            # Inside jax.shard_map (physjax.parallel.shard_map_fields) each device holds a
            # block: "use jax.vmap for batches" pointed the wrong way there.
            advice = (
                "inside jax.shard_map (e.g. physjax.parallel.shard_map_fields) a function sees "
                "one device's block of each field: call the solver outside it, on the whole "
                "field, with the solver built with mesh= (it splits the solve over the "
                "devices itself); the stencils can stay in shard_map_fields"
                if _inside_shard_map()
                else "use jax.vmap for batches"
            )
            raise ValueError(
                f"{name} must have the grid's shape {self.grid.shape} "
                f"({' '.join(self.grid.axis_names)}), got {f.shape}; {advice}"
            )
        if jnp.issubdtype(f.dtype, jnp.complexfloating) or f.dtype == bool:
            raise ValueError(f"{name} must be real, got dtype {f.dtype}")
        # The grid's precision is the solve's: a float32 f on a float64 grid is solved in
        # float64 (and to float64 tolerances), not silently in float32.
        return f.astype(self.grid.dtype) if f.dtype != self.grid.dtype else f

    def rhs(self, f, boundary_values: Mapping[str, Any] | None = None) -> jax.Array:
        """The right-hand side of the homogeneous problem (boundary values folded in)."""
        f = self._check_field(f, "f")
        solver = _mended(self)
        return fold_boundary_values(f, self.grid, self.bc, boundary_values, solver.coefficient)

    def operator(self, u) -> jax.Array:
        """Apply the homogeneous discrete operator ``A u`` (one device), the Helmholtz term
        ``- shift u`` included."""
        return _operator_jit(_mended(self), self._check_field(u, "u"))

    def residual(self, u, f, boundary_values: Mapping[str, Any] | None = None) -> jax.Array:
        """``f - A u`` with the boundary values folded into ``f``."""
        return self.rhs(f, boundary_values) - self.operator(u)

    _INCOMPATIBLE = (
        "f is incompatible with a periodic/Neumann problem: its mean (including folded "
        "boundary fluxes) must vanish; subtract it or pass compatibility='project'"
    )

    _NOT_FINITE = "f contains NaN or Inf values (after folding in any boundary values)"

    @staticmethod
    def _mean_tolerance(f: jax.Array) -> float:
        """|mean| allowed, relative to max |f|: round-off of a sum of ``f.size`` terms."""
        return _mean_tolerance(np.dtype(f.dtype), f.size)

    def _require_compatible(self, x, mean, scale, f: jax.Array):
        """``x``, once ``mean`` and ``scale`` (max |f|) of ``f`` pass the check: raised in
        Python on the fetched numbers when they are concrete, else through ``eqx.error_if``."""
        tol = PoissonSolver._mean_tolerance(f)
        if is_concrete(mean):
            mean, scale = _fetch_floats(mean, scale)
            # NaN: the mean tells (a sum keeps it); XLA:CPU's vectorised max may drop it
            if not (np.isfinite(scale) and np.isfinite(mean)):
                raise ValueError(self._NOT_FINITE)
            if abs(mean) > tol * scale:
                raise ValueError(f"{self._INCOMPATIBLE} (mean {mean:.3g}, max |f| {scale:.3g})")
            return x
        x = error_if(
            x, ~(jnp.isfinite(scale) & jnp.isfinite(mean)), self._NOT_FINITE, self.grid, self.mesh
        )
        return error_if(x, jnp.abs(mean) > tol * scale, self._INCOMPATIBLE, self.grid, self.mesh)

    def _compatible(self, f: jax.Array, prechecked: bool = False, project: bool = True):
        if not self.singular:
            return f
        if self.compatibility == "project":
            # The spectral solve sets the zero mode to zero, which is the same projection:
            # subtracting the mean first would only cost a pass (kept for residuals).
            return f - jnp.mean(f) if project or self.method != "spectral" else f
        if prechecked:  # verified on the concrete input (before or alongside the solve)
            return f
        return self._require_compatible(f, *_mean_and_scale(f), f)

    # ------------------------------------------------------------------ solve
    def _solve_local(self, grid: Grid, f, coefficient, coarse, guess=None, shift=None, check=False):
        """Body run on each device (or once); ``grid`` is the local view. ``coarse``: see
        ``_stored_coarse``. ``guess``: the iterative methods' first iterate (a direct solve
        has no use for it). ``shift``: the Helmholtz term (a scalar, or this device's block
        of a field). ``check``: raise through ``eqx.error_if`` when an iterative solve does
        not converge (inside a transformation, with ``throw``)."""
        bc = self.bc
        dtype = f.dtype
        c = None if shift is None else shift.astype(dtype)
        if self.method == "spectral":
            continuous = self.laplacian == "spectral"
            if grid.is_sharded:
                u = spectral_solve_sharded(f, grid, bc, continuous, shift=c)
            else:
                u = spectral_solve_local(f, grid, bc, continuous, shift=c)
            zero = jnp.zeros((), dtype)
            return u, mg.IterativeInfo(jnp.asarray(0, jnp.int32), zero, jnp.asarray(True))

        parity = parity_of(bc)
        a = None if coefficient is None else coefficient.astype(dtype)
        levels = self.levels
        fine = levels[0].grid
        # The operator's size, 2^k ~ max a · Σ 2/h² + max c (its largest diagonal entry
        # within a factor 2): the iterations run on A / 2^k, so that u, like f, is of
        # order one there (see solve_fn). With a coefficient the hierarchy itself is built
        # for A / 2^k (a and c scaled, exactly), so the cycle's own values are of order one
        # too; without one the prepared coarse inverse serves A, and the cycle is scaled.
        # (of values without derivatives: pmax, on a mesh, has no differentiation rule)
        a_top = None if a is None else mg.global_max(lax.stop_gradient(a), fine)
        top_a = sum(2 / h**2 for h in fine.spacing) * (1 if a_top is None else a_top)
        if c is not None:
            c_fixed = lax.stop_gradient(c)
            top_a = top_a + (c_fixed if c.ndim == 0 else mg.global_max(c_fixed, fine))
        top_a = jnp.asarray(top_a, dtype)
        _, op_exponent = jnp.frexp(jnp.where((top_a > 0) & jnp.isfinite(top_a), top_a, 1))
        one = jnp.ones((), dtype)
        op_down, op_up = jnp.ldexp(one, -op_exponent), jnp.ldexp(one, op_exponent)
        internal = a is not None  # the hierarchy built for A / 2^k
        if internal:
            a = a * op_down
            c = None if c is None else c * op_down
        inv, made_for = (None, None) if coarse is None else coarse
        inv = None if inv is None else inv.astype(dtype)
        made_for = None if made_for is None else made_for.astype(dtype)
        data = mg.prepare(levels, parity, a, inv, self.singular, dtype, c, made_for)
        cycle = mg.Multigrid(levels, parity, data, *self.smoothing, self.cycle)
        faces = data.faces[0]

        def prepared_operator(u):  # A / 2^k when internal, else A
            return apply_operator(u, fine, parity, faces, c)

        iterate = mg.conjugate_gradient if self.method == "cg" else mg.multigrid_iterate

        # |A| |u| = A|u| - 2 diag(A) |u| (diagonal ≤ 0, couplings ≥ 0): sets the round-off
        # level of the residual (for the convergence flag only: no derivative). With a
        # shift the diagonal holds -shift, so the shift term enters as +shift |u|.
        diag = data.diag[0]  # the smoother's; absent when the fine level is gathered
        if diag is None:
            diag = operator_diagonal(fine, parity, faces, dtype, c)
        diag = lax.stop_gradient(diag)

        def prepared_abs_operator(u):
            au = jnp.abs(u)
            return prepared_operator(au) - 2 * diag * au

        if internal:
            scaled_matvec, scaled_cycle = prepared_operator, cycle
            scaled_abs_operator = prepared_abs_operator

            def matvec(u):  # A itself, for the derivatives custom_linear_solve takes
                return prepared_operator(u) * op_up

        else:
            matvec = prepared_operator

            def scaled_matvec(u):
                return prepared_operator(u) * op_down

            def scaled_cycle(r):
                return cycle(r) * op_up

            def scaled_abs_operator(u):
                return prepared_abs_operator(u) * op_down

        def solve_fn(_matvec, rhs):
            b, x0 = (rhs[0], rhs[1]) if guess is not None else (rhs, None)
            start = x0
            if self.singular:
                b = mg.remove_mean(b, fine)
                # the zero-mean gauge holds for the returned u even when the guess is
                # already within the tolerance (no iteration then)
                if x0 is not None:
                    # (an Inf in the guess would turn every value NaN here, and a NaN
                    # residual is kept: left as given, its Inf residual exceeds ‖f‖ and the
                    # guess is dropped, as on a problem with walls)
                    centred = mg.remove_mean(x0, fine)
                    start = jnp.where(jnp.isfinite(centred), centred, x0)
            # Iterate on (A / 2^k) u' = b / 2^e, 2^e ~ max|b|, u = 2^(e-k) u': the norms
            # are square roots of sums of squares, which underflow or overflow for data far
            # from 1 (|f| ~ 1e-20 in float32, 1e±170 in float64) and would then stop the
            # loop at once with u = 0; and for u far from 1 while f is not (a coefficient
            # of 1e-200 with f to match: ‖u‖ overflowed and the loop stopped after one
            # iteration, not converged). Powers of two scale exactly: the u returned has the
            # residual reported.
            top = mg.global_max(jnp.abs(b), fine)
            _, exponent = jnp.frexp(jnp.where((top > 0) & jnp.isfinite(top), top, 1))
            scale = jnp.ldexp(one, exponent)
            unit = exponent - op_exponent  # u = 2^unit u'
            u, info = iterate(
                scaled_matvec,
                scaled_cycle,
                b / scale,
                fine,
                self.singular,
                self.rtol,
                self.atol / scale,
                self.max_iterations,
                scaled_abs_operator,
                None if start is None else _times_power_of_two(start, -unit),
            )
            # A u whose values all fall below the dtype's smallest normal number (|f| ~
            # 1e-36 in float32) is flushed to zero by XLA on the CPU when scaled back: it
            # then solves nothing, whatever the iterations reached.
            top_u = mg.global_max(jnp.abs(u), fine)
            lost = (top_u > 0) & (_times_power_of_two(top_u, unit) < jnp.finfo(b.dtype).tiny)
            u_back = _times_power_of_two(u, unit)
            # Some values only (|f| ~ 1e-36 in float32 on a 32² box: u peaks at 7e-38, the
            # cells near the walls fall below 1.2e-38) are flushed as well: the residual the
            # iteration reached (5e-6) is then not that of the u returned (6.8). It is
            # recomputed, in the scaled units, for u with those values zeroed, and a u whose
            # residual the flush more than doubled (beyond rtol) has not converged.
            flushed = mg.global_max(((u != 0) & (u_back == 0)).astype(b.dtype), fine) > 0

            def kept_residual(_):
                b_scaled = b / scale
                r_kept = b_scaled - scaled_matvec(jnp.where(u_back == 0, 0, u))
                b_norm2 = mg.global_dot(b_scaled, b_scaled, fine)
                rel = jnp.sqrt(mg.global_dot(r_kept, r_kept, fine)) / jnp.sqrt(
                    jnp.where(b_norm2 > 0, b_norm2, 1)
                )
                return rel.astype(info.residual_norm.dtype)

            # (the extra operator application only where something was flushed: the
            # predicate is global, every device takes the same branch)
            rel_kept = lax.cond(flushed, kept_residual, lambda _: info.residual_norm, operand=None)
            spoilt = flushed & (rel_kept > 2 * jnp.maximum(info.residual_norm, self.rtol))
            info = info._replace(
                converged=info.converged & ~lost & ~spoilt,
                residual_norm=jnp.where(
                    lost,
                    jnp.ones_like(info.residual_norm),
                    jnp.where(
                        flushed, jnp.maximum(rel_kept, info.residual_norm), info.residual_norm
                    ),
                ),
            )
            u = u_back
            if check:
                # Here, not on the u returned: jax.grad and jax.jvp run this function again
                # for the cotangent or tangent (from zero, on another right-hand side), and
                # custom_linear_solve drops the diagnostics of those solves. (On a mesh this
                # is one device's block, with the replicated flag: every device raises.)
                u = eqx.error_if(u, ~info.converged, self._not_converged_message(True))
            return (jnp.stack([u, x0]) if guess is not None else u), info

        if guess is None:
            return lax.custom_linear_solve(matvec, f, solve_fn, symmetric=True, has_aux=True)
        # The guess rides in the right-hand side, the identity its block of the operator:
        # the solve, (A⁻¹ b, g), is then linear in (b, g) as custom_linear_solve requires,
        # and the solves for tangents and cotangents start from the guess's own tangent or
        # cotangent — zero — rather than from a guess made for u. One stacked array, not a
        # pair: jax's rule for tangents cannot take a pair with one zero tangent.
        x, info = lax.custom_linear_solve(
            lambda x: jnp.stack([matvec(x[0]), x[1]]),
            jnp.stack([f, lax.stop_gradient(guess)]),
            solve_fn,
            symmetric=True,
            has_aux=True,
        )
        return x[0], info

    def _run(self, f, coefficient, guess=None, shift=None, check=False):
        grid = _internal_grid(self.grid)
        fn = functools.partial(self._solve_local, check=check)
        # The prepared coarse inverse is a preconditioner, not part of the problem: no
        # derivative flows into it. (eqx.filter_grad of a model holding a multigrid or cg
        # solver differentiates it as an array leaf; where the right-hand side then had no
        # tangent, custom_linear_solve stopped with "Error interpreting argument ... Zero".)
        coarse = jax.tree.map(lax.stop_gradient, self._stored_coarse(coefficient, shift))
        if self.mesh is None or self.mesh.size == 1:
            return fn(grid, f, coefficient, coarse, guess, shift)
        local = decompose(grid, self.mesh)
        spec = field_spec(grid, self.mesh)
        rep = PartitionSpec()
        info_spec = mg.IterativeInfo(rep, rep, rep)
        a_spec = None if coefficient is None else spec
        inv_spec = jax.tree.map(lambda _: rep, coarse)
        guess_spec = None if guess is None else spec
        # a field shift is split like the grid, a scalar one replicated
        shift_spec = None if shift is None else (spec if jnp.ndim(shift) else rep)
        return jax.shard_map(
            lambda f_, a_, inv_, g_, c_: fn(local, f_, a_, inv_, g_, c_),
            mesh=self.mesh,
            in_specs=(spec, a_spec, inv_spec, guess_spec, shift_spec),
            out_specs=(spec, info_spec),
            check_vma=False,
        )(f, coefficient, coarse, guess, shift)

    def _stored_coarse(self, coefficient, shift):
        """``(coarse_inverse, coarse_shift)`` when the inverse prepared by the constructor
        can serve the operator solved now, else ``None`` (the solve then makes its own).
        It was made for no coefficient and a constant shift (or none); ``eqx.tree_at`` may
        have set a coefficient or another kind of shift since. A scalar shift edited to
        another value is told apart inside the solve, where its value is known."""
        if self.coarse_inverse is None or coefficient is not None:
            return None
        if (shift is None) != (self.coarse_shift is None) or np.ndim(shift) > 0:
            return None
        return self.coarse_inverse, self.coarse_shift

    def _precheck(self, f, boundary_values) -> bool | None:
        """How the compatibility condition of a concrete (already shape-checked) ``f`` is
        checked: ``None`` when it is to be verified alongside the solve — the mean and
        max |f| come back with the solution (one compiled call) and are checked before it
        is returned — else ``False`` (nothing to check, or checked in the graph).

        Every method is checked alongside: a separate compiled check, fetched before the
        solve was dispatched, cost a dispatch and a wait for the device at every eager
        call (for ``multigrid``/``cg`` until 2026-12-07: a 32² periodic cg solve called in
        a Python time loop took 0.61 ms per call, 0.39 ms without it).
        """
        if self.singular and self.compatibility == "check" and is_concrete(f):
            return None
        return False

    def solve(
        self,
        f: Field,
        boundary_values: Mapping[str, Any] | None = None,
        *,
        initial_guess: Field | None = None,
    ) -> PoissonSolution:
        """Solve and report diagnostics.

        **Arguments:**

        - `f`: right-hand side at cell centres, the grid's shape (one field; ``jax.vmap``
          for batches).
        - `boundary_values`: inhomogeneous wall values, see
          [`physjax.solvers.poisson.fold_boundary_values`][].
        - `initial_guess`: where `multigrid` and `cg` start (default zero), e.g. the
          previous time step's solution; the tolerance stays relative to ``‖f‖``, so a
          close guess takes fewer iterations. It changes neither the problem nor the
          derivatives (no gradient flows into it); `spectral` ignores it.

        **Returns:** a [`physjax.solvers.poisson.PoissonSolution`][].
        """
        return _dispatch(
            self, f, boundary_values, _solve_fast, PoissonSolver._solve_jit, initial_guess
        )

    def _not_converged_message(
        self, in_graph: bool = False, iterations: int | None = None, residual=None
    ) -> str:
        """Why a solve counts as not converged; with the ``iterations`` it ran and its
        relative ``residual`` when they are known (a call made outside any transformation),
        which tell running out of iterations from stopping early."""
        # in a graph the solves that jax.grad/jax.jvp add for derivatives are checked too
        which = " (or one added by jax.grad/jax.jvp for a derivative)" if in_graph else ""
        head = f"the {self.method} Poisson solve{which} did not converge"
        within = f" within max_iterations={self.max_iterations} to rtol={self.rtol:g}"
        causes = "NaN/Inf in f, boundary_values or initial_guess, or a diverging multigrid cycle"
        if iterations is None:
            how = (
                f"{within}, or stopped before: on a residual that is not finite ({causes}), "
                "or where an iteration no longer changed u (the working precision exhausted)"
            )
        elif not np.isfinite(residual):
            how = (
                f" to rtol={self.rtol:g}: its residual is {float(residual)} after {iterations} "
                f"of max_iterations={self.max_iterations} iterations ({causes})"
            )
        elif iterations >= self.max_iterations:
            how = f"{within}: the relative residual is {float(residual):.3g}"
        else:
            how = (
                f" to rtol={self.rtol:g}: it stopped after {iterations} of max_iterations="
                f"{self.max_iterations} iterations at a relative residual of "
                f"{float(residual):.3g}, where an iteration no longer changed u (the working "
                "precision exhausted), or with a solution flushed to zero (below)"
            )
        return (
            f"{head}{how}; raise max_iterations or the tolerance, check the inputs and the "
            "coefficient (strongly varying coefficients: method='cg'), or pass throw=False "
            "and read .converged from .solve. A solution below the dtype's smallest normal "
            "number (1.2e-38 in float32), or a part of it that spoils the residual, is "
            "flushed to zero and counts as not converged: scale f up"
        )

    def _solve_core(
        self,
        f,
        boundary_values,
        prechecked,
        residual: bool,
        in_graph: bool,
        guess=None,
        host_scale: bool = False,
    ):
        b = self.rhs(f, boundary_values)
        # Checked alongside a one-device spectral solve: the mean is the transform's zero
        # mode, so only max |f| costs a pass of its own.
        sum_from_spectrum = (
            prechecked is None
            and self.method == "spectral"
            and (self.mesh is None or self.mesh.size == 1)
        )
        stats = _mean_and_scale(b) if prechecked is None and not sum_from_spectrum else None
        b = self._compatible(b, prechecked is not False, project=residual)
        if sum_from_spectrum:
            continuous = self.laplacian == "spectral"
            grid = _internal_grid(self.grid)
            u, total = spectral_solve_local(b, grid, self.bc, continuous, with_sum=True)
            zero = jnp.zeros((), u.dtype)
            info = mg.IterativeInfo(jnp.asarray(0, jnp.int32), zero, jnp.asarray(True))
            # Called eagerly, max |f| over a few rows is enough when the mean passes against
            # it (a lower bound of max |f|); otherwise the caller takes the full max before
            # deciding (_checked). In a graph the full max is taken here. With
            # ``host_scale`` the caller reads those rows of f on the host (see _dispatch).
            if host_scale:
                scale = None
            else:
                scale = _sampled_max_abs(b) if not in_graph else jnp.max(jnp.abs(b))
            stats = (total / b.size, scale)
        else:
            # (called eagerly, the caller checks ``converged`` in Python and raises there)
            check = self.throw and in_graph
            u, info = self._run(b, self.coefficient, guess, self.shift, check)
        if self.method == "spectral":
            if residual:
                rel = _relative_norm(b - self.operator(u), b)
                # A direct solve fails on NaN or Inf in f (or overflow), and when u lies below
                # the smallest normal number and is flushed to zero (u = 0 for f ≠ 0). Not
                # "rel < 1": on a strongly anisotropic float32 grid the exact solution to
                # round-off has a stencil residual above ‖f‖ (3.8 for 1e-2 × 1e2 cells)
                ok = jnp.isfinite(rel) & ((rel == 0) | jnp.any(u != 0))
                # Some values only flushed (|f| = 1e-36 on a 32² float32 Dirichlet square:
                # u peaks at 7e-38, the cells near the walls are zeroed, residual 6.4): zeros
                # of u where f is not zero, in a u small enough to reach the smallest normal
                # number within the dtype's precision, with a residual beyond 2 rtol.
                info_ = jnp.finfo(u.dtype)
                near_tiny = jnp.max(jnp.abs(u)) < info_.tiny * 2.0 ** (info_.nmant + 1)
                flushed = near_tiny & jnp.any((u == 0) & (b != 0)) & (rel > 2 * self.rtol)
                info = mg.IterativeInfo(info.iterations, rel, ok & ~flushed)
        return u, info, stats

    @eqx.filter_jit
    def _solve_jit(self, f, boundary_values, prechecked=False, in_graph=True, guess=None):
        u, info, stats = self._solve_core(f, boundary_values, prechecked, True, in_graph, guess)
        sol = PoissonSolution(u, info.residual_norm, info.iterations, info.converged)
        return sol, info, stats

    def __call__(
        self,
        f: Field,
        boundary_values: Mapping[str, Any] | None = None,
        *,
        initial_guess: Field | None = None,
    ) -> Field:
        """The solution ``u`` of the grid's shape (see [`solve`][] for diagnostics and
        `initial_guess`)."""
        return _dispatch(
            self, f, boundary_values, _call_fast, PoissonSolver._call_jit, initial_guess
        )

    def _checked(self, out, stats, f, boundary_values=None):
        """``out``, once the mean and max |f| computed alongside the solve pass the check
        (in the graph when this call is itself inside a transformation).

        Concrete ``stats`` may carry a lower bound of max |f| (the max over sampled rows):
        a mean within the tolerance of that bound passes; otherwise max |f| over the
        whole of ``f`` (boundary values folded in) is taken before deciding, so the
        verdict and the message are those of the full check."""
        if stats is None:
            return out
        mean, scale = stats
        if is_concrete(mean):
            tol = PoissonSolver._mean_tolerance(f)  # before the wait: after it, on the path
            mean, scale = _fetch_floats(mean, scale)
            if np.isfinite(scale) and np.isfinite(mean) and abs(mean) <= tol * scale:
                return out  # passed (the usual case: as little Python as possible after the wait)
            if not (np.isfinite(mean) and abs(mean) <= tol * scale):
                scale = float(_max_abs(PoissonSolver.rhs(self, f, boundary_values)))
        return PoissonSolver._require_compatible(self, out, mean, scale, f)

    @eqx.filter_jit
    def _call_jit(self, f, boundary_values, prechecked=False, in_graph=True, guess=None):
        u, info, stats = self._solve_core(f, boundary_values, prechecked, False, in_graph, guess)
        return u, _returned_info(self, info), stats


def _dispatch(solver: PoissonSolver, f, boundary_values, fast, general, guess=None):
    """Check ``f``, solve by ``fast(solver, f, prechecked, in_graph, guess)`` (no boundary
    values) or ``general(solver, f, boundary_values, prechecked, in_graph, guess)``, and
    apply the compatibility check.

    A function, with the methods taken from the class: on an instance equinox builds a
    bound-method module at every attribute access, a noticeable part of a small solve.
    """
    cls = type(solver)
    solver = _mended(solver)
    given = f
    f = cls._check_field(solver, f, "f")
    _check_finite_host_field(given, "f", solver.grid.dtype)
    # a JAX-array guess is read only if the solve fails (below): read before it, it cost a
    # dispatch and a wait for the device at every call of an eager time loop
    guess_on_device = isinstance(guess, jax.Array)
    if guess is not None:
        given_guess = guess
        guess = cls._check_field(solver, guess, "initial_guess")
        if solver.method == "spectral":
            guess = None  # a direct solve: nothing to start from (and no second compilation)
        elif not guess_on_device:  # NumPy or a list: read on the host, no wait
            _refuse_non_finite_guess(np.asarray(given_guess))
    if isinstance(boundary_values, Mapping):
        # the shape of each entry is checked here, on the values as given: inside the
        # compiled call the message would show tracers instead
        for name, pair in boundary_values.items():
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ValueError(
                    f"boundary_values[{name!r}] must be a pair (low, high) (a tuple or list), "
                    f"got {pair!r}"
                )
        if solver.laplacian == "spectral" and any(
            v is not None for pair in boundary_values.values() for v in pair
        ):
            raise ValueError(
                "boundary_values need laplacian='discrete': wall values are folded into f "
                "for the second-order stencil, a problem that the exact eigenvalues of "
                "laplacian='spectral' do not solve (the error does not fall with h); subtract "
                "a smooth function that takes the wall values and solve for the rest with "
                "homogeneous walls, or use laplacian='discrete'"
            )
        # a wall's values given as a list are one array: left as a list, the map below
        # would take each of its numbers for a wall value of its own
        boundary_values = {
            name: tuple(_wall_array(v, name, side) for side, v in zip(("low", "high"), pair))
            for name, pair in boundary_values.items()
        }
    if boundary_values is not None:
        # (before numbers are cast to the grid's dtype: 1e39 on a float32 grid is out of
        # range, not NaN/Inf)
        _check_finite_boundary_values(boundary_values, f.dtype)
        # Python numbers would be static under eqx.filter_jit: a stepper passing new wall
        # values every step would then compile every step. As 0-d arrays they are traced.
        # (a bool is left as it is, to be refused as no wall value: True is not 1)
        boundary_values = jax.tree.map(
            lambda v: (
                np.asarray(v, f.dtype)
                if isinstance(v, (int, float)) and not isinstance(v, bool)
                else v
            ),
            boundary_values,
        )
    # arrays committed to one device would be refused by the compiled call's device check
    f, boundary_values, guess = place_on_mesh((f, boundary_values, guess), solver.grid, solver.mesh)
    prechecked = cls._precheck(solver, f, boundary_values)
    # Called eagerly (nothing traced), a solve that does not converge raises here, in
    # Python, with the solver's own message; inside a transformation through eqx.error_if.
    eager = all(is_concrete(x) for x in jax.tree.leaves((solver, f, boundary_values, guess)))

    # A one-device check of a spectral solve on the CPU reads its few rows of f for the
    # lower bound of max |f| in place, on the host, while the solve runs: two kernels fewer
    # in the compiled call (a checked 1024² periodic solve ~3% faster).
    host_scale = (
        eager
        and boundary_values is None
        and prechecked is None
        and solver.method == "spectral"
        and (solver.mesh is None or solver.mesh.size == 1)
        and _on_the_host(f)
    )

    def run(in_graph: bool):
        if boundary_values is None:
            return fast(solver, f, prechecked, in_graph, guess, host_scale and not in_graph)
        return general(solver, f, boundary_values, prechecked, in_graph, guess)

    out, info, stats = run(not eager)
    if stats is not None and stats[1] is None:
        stats = (stats[0], _host_sampled_max_abs(f))
    if eager and not is_concrete(out if info is None else info.converged):
        # Concrete inputs, but called inside a trace (a lax.cond branch, or jax.jit of a
        # function whose arguments the solve does not read): the call was staged there and
        # its results are tracers, which the Python check below cannot read. Staged again
        # with the checks in the graph (the first, unused, is dropped from the program).
        eager = False
        out, info, stats = run(True)
    out = cls._checked(solver, out, stats, f, boundary_values)
    if eager and guess is not None and guess_on_device and not bool(info.converged):
        # (a traced guess, as in a time stepper, is not read: the solve then reports not
        # converged, and its message names the guess among the causes)
        _refuse_non_finite_guess(np.asarray(guess))
    if eager and solver.throw and solver.method != "spectral" and not bool(info.converged):
        iterations, residual = jax.device_get((info.iterations, info.residual_norm))
        raise RuntimeError(cls._not_converged_message(solver, False, int(iterations), residual))
    return out


# Without boundary values every leaf of the solver is an array, so plain ``jax.jit`` can take
# the solver itself as an argument (its static fields go into the cache key): ~0.3 ms less
# Python per call than ``eqx.filter_jit``, which the calls with boundary values (Python
# numbers among them, kept static) still use.
@functools.partial(jax.jit, static_argnames=("prechecked", "in_graph", "host_scale"))
def _call_fast(solver: PoissonSolver, f, prechecked, in_graph, guess=None, host_scale=False):
    u, info, stats = solver._solve_core(f, None, prechecked, False, in_graph, guess, host_scale)
    return u, _returned_info(solver, info), stats


def _returned_info(solver: PoissonSolver, info):
    """``info`` as a solve's ``__call__`` returns it from its compiled program: ``None`` for
    the spectral method, whose info is constant (0 iterations, converged) and unread there.

    Each constant output is a copy kernel of its own, and on XLA:CPU a program of more than
    8 kernels runs on the thread pool instead of in the calling thread: the checked
    periodic solve (9 kernels with them, 6 without) cost ~0.3 ms more at 1024² (~6%)."""
    return None if solver.method == "spectral" else info


@functools.partial(jax.jit, static_argnames=("prechecked", "in_graph", "host_scale"))
def _solve_fast(solver: PoissonSolver, f, prechecked, in_graph, guess=None, host_scale=False):
    u, info, stats = solver._solve_core(f, None, prechecked, True, in_graph, guess, host_scale)
    sol = PoissonSolution(u, info.residual_norm, info.iterations, info.converged)
    return sol, info, stats


# One compiled program each, instead of a few dozen eager operations compiled one by one
# at the first use of every shape (the coarse inverse of a 3-D hierarchy took ~2 s to build
# eagerly, on a 2-core CPU).
@jax.jit
def _operator_jit(solver: PoissonSolver, u):
    g = _internal_grid(solver.grid)
    a = None if solver.coefficient is None else solver.coefficient.astype(u.dtype)
    faces = None if a is None else face_coefficients(a, g)
    c = None if solver.shift is None else solver.shift.astype(u.dtype)
    return apply_operator(u, g, parity_of(solver.bc), faces, c)


_dense_inverse = jax.jit(mg.dense_inverse, static_argnums=(0, 1, 3, 4))


def _committed_elsewhere(x, mesh: Mesh | None) -> bool:
    """Whether ``x`` is a concrete JAX array committed to devices other than ``mesh``'s
    (a mesh of several devices)."""
    return (
        mesh is not None
        and mesh.size > 1
        and isinstance(x, jax.Array)
        and is_concrete(x)
        and x.committed
        and getattr(x.sharding, "mesh", None) != mesh
    )


def _refuse_non_finite_guess(values: np.ndarray) -> None:
    """Refuse an ``initial_guess`` with NaN/Inf, by name (it ran every iteration of cg and
    then blamed f)."""
    if values.dtype.kind in "fc" and not np.all(np.isfinite(values)):
        raise ValueError(
            f"initial_guess has {int(np.sum(~np.isfinite(values)))} non-finite value(s) "
            "(NaN/Inf); give a finite guess (e.g. the last good solution) or none"
        )


def _wall_array(value, name, side: str):
    """A wall's values given as a (nested) list or tuple, as one array; else ``value``."""
    if not isinstance(value, (list, tuple)):
        return value
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        pass
    try:  # traced numbers or JAX arrays among them
        return jnp.asarray(value)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"boundary_values[{name!r}] ({side} wall) must be a number or a real array of "
            f"the wall's shape, got a list that is not an array: {value!r:.80} ({err!s:.80})"
        ) from None


def _check_finite_host_field(value, name: str, dtype) -> None:
    """Refuse NaN/Inf in a field given as a NumPy array (or a list), by name, before
    anything is compiled: read on the host, it costs no wait for the device. JAX arrays
    are left to the solve (a periodic/Neumann problem's compatibility check refuses them,
    otherwise the solve reports not converged). So are values that the grid's ``dtype``
    cannot hold (float64 data beyond float32's range), which the cast would make Inf."""
    if isinstance(value, jax.Array):
        return
    values = np.asarray(value)
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        raise ValueError(
            f"{name} contains NaN or Inf values: {int(np.sum(~np.isfinite(values)))} of "
            f"{values.size}"
        )
    _check_in_range(values, name, dtype)


def _check_in_range(values: np.ndarray, name: str, dtype) -> None:
    """Refuse finite values that become Inf when cast to ``dtype`` (float64 data beyond
    float32's range on a float32 grid): they were solved as Inf, a spectral solve
    returning NaN without a word."""
    if values.dtype.kind != "f" or values.dtype.itemsize <= np.dtype(dtype).itemsize:
        return
    with np.errstate(over="ignore"):
        lost = int(np.sum(np.isinf(values.astype(dtype))))
    if lost:
        top = float(np.finfo(dtype).max)
        raise ValueError(
            f"{name} has {lost} value(s) beyond the range of the grid's {np.dtype(dtype).name} "
            f"(largest magnitude {float(np.max(np.abs(values))):.3g}, where it holds up to "
            f"{top:.3g}), which would be solved as Inf; scale it (other units) or use a "
            "float64 grid"
        )


def _check_positive_in_range(value, name: str, dtype) -> None:
    """Refuse a concrete ``coefficient`` or ``shift``, finite and > 0 as given, whose values
    the grid's ``dtype`` cannot hold (float64 numbers on a float32 grid): the cast made them
    Inf or 0, which were then refused as "must be finite and > 0, got min inf" (or "min 0"),
    a value the caller never gave. Traced values are left to the solve's own check."""
    if isinstance(value, jax.core.Tracer):
        return
    given_dtype = getattr(value, "dtype", None)  # an array's: no copy to the host when it fits
    if given_dtype is not None and (
        np.dtype(given_dtype).kind != "f"
        or np.dtype(given_dtype).itemsize <= np.dtype(dtype).itemsize
    ):
        return
    try:
        values = np.asarray(value)
    except (TypeError, ValueError):  # ragged lists, tracers in a list: refused by the caller
        return
    if values.dtype.kind != "f" or values.dtype.itemsize <= np.dtype(dtype).itemsize:
        return
    info = np.finfo(dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        cast = values.astype(dtype)
        given = np.isfinite(values) & (values > 0)
        # a subnormal value (below the smallest normal number) is flushed to zero by XLA
        lost = given & ~(np.isfinite(cast) & (cast >= info.tiny))
    if np.any(lost):
        held = values[given]
        raise ValueError(
            f"{name} has {int(np.sum(lost))} value(s) outside the range of the grid's "
            f"{np.dtype(dtype).name} ({float(info.tiny):.3g} to "
            f"{float(info.max):.3g}; given from {float(held.min()):.3g} to "
            f"{float(held.max()):.3g}), which the cast would make Inf, or 0 (a subnormal "
            "number, which XLA flushes to zero); scale the problem (other units) or use a "
            "float64 grid"
        )


def _check_normal(values: np.ndarray, name: str) -> None:
    """Refuse values > 0 below the smallest normal number of their dtype (1e-310 in
    float64, 1e-40 in float32): XLA flushes such subnormal numbers to zero, so the solve
    took the coefficient (or shift) as 0 (with a subnormal f too, u = 0 was returned as
    converged); the message gives the value as given, not the 0 it would become."""
    info = np.finfo(values.dtype)
    tiny = (values > 0) & (values < info.tiny)
    if np.any(tiny):
        least = float(values[tiny].min())
        raise ValueError(
            f"{name} has {int(np.sum(tiny))} value(s) below the smallest normal "
            f"{values.dtype.name} number {float(info.tiny):.3g} (min {least:.3g}): "
            "XLA flushes such subnormal numbers to zero; scale the problem (other units)"
        )


def _check_finite_boundary_values(boundary_values, dtype) -> None:
    """Refuse NaN/Inf wall values given as numbers or NumPy arrays, by name (the spectral
    path would otherwise return NaN). JAX arrays are left to the solve, which reports them
    like a non-finite ``f``: reading them here would wait for the device at every call."""
    if not isinstance(boundary_values, Mapping):
        return  # reported by the solve's own checks
    for name, pair in boundary_values.items():
        for side, value in zip(("low", "high"), pair):
            if value is None or isinstance(value, jax.Array):
                continue
            values = np.asarray(value)
            if values.dtype.kind not in "iuf":
                # refused here, not in the compiled call, which cannot take an array of
                # objects or strings (jit's TypeError would not name the wall)
                got = f"an array of {values.dtype}" if hasattr(value, "dtype") else f"{value!r:.80}"
                raise ValueError(
                    f"boundary_values[{name!r}] entries must be real numbers or real arrays, "
                    f"got {got}"
                )
            if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
                raise ValueError(
                    f"boundary_values[{name!r}] ({side} wall) has "
                    f"{int(np.sum(~np.isfinite(values)))} non-finite value(s) (NaN/Inf)"
                )
            _check_in_range(values, f"boundary_values[{name!r}] ({side} wall)", dtype)


_SHIFT_NOT_POSITIVE = "shift must be finite and > 0 everywhere"


def _mended(solver: PoissonSolver) -> PoissonSolver:
    """``solver`` with a ``coefficient`` or ``shift`` set by ``eqx.tree_at`` (which skips
    the constructor) checked and converted as the constructor does: one number broadcast
    to a coefficient field, a Python or NumPy shift made an array of the grid's dtype
    (traced under jit), arrays committed to one device placed on the mesh."""
    _check_edited_operator(solver)
    if solver.coefficient is not None and np.ndim(solver.coefficient) == 0:
        coefficient = _check_coefficient(
            solver.coefficient, solver.grid, solver.method, solver.mesh
        )
        solver = eqx.tree_at(lambda s: s.coefficient, solver, coefficient)
    if solver.shift is not None and not isinstance(solver.shift, jax.Array):
        shift = _check_shift(solver.shift, solver.grid, solver.method, solver.mesh)
        solver = eqx.tree_at(lambda s: s.shift, solver, shift)
    if any(_committed_elsewhere(x, solver.mesh) for x in (solver.coefficient, solver.shift)):
        # the compiled call's device check would refuse them
        solver = eqx.tree_at(
            lambda s: (s.coefficient, s.shift),
            solver,
            place_on_mesh((solver.coefficient, solver.shift), solver.grid, solver.mesh),
            is_leaf=lambda v: v is None,
        )
    return solver


def _check_edited_operator(solver: PoissonSolver) -> None:
    """The constructor's checks of ``coefficient`` and ``shift`` that cost nothing, again
    (``eqx.tree_at`` skips ``__init__``): their shapes, and a scalar shift's value when it
    has one. A coefficient field's values are read by the constructor only."""
    shape = solver.grid.shape
    a, c = solver.coefficient, solver.shift
    if a is not None and np.ndim(a) and tuple(np.shape(a)) != shape:
        raise ValueError(
            f"coefficient must be one number or have the grid's shape {shape}, got {np.shape(a)}"
        )
    if a is not None and solver.method == "spectral":  # was solved as if a = 1
        raise ValueError(
            "coefficient is not supported by method='spectral', which solves the "
            "constant-coefficient Laplacian only; build a PoissonSolver with method='cg' or "
            "'multigrid' for a coefficient field"
        )
    if c is None:
        return
    if np.ndim(c) and tuple(np.shape(c)) != shape:
        raise ValueError(
            f"shift must be a scalar or have the grid's shape {shape}, got {np.shape(c)}"
        )
    if np.ndim(c) and solver.method == "spectral":
        raise ValueError("a shift field (varying in space) is not supported by method='spectral'")
    if not np.ndim(c) and is_concrete(c):
        x = float(c)
        if not (math.isfinite(x) and x > 0):
            raise ValueError(f"{_SHIFT_NOT_POSITIVE}, got {x:g}")


def _spectral_mesh_refusal(grid: Grid, mesh: Mesh | None) -> str | None:
    """Why the spectral method cannot run on ``mesh`` (its slab transposes split the first
    and the last axis over every device), or ``None`` when it can."""
    if mesh is None or mesh.size == 1:
        return None
    p = mesh.size
    for a in (0, grid.ndim - 1):
        if grid.shape[a] % p:
            return (
                f"the spectral method on {p} devices needs n{grid.axis_names[a]} "
                f"divisible by {p} (slab transposes), got grid.shape={grid.shape}"
            )
    return None


def _least(values: np.ndarray) -> str:
    """The smallest value of a field that should be finite and > 0, and how many are not
    finite, for an error message (an all-NaN field has no smallest value: nan)."""
    least = np.nanmin(values) if np.any(~np.isnan(values)) else np.nan
    return f"min {least:.3g} (non-finite: {int(np.sum(~np.isfinite(values)))})"


def _check_coefficient(coefficient: Any, grid: Grid, method: str, mesh: Mesh | None):
    """The coefficient ``a`` as a field of the grid's shape and dtype (one number is
    broadcast to every cell), checked: real, finite and > 0 (in Python when concrete,
    through ``error_if`` when traced), and placed on ``mesh``."""
    if coefficient is None:
        return None
    if method == "spectral":
        raise ValueError(
            "coefficient is not supported by method='spectral', which solves the "
            "constant-coefficient Laplacian only: for a field use method='cg' or "
            "'multigrid'; for one number a, ∇·(a∇u) = f is ∇²u = f/a (a shift C "
            "becomes C/a), which spectral solves exactly"
        )
    if isinstance(coefficient, (str, bytes)):
        raise ValueError(f"coefficient must be real (and > 0), got {coefficient!r:.80}")
    _check_positive_in_range(coefficient, "coefficient", grid.dtype)
    try:
        given = jnp.asarray(coefficient)
    except (TypeError, ValueError) as err:  # ragged lists, objects
        raise ValueError(
            f"coefficient must be a positive number or a real array of the grid's "
            f"shape {grid.shape}, got {coefficient!r:.80} ({err!s:.80})"
        ) from None
    if jnp.iscomplexobj(given):
        raise ValueError("coefficient must be real (and > 0), got a complex array")
    if given.dtype == bool or not jnp.issubdtype(given.dtype, jnp.number):
        # True is not a coefficient of 1
        raise ValueError(f"coefficient must be real (and > 0), got dtype {given.dtype}")
    coefficient = given.astype(grid.dtype)
    if coefficient.ndim == 0:  # a constant: the same at every cell
        coefficient = jnp.broadcast_to(coefficient, grid.shape)
    if coefficient.shape != grid.shape:
        raise ValueError(
            f"coefficient must have the grid's shape {grid.shape}, got {coefficient.shape}"
        )
    if is_concrete(coefficient):
        a = np.asarray(coefficient)
        _check_normal(a, "coefficient")
        if not np.all(np.isfinite(a)) or not np.all(a > 0):
            raise ValueError(f"coefficient must be finite and > 0 everywhere, got {_least(a)}")
        # split like the grid once, here: a coefficient committed to one device
        # (jax.device_put) would be refused by the compiled call's device check
        coefficient = place_on_mesh(coefficient, grid, mesh)
    else:
        coefficient = error_if(
            coefficient,
            ~jnp.all(jnp.isfinite(coefficient) & (coefficient > 0)),
            "coefficient must be finite and > 0 everywhere",
            grid,
            mesh,
        )
    return coefficient


def _check_shift(shift: Any, grid: Grid, method: str, mesh: Mesh | None) -> jax.Array | None:
    """The Helmholtz ``shift`` as an array of the grid's dtype (0-d or the grid's shape),
    checked like the coefficient: real, of a valid shape, finite and > 0 (in Python when
    concrete, through ``eqx.error_if`` when traced)."""
    if shift is None:
        return None
    if isinstance(shift, (str, bytes)) or jnp.iscomplexobj(shift):
        got = "a complex array" if jnp.iscomplexobj(shift) else repr(shift)
        raise ValueError(f"shift must be real (and > 0), got {got}")
    _check_positive_in_range(shift, "shift", grid.dtype)
    try:
        shift = jnp.asarray(shift)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"shift must be a positive number or a real array of the grid's shape, got "
            f"{shift!r:.80}"
        ) from err
    if shift.dtype == bool or not jnp.issubdtype(shift.dtype, jnp.number):
        raise ValueError(f"shift must be real (and > 0), got dtype {shift.dtype}")
    shift = shift.astype(grid.dtype)
    if shift.ndim and shift.shape != grid.shape:
        raise ValueError(
            f"shift must be a scalar or have the grid's shape {grid.shape}, got {shift.shape}"
        )
    if shift.ndim and method == "spectral":
        raise ValueError(
            "a shift field (varying in space) is not supported by method='spectral' (its "
            "eigenbasis needs a constant shift); use method='cg' or 'multigrid', or a "
            "scalar shift"
        )
    if is_concrete(shift):
        c = np.asarray(shift)
        _check_normal(c, "shift")
        if not np.all(np.isfinite(c)) or not np.all(c > 0):
            raise ValueError(f"{_SHIFT_NOT_POSITIVE}, got {_least(c)}")
        # split like the grid (a field) or replicated (a scalar) once, here
        return place_on_mesh(shift, grid, mesh)
    bad = ~jnp.all(jnp.isfinite(shift) & (shift > 0))
    return error_if(shift, bad, _SHIFT_NOT_POSITIVE, grid, mesh)  # on every device at once


def _inside_shard_map() -> bool:
    """Whether this is traced inside ``jax.shard_map`` (some mesh axis is manual)."""
    try:
        return bool(jax.sharding.get_abstract_mesh().manual_axes)
    except AttributeError:  # a jax without abstract meshes
        return False


def _times_power_of_two(x, n):
    """``x · 2^n``, exactly, in two factors: 2^n alone may lie outside the dtype's normal
    range (and be flushed to zero) where the product does not."""
    half = n // 2
    one = jnp.ones((), x.dtype)
    return x * jnp.ldexp(one, half) * jnp.ldexp(one, n - half)


def _relative_norm(r, b):
    """``‖r‖₂ / ‖b‖₂`` (0 when ``b = 0``), computed on ``r, b`` scaled by ``max |b|`` so
    that the sums of squares neither underflow nor overflow."""
    m = jnp.max(jnp.abs(b))
    m = jnp.where((m > 0) & jnp.isfinite(m), m, 1)
    bn = jnp.sqrt(jnp.sum(jnp.square(b / m)))
    return jnp.sqrt(jnp.sum(jnp.square(r / m))) / jnp.where(bn > 0, bn, 1)


@functools.lru_cache(maxsize=64)
def _mean_tolerance(dtype: np.dtype, size: int) -> float:
    return 100 * float(np.finfo(dtype).eps) * max(1.0, float(np.log2(size)))


def _fetch_floats(*values) -> tuple[float, ...]:
    """Python floats of scalars that a compiled call may still be computing, waited for
    first: ``jax.device_get`` of arrays not yet ready starts a host copy of each, which on
    XLA:CPU made a checked 1024² periodic solve ~0.3 ms (~6%) slower than waiting."""
    return tuple(float(v) for v in jax.block_until_ready(values))


@jax.jit
def _mean_and_scale(f):
    return jnp.mean(f), jnp.max(jnp.abs(f))


@jax.jit
def _max_abs(f):
    return jnp.max(jnp.abs(f))


_SAMPLED_ROWS = 16


def _on_the_host(f: jax.Array) -> bool:
    """Whether ``f`` is one array in host memory (a CPU device), which NumPy reads in place."""
    try:
        devices = f.devices()
    except AttributeError:
        return False
    return len(devices) == 1 and next(iter(devices)).platform == "cpu"


def _host_sampled_max_abs(f: jax.Array) -> float:
    """[`_sampled_max_abs`][] of a CPU array, read in place by NumPy (no copy)."""
    values = np.asarray(f)
    rows = values.reshape(-1, values.shape[-1])
    step = max(1, rows.shape[0] // _SAMPLED_ROWS)
    return float(np.max(np.abs(rows[::step])))


def _sampled_max_abs(f: jax.Array) -> jax.Array:
    """max |f| over about ``_SAMPLED_ROWS`` evenly spaced rows (along the last axis) of
    ``f``: a lower bound of max |f| that reads a few kilobytes instead of the field."""
    rows = f.reshape(-1, f.shape[-1])
    step = max(1, rows.shape[0] // _SAMPLED_ROWS)
    return jnp.max(jnp.abs(rows[::step]))


def solve(
    f: Field,
    grid: Grid,
    bc: Any = None,
    method: Method = "auto",
    *,
    coefficient: Any = None,
    shift: Any = None,
    boundary_values: Mapping[str, Any] | None = None,
    mesh: Mesh | None = None,
    initial_guess: Field | None = None,
    **options: Any,
) -> Field:
    r"""Solve ∇²u = f, or ∇·(a∇u) = f with ``coefficient=a``, on cell centres; with
    ``shift=c`` the Helmholtz (screened Poisson) problem ∇·(a∇u) - c u = f.

    A one-call front end to [`physjax.solvers.poisson.PoissonSolver`][] (which see for the
    discretisation, boundary conventions and every option); build the solver once
    instead when solving repeatedly.

    **Arguments:**

    - `f`: right-hand side at cell centres, shape ``(ny, nx)`` or ``(nz, ny, nx)``.
    - `grid`: the [`physjax.grids.Grid`][].
    - `bc`: boundary conditions per axis (``"periodic"``, ``"dirichlet"``, ``"neumann"``).
    - `method`: ``"spectral"``, ``"multigrid"``, ``"cg"`` or ``"auto"``.
    - `coefficient`: cell-centred ``a > 0`` (multigrid/cg).
    - `shift`: ``c > 0`` of the Helmholtz term, a scalar (every method) or a cell-centred
      field (multigrid/cg); no compatibility condition then, the zero mode is solved.
    - `boundary_values`: ``{"x": (low, high), …}`` wall values (Dirichlet: ``u`` on the
      wall; Neumann: ``∂u/∂x`` on the wall).
    - `mesh`: device mesh for a multi-device solve.
    - `initial_guess`: the first iterate of `multigrid`/`cg` (see
      [`physjax.solvers.poisson.PoissonSolver.solve`][]).
    - `options`: ``rtol``, ``atol``, ``max_iterations``, ``cycle``, ``smoothing``,
      ``max_coarse``, ``compatibility``, ``laplacian``, ``throw``.

    **Returns:** ``u``, the grid's shape.
    """
    solver = PoissonSolver(
        grid, bc, method, coefficient=coefficient, shift=shift, mesh=mesh, **options
    )
    return solver(f, boundary_values, initial_guess=initial_guess)
