"""Second-order staggered stencils, named by axis and by the locations they map between.

``c2f`` maps cell centres to the low faces (index ``i`` uses ``i - 1`` and ``i``), ``f2c``
maps faces to centres (index ``i`` uses ``i`` and ``i + 1``). Along one axis corners behave as
faces, so ``diff_x_c2f`` takes a v-point field to a corner and ``interp_y_f2c`` a corner to a
u-point. They act on halo-padded fields (see [`physjax.grids.fill_halo`][]) and keep the
shape: the outermost halo layer of the result is not meaningful, the interior is exact.
A bool or integer field (a land/sea mask) is taken in the default floating dtype first.
Shifts are written as slice-and-zero-pad so that XLA fuses whole stencil expressions into
a few loops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._grid import Grid


def _shift(f: jax.Array, k: int, axis: int) -> jax.Array:
    """``out[i] = f[i - k]`` with zeros shifted in: a slice and a zero pad, both of which XLA
    fuses into the consuming loop (``jnp.roll`` becomes a concatenate that it does not)."""
    _check_field(f)
    if -axis > f.ndim:  # -3 would wrap to x on a 2-D field
        raise ValueError(
            f"a stencil along {'zyx'[axis + 3]} needs a field of ≥ {-axis} dimensions "
            f"(z, y, x), got shape {f.shape}"
        )
    axis = axis % f.ndim
    n = f.shape[axis]
    config = [(0, 0, 0)] * f.ndim
    if k > 0:
        part = lax.slice_in_dim(f, 0, n - k, axis=axis)
        config[axis] = (k, 0, 0)
    else:
        part = lax.slice_in_dim(f, -k, n, axis=axis)
        config[axis] = (0, -k, 0)
    return lax.pad(part, jnp.zeros((), f.dtype), config)


def _check_field(f) -> None:
    # a Grid (arguments swapped) or a list stopped inside lax.slice or on ``.ndim``
    if not isinstance(f, (jax.Array, np.ndarray)):
        raise TypeError(
            f"a stencil takes a halo-padded field (a jax or NumPy array) first, then the grid "
            f"where it needs one, got {type(f).__name__} for the field"
        )


def _real(f: jax.Array) -> jax.Array:
    """A bool or integer field (a land/sea mask) in the default floating dtype, the dtype a
    stencil gives it anyway, before any arithmetic: ``True + True`` is ``True`` and int8
    sums wrap, so the average of two sea cells was 0.5 and ``100 + 100`` in int8 was -56
    (differences of a bool field stopped in ``sub``). A floating field is returned as it is
    (the choice is made when tracing, at no cost)."""
    _check_field(f)
    if jnp.issubdtype(f.dtype, jnp.inexact):
        return f
    return f.astype(jnp.result_type(f.dtype, 0.5))


def _check_grid(grid) -> None:
    if not isinstance(grid, Grid):
        raise TypeError(
            f"grid must be a physjax.grids.Grid, got {type(grid).__name__}: stencils take "
            "(field, grid)"
        )


def _back(f: jax.Array, axis: int) -> jax.Array:
    return _shift(f, 1, axis)


def _fwd(f: jax.Array, axis: int) -> jax.Array:
    return _shift(f, -1, axis)


def _spacing(grid: Grid, axis: int):
    _check_grid(grid)
    if -axis > grid.ndim:
        raise ValueError(f"a difference along z needs a 3-D grid, got a {grid.ndim}-D one")
    return grid.spacing[axis]


def _diff_c2f(f, grid: Grid, axis: int):
    f = _real(f)
    return (f - _back(f, axis)) / _spacing(grid, axis)


def _diff_f2c(f, grid: Grid, axis: int):
    f = _real(f)
    return (_fwd(f, axis) - f) / _spacing(grid, axis)


def _interp_c2f(f, axis: int):
    f = _real(f)
    return 0.5 * (f + _back(f, axis))


def _interp_f2c(f, axis: int):
    f = _real(f)
    return 0.5 * (_fwd(f, axis) + f)


def diff_x_c2f(f: jax.Array, grid: Grid) -> jax.Array:
    """∂/∂x from x-centres to x-faces: ``(f[i] - f[i-1]) / dx``."""
    return _diff_c2f(f, grid, -1)


def diff_x_f2c(f: jax.Array, grid: Grid) -> jax.Array:
    """∂/∂x from x-faces to x-centres: ``(f[i+1] - f[i]) / dx``."""
    return _diff_f2c(f, grid, -1)


def diff_y_c2f(f: jax.Array, grid: Grid) -> jax.Array:
    """∂/∂y from y-centres to y-faces: ``(f[j] - f[j-1]) / dy``."""
    return _diff_c2f(f, grid, -2)


def diff_y_f2c(f: jax.Array, grid: Grid) -> jax.Array:
    """∂/∂y from y-faces to y-centres: ``(f[j+1] - f[j]) / dy``."""
    return _diff_f2c(f, grid, -2)


def diff_z_c2f(f: jax.Array, grid: Grid) -> jax.Array:
    """∂/∂z from z-centres to z-faces (3-D grids)."""
    return _diff_c2f(f, grid, -3)


def diff_z_f2c(f: jax.Array, grid: Grid) -> jax.Array:
    """∂/∂z from z-faces to z-centres (3-D grids)."""
    return _diff_f2c(f, grid, -3)


def interp_x_c2f(f: jax.Array) -> jax.Array:
    """Average from x-centres to x-faces: ``(f[i-1] + f[i]) / 2``."""
    return _interp_c2f(f, -1)


def interp_x_f2c(f: jax.Array) -> jax.Array:
    """Average from x-faces to x-centres: ``(f[i] + f[i+1]) / 2``."""
    return _interp_f2c(f, -1)


def interp_y_c2f(f: jax.Array) -> jax.Array:
    """Average from y-centres to y-faces: ``(f[j-1] + f[j]) / 2``."""
    return _interp_c2f(f, -2)


def interp_y_f2c(f: jax.Array) -> jax.Array:
    """Average from y-faces to y-centres: ``(f[j] + f[j+1]) / 2``."""
    return _interp_f2c(f, -2)


def interp_z_c2f(f: jax.Array) -> jax.Array:
    """Average from z-centres to z-faces (3-D grids)."""
    return _interp_c2f(f, -3)


def interp_z_f2c(f: jax.Array) -> jax.Array:
    """Average from z-faces to z-centres (3-D grids)."""
    return _interp_f2c(f, -3)


def laplacian(f: jax.Array, grid: Grid) -> jax.Array:
    """Five-point (2-D) or seven-point (3-D) Laplacian of a halo-padded field, any location.
    The grid's axes are the trailing ones of ``f``; leading (batch) axes are kept."""
    f = _real(f)
    _check_grid(grid)
    if f.ndim < grid.ndim:
        raise ValueError(f"f must have at least the grid's {grid.ndim} axes, got shape {f.shape}")
    out = jnp.zeros_like(f)
    for k in range(grid.ndim):
        axis = k - grid.ndim  # counted from the end, as the other stencils do
        d2 = grid.spacing[k] ** 2
        out = out + (_fwd(f, axis) - 2 * f + _back(f, axis)) / d2
    return out
