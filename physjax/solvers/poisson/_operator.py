"""Boundary conditions and the discrete elliptic operator ∇·(a∇u) on cell centres.

The operator is the standard second-order, conservative, cell-centred stencil. Along an
axis with spacing ``h`` and face coefficients ``a_{i±1/2}``

    (A u)_i = [a_{i+1/2} (u_{i+1} - u_i) - a_{i-1/2} (u_i - u_{i-1})] / h²,

summed over the axes. Walls lie half a cell beyond the first and last centres; the ghost
value beyond a wall is the odd (Dirichlet) or even (Neumann) reflection of the first cell,
which is exactly what [`physjax.grids.fill_halo`][] does with parity ``-1`` / ``+1``.
Inhomogeneous boundary values are moved to the right-hand side by
[`physjax.solvers.poisson.fold_boundary_values`][], so every solver works on the
homogeneous operator.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...grids import Grid, fill_halo

BOUNDARY_CONDITIONS = ("periodic", "dirichlet", "neumann")


def _guess(given: Any) -> str:
    """`` (did you mean 'neumann'?)`` for a misspelt or capitalised condition, else ``""``."""
    if not isinstance(given, str):
        return ""
    close = difflib.get_close_matches(given.strip().lower(), BOUNDARY_CONDITIONS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def normalise_bc(bc: Any, grid: Grid) -> tuple[str, ...]:
    """Boundary condition per axis in grid order, checked against ``grid.periodic``."""
    names = grid.axis_names
    if bc is None:
        out = tuple("periodic" if p else "dirichlet" for p in grid.periodic)
    elif isinstance(bc, (bytes, bytearray)):  # was taken for a sequence of 9 conditions
        raise ValueError(f"bc must be a str, not bytes: got {bc!r}")
    elif isinstance(bc, str):
        if bc not in BOUNDARY_CONDITIONS:
            raise ValueError(f"bc must be one of {BOUNDARY_CONDITIONS}, got {bc!r}{_guess(bc)}")
        if bc == "periodic":
            out = ("periodic",) * grid.ndim
        elif all(grid.periodic):  # a wall condition with no wall to take it: a mistake
            raise ValueError(
                f"bc is {bc!r} but the grid is periodic along every axis {names}; build the "
                f"grid with periodic=False on the walled axes (Grid is periodic by default) "
                f"or use bc='periodic'"
            )
        else:
            # One wall condition for every walled axis; periodic axes stay periodic.
            out = tuple("periodic" if p else bc for p in grid.periodic)
    elif isinstance(bc, Mapping):
        # keys are axis names: an index (0, or np.int64(1)) is refused as such, naming the
        # axis it would be (sorting a mix of str and int keys stopped with a TypeError)
        indices = [
            int(k) for k in bc if isinstance(k, (int, np.integer)) and not isinstance(k, bool)
        ]
        if indices:
            meant = ", ".join(
                f"{k!r} -> {names[k]!r}" for k in indices if -len(names) <= k < len(names)
            )
            raise ValueError(
                f"bc's keys are axis names {names}, not indices: got {indices}"
                + (f" (in grid order: {meant})" if meant else "")
            )
        unknown = [k for k in bc if k not in names]
        if unknown:
            raise ValueError(
                f"bc has entries for unknown axes {sorted(unknown, key=repr)}; axes are {names}"
            )
        out = tuple(
            bc.get(n, "periodic" if p else "dirichlet") for n, p in zip(names, grid.periodic)
        )
    elif isinstance(bc, Sequence):
        out = tuple(bc)
        if len(out) != grid.ndim:
            raise ValueError(
                f"bc must give one condition per axis {names}, got {len(out)} entries: {bc!r}"
            )
    else:
        raise ValueError(f"bc must be None, a string, a sequence or a mapping, got {bc!r}")
    for name, kind, periodic in zip(names, out, grid.periodic):
        if kind not in BOUNDARY_CONDITIONS:
            raise ValueError(
                f"bc for axis {name} must be one of {BOUNDARY_CONDITIONS}, got {kind!r}"
                f"{_guess(kind)}"
            )
        if periodic and kind != "periodic":
            raise ValueError(
                f"bc for axis {name} is {kind!r} but the grid is periodic along {name}; "
                f"build the grid with periodic=False on that axis or use bc='periodic'"
            )
        if not periodic and kind == "periodic":
            raise ValueError(
                f"bc for axis {name} is 'periodic' but the grid has walls along {name}; "
                f"use 'dirichlet' or 'neumann', or build the grid periodic on that axis"
            )
    # plain str: a NumPy string (np.str_, from an array of names or a file's attributes)
    # kept in the solver's static fields made equinox warn "A JAX array is being set as
    # static!"
    return tuple(str(kind) for kind in out)


def parity_of(bc: Sequence[str]) -> tuple[int, ...]:
    """Halo parity per axis: odd for Dirichlet, even for Neumann (ignored when periodic)."""
    return tuple(-1 if b == "dirichlet" else 1 for b in bc)


def is_singular(bc: Sequence[str]) -> bool:
    """True when constants are in the null space (no Dirichlet axis)."""
    return "dirichlet" not in bc


def _centre(up: jax.Array, ndim: int, axis: int = 0, shift: int = 0) -> jax.Array:
    """Interior of a width-1 padded array, shifted by ``shift`` along ``axis``."""
    idx = []
    for a in range(ndim):
        s = shift if a == axis else 0
        idx.append(slice(1 + s, up.shape[a] - 1 + s))
    return up[tuple(idx)]


def face_coefficients(a: jax.Array, grid: Grid) -> tuple[jax.Array, ...]:
    """Arithmetic means of a cell-centred coefficient on the faces of each axis.

    Entry ``k`` has the local shape with ``n + 1`` along axis ``k``: every low face plus the
    high face of the last cell. At a wall the face value is the adjacent cell's value.
    """
    d = grid.ndim
    ap = fill_halo(a, grid, parity=(1,) * d, width=1)
    faces = []
    for axis in range(d):
        idx = []
        for b in range(d):
            idx.append(slice(None) if b == axis else slice(1, ap.shape[b] - 1))
        strip = ap[tuple(idx)]
        n = strip.shape[axis]
        lo = lax.slice_in_dim(strip, 0, n - 1, axis=axis)
        hi = lax.slice_in_dim(strip, 1, n, axis=axis)
        faces.append(0.5 * (lo + hi))
    return tuple(faces)


def apply_operator(
    u: jax.Array,
    grid: Grid,
    parity: Sequence[int],
    faces: Sequence[jax.Array] | None = None,
    shift: jax.Array | None = None,
) -> jax.Array:
    """Homogeneous ∇·(a∇u) (``faces`` given) or ∇²u (``faces=None``) of a local field,
    minus ``shift · u`` when a ``shift`` (a scalar or a local cell-centred field) is given."""
    d = grid.ndim
    up = fill_halo(u, grid, parity=tuple(parity), width=1)
    out = jnp.zeros_like(u)
    for axis in range(d):
        inv_h2 = 1.0 / grid.spacing[axis] ** 2
        plus = _centre(up, d, axis, 1)
        minus = _centre(up, d, axis, -1)
        if faces is None:
            out = out + (plus - 2 * u + minus) * inv_h2
        else:
            n = u.shape[axis]
            a_lo = lax.slice_in_dim(faces[axis], 0, n, axis=axis)
            a_hi = lax.slice_in_dim(faces[axis], 1, n + 1, axis=axis)
            out = out + (a_hi * (plus - u) - a_lo * (u - minus)) * inv_h2
    if shift is not None:
        out = out - shift * u
    return out


def operator_diagonal(
    grid: Grid,
    parity: Sequence[int],
    faces: Sequence[jax.Array] | None,
    dtype: Any,
    shift: jax.Array | None = None,
) -> jax.Array:
    """Diagonal of [`apply_operator`][] on the local block (walls included, and ``-shift``
    when a shift is given)."""
    d = grid.ndim
    shape = grid.local_shape
    diag = jnp.zeros(shape, dtype)
    for axis in range(d):
        inv_h2 = 1.0 / grid.spacing[axis] ** 2
        n = shape[axis]
        if faces is None:
            a_lo = jnp.ones(shape, dtype)
            a_hi = a_lo
        else:
            a_lo = lax.slice_in_dim(faces[axis], 0, n, axis=axis)
            a_hi = lax.slice_in_dim(faces[axis], 1, n + 1, axis=axis)
        diag = diag - (a_lo + a_hi) * inv_h2
        if not grid.periodic[axis]:
            idx = grid.local_index(axis)
            bshape = [1] * d
            bshape[axis] = n
            first = (idx == 0).reshape(bshape)
            last = (idx == grid.shape[axis] - 1).reshape(bshape)
            p = parity[axis]
            diag = diag + p * inv_h2 * (jnp.where(first, a_lo, 0) + jnp.where(last, a_hi, 0))
    if shift is not None:
        diag = diag - shift
    return diag


def _wall_slice(ndim: int, axis: int, index: int) -> tuple:
    return tuple(index if a == axis else slice(None) for a in range(ndim))


def _wall_coefficient(a: jax.Array, axis: int, side: int) -> jax.Array:
    """``a`` on a wall, extrapolated from the two nearest cells linearly in ``log a``:
    ``a₀^{3/2} a₁^{-1/2}``, second-order accurate and positive. (The first cell's value
    alone is an O(h) error in the flux ``a q`` a Neumann wall carries, which made a
    variable-coefficient solve with inhomogeneous Neumann values first-order accurate.)"""
    d = a.ndim
    n = a.shape[axis]
    a0 = a[_wall_slice(d, axis, side)]
    if n < 2:
        return a0
    a1 = a[_wall_slice(d, axis, 1 if side == 0 else n - 2)]
    return a0 * jnp.sqrt(a0 / a1)


def fold_boundary_values(
    f: jax.Array,
    grid: Grid,
    bc: Any = None,
    boundary_values: Mapping[str, Any] | None = None,
    coefficient: jax.Array | None = None,
) -> jax.Array:
    """Move inhomogeneous wall values into the right-hand side.

    With the wall half a cell beyond the first centre, a Dirichlet value ``g`` at the wall
    sets the ghost to ``2g - u_0`` and a Neumann value ``q = ∂u/∂x`` at the wall sets it to
    ``u_0 - h q`` (low wall) or ``u_{n-1} + h q`` (high wall). Subtracting the homogeneous
    operator leaves, in the boundary-adjacent cells,

    - Dirichlet: ``f_0 ← f_0 - 2 a g_low / h²`` and ``f_{n-1} ← f_{n-1} - 2 a g_high / h²``;
    - Neumann: ``f_0 ← f_0 + a q_low / h`` and ``f_{n-1} ← f_{n-1} - a q_high / h``,

    where ``a`` is the coefficient of the adjacent cell for Dirichlet values (as in the
    operator's wall face) and, for Neumann values, the coefficient on the wall itself
    (extrapolated from the two nearest cells, linearly in ``log a``): the wall flux
    ``a q`` then has second-order accuracy. ``a = 1`` for the Laplacian.

    **Arguments:**

    - `f`: right-hand side, the grid's global shape.
    - `grid`: the [`physjax.grids.Grid`][].
    - `bc`: boundary conditions (see [`physjax.solvers.poisson.solve`][]).
    - `boundary_values`: mapping from an axis name (``"x"``, ``"y"``, ``"z"``) to a pair
      ``(low, high)``; each a scalar or an array of the wall's shape (the grid shape with that
      axis removed), or ``None`` for zero. Dirichlet: the value of ``u`` on the wall.
      Neumann: the derivative of ``u`` along the axis (not the outward normal) on the wall.
    - `coefficient`: the cell-centred coefficient ``a``, of the grid's shape or one number
      for every cell, as [`physjax.solvers.poisson.PoissonSolver`][] takes it (default 1).

    **Returns:** the right-hand side of the equivalent homogeneous problem.
    """
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a physjax.grids.Grid, got {type(grid).__name__}")
    bcs = normalise_bc(bc, grid)
    # Checked as the solver checks f: an f of another shape had the values of a wall beyond
    # its last row dropped without a word (out-of-bounds updates are skipped), and a
    # complex f lost its imaginary part.
    try:
        given = jnp.asarray(f)
    except (TypeError, ValueError) as err:  # strings, ragged lists
        raise ValueError(
            f"f must be a real array of the grid's shape {grid.shape}, got {f!r:.80} ({err!s:.80})"
        ) from None
    if jnp.iscomplexobj(given) or given.dtype == bool:
        raise ValueError(f"f must be real, got dtype {given.dtype}")
    if given.shape != grid.shape:
        raise ValueError(
            f"f must have the grid's shape {grid.shape} ({' '.join(grid.axis_names)}), got "
            f"{given.shape}; use jax.vmap for batches"
        )
    f = given.astype(grid.dtype)  # as the solver does (an integer f kept no wall value)
    if coefficient is not None:
        a = jnp.asarray(coefficient)
        if jnp.iscomplexobj(a) or a.dtype == bool:
            raise ValueError(f"coefficient must be real (and > 0), got dtype {a.dtype}")
        if a.ndim == 0:  # one number for every cell, as the solver takes it
            a = jnp.broadcast_to(a, grid.shape)
        if a.shape != grid.shape:  # was broadcast against the wall's cells
            raise ValueError(
                f"coefficient must be one number or have the grid's shape {grid.shape}, got "
                f"{a.shape}"
            )
        coefficient = a
    if not boundary_values:
        return f
    if not isinstance(boundary_values, Mapping):
        raise ValueError(
            "boundary_values must be a mapping from axis name to (low, high), "
            f"got {type(boundary_values).__name__}"
        )
    d = grid.ndim
    for name, pair in boundary_values.items():
        if name not in grid.axis_names:
            raise ValueError(
                f"boundary_values has an entry for unknown axis {name!r}; axes are "
                f"{grid.axis_names}"
            )
        axis = grid.axis_names.index(name)
        kind = bcs[axis]
        if kind == "periodic":
            raise ValueError(
                f"boundary_values given for axis {name}, which is periodic: it has no walls"
            )
        if not (isinstance(pair, Sequence) and len(pair) == 2):
            raise ValueError(f"boundary_values[{name!r}] must be a pair (low, high), got {pair!r}")
        wall_shape = tuple(n for a, n in enumerate(grid.shape) if a != axis)
        h = grid.spacing[axis]
        # (index, sign of a Neumann flux): on an axis one cell wide both walls are cell 0
        for (index, sign), value in zip(((0, 1.0), (grid.shape[axis] - 1, -1.0)), pair):
            if value is None:
                continue
            dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
            if dtype.kind not in "iuf":
                got = f"an array of {dtype}" if hasattr(value, "dtype") else repr(value)[:80]
                raise ValueError(
                    f"boundary_values[{name!r}] entries must be real numbers or real arrays, "
                    f"got {got}"
                )
            value = jnp.asarray(value, f.dtype)
            if value.ndim not in (0, len(wall_shape)) or (
                value.ndim and tuple(value.shape) != wall_shape
            ):
                raise ValueError(
                    f"boundary_values[{name!r}] entries must be scalars or arrays of the wall "
                    f"shape {wall_shape}, got shape {value.shape}"
                )
            sl = _wall_slice(d, axis, index)
            if kind == "dirichlet":
                a = 1.0 if coefficient is None else coefficient[sl]
                delta = -2.0 * a * value / h**2
            else:
                a = 1.0 if coefficient is None else _wall_coefficient(coefficient, axis, index)
                delta = sign * a * value / h
            f = f.at[sl].add(jnp.broadcast_to(delta, wall_shape).astype(f.dtype))
    return f
