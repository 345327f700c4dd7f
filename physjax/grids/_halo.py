"""Boundary conditions, applied in one place: by filling halos.

A field is padded by ``grid.halo`` cells on every side. Along a periodic axis the halo is
the wrapped interior; along a walled axis it mirrors the interior with a parity (``+1``: even,
zero normal gradient; ``-1``: odd, zero value on the wall); across a device boundary it is the
neighbour's data, received by [`physjax.parallel.exchange_halo`][]. Stencils applied to the
padded field never know which of these they see.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..parallel._halo import exchange_halo
from ._grid import Grid, Stagger, as_number, check_location


def _flip(x: jax.Array, axis: int) -> jax.Array:
    return lax.rev(x, (axis,))


def _wall_ghosts(
    field: jax.Array, axis: int, width: int, stagger: Stagger, parity: int
) -> tuple[jax.Array, jax.Array]:
    n = field.shape[axis]
    take = lambda a, b: lax.slice_in_dim(field, a, b, axis=axis)
    if parity == -1 and field.dtype == jnp.bool_:
        # jax said "neg does not accept dtype bool"
        raise TypeError(
            "fill_halo: the odd reflection at a wall (parity -1, which every face-located "
            "field on a walled axis takes) negates the field, and a boolean field cannot be "
            "negated: pass a numeric field (mask.astype(float)), or parity +1 for a centre one"
        )
    if stagger == "centre":
        # Wall half a cell beyond the first/last value: mirror about it. Negated, not
        # multiplied by the parity: 1 * a bool mask made it an integer array (int64 under
        # x64, on which ~mask is -2, true), and a NumPy float parity promoted float32
        low = _flip(take(0, width), axis)
        high = _flip(take(n - width, n), axis)
        return (low, high) if parity == 1 else (-low, -high)
    if parity != -1:
        raise ValueError(
            "a face-located field on a walled axis must have odd parity (-1): it is the normal "
            "component that vanishes on the wall"
        )
    # Face 0 lies on the low wall and face n on the high wall: odd reflection about each.
    zero = jnp.zeros_like(take(0, 1))
    if width < n:
        low = -_flip(take(1, width + 1), axis)
    else:  # width == n: the last ghost mirrors face n, the high wall, where the field is 0
        low = -_flip(jnp.concatenate([take(1, n), zero], axis=axis), axis)
    high = jnp.concatenate([zero, -_flip(take(n - width + 1, n), axis)], axis=axis)
    return low, high


def _pad_axis(
    field: jax.Array, grid: Grid, axis: int, stagger: Stagger, parity: int, width: int
) -> jax.Array:
    n = field.shape[axis]
    periodic = grid.periodic[axis]
    blocks = grid.mesh_shape[axis]
    name = grid.mesh_axes[axis]
    if blocks > 1 and name is not None:
        low, high = exchange_halo(
            field, axis=axis, width=width, axis_name=name, num_blocks=blocks, periodic=periodic
        )
        if not periodic:
            wall_low, wall_high = _wall_ghosts(field, axis, width, stagger, parity)
            k = lax.axis_index(name)
            low = jnp.where(k == 0, wall_low, low)
            high = jnp.where(k == blocks - 1, wall_high, high)
    elif periodic:
        low = lax.slice_in_dim(field, n - width, n, axis=axis)
        high = lax.slice_in_dim(field, 0, width, axis=axis)
    else:
        low, high = _wall_ghosts(field, axis, width, stagger, parity)
    return jnp.concatenate([low, field, high], axis=axis)


def fill_halo(
    field: jax.Array,
    grid: Grid,
    location: Sequence[Stagger] | None = None,
    parity: Sequence[int] | None = None,
    width: int | None = None,
) -> jax.Array:
    """Pad a field with a halo holding its boundary conditions.

    **Arguments:**

    - `field`: array of the grid's (local) shape, ``(ny, nx)`` or ``(nz, ny, nx)``.
    - `grid`: the [`physjax.grids.Grid`][]; decomposed grids exchange halos with neighbours.
    - `location`: stagger per axis, ``"centre"`` or ``"face"`` (default all centres).
    - `parity`: per axis (or one number for every axis), the reflection used at walls:
      ``+1`` even (free-slip tangential velocity, scalars with zero normal flux), ``-1`` odd
      (no-slip tangential velocity, homogeneous Dirichlet, normal velocity). Default ``+1``
      at centres, ``-1`` on faces; a face along a walled axis is the normal component,
      which vanishes on the wall, so only ``-1`` is accepted there. Of such a field the
      array holds faces ``0 … n−1``: face ``0`` lies on the low wall and is used as given
      (the ghosts mirror about it as if it were zero), so keep it zero, as physjax's solvers
      do in their states and tendencies; face ``n``, on the high wall, is not stored, and
      its ghost is zero.
    - `width`: halo width (default ``grid.halo``).

    **Returns:** the field padded by ``width`` on every side of every axis, corners included.
    """
    if not isinstance(field, (jax.Array, np.ndarray)):
        raise TypeError(
            f"field must be a jax or NumPy array, got {type(field).__name__}; wrap it in "
            "jnp.asarray(...)"
        )
    if not isinstance(grid, Grid):  # a number stopped on .ndim
        raise TypeError(f"grid must be a physjax.grids.Grid, got {type(grid).__name__}")
    nd = grid.ndim
    if field.ndim != nd:
        more = ""
        if field.ndim > nd and tuple(field.shape[-nd:]) == grid.local_shape:
            # a stack of fields: the halo rule is per field, and vmap gives it batch axes
            more = (
                f"; for a stack of {field.ndim - nd} leading batch axis(es) map over them: "
                "jax.vmap(lambda f: fill_halo(f, grid, ...))(fields)"
            )
        raise ValueError(
            f"field must have {nd} dimensions like the grid, got shape {field.shape}{more}"
        )
    if tuple(field.shape) != grid.local_shape:
        raise ValueError(f"field shape {field.shape} does not match the grid {grid.local_shape}")
    location = ("centre",) * nd if location is None else check_location(location, nd)
    if parity is None:
        parity = tuple(1 if s == "centre" else -1 for s in location)
    given = parity
    # a 0-d array is one number, as a NumPy integer is: it stopped with "iteration over a
    # 0-d array"
    parity = as_number(parity)
    if isinstance(parity, (int, np.integer)) and not isinstance(parity, bool):
        parity = (parity,) * nd  # one parity for every axis
    if not hasattr(parity, "__iter__") or isinstance(parity, str):
        raise ValueError(f"parity must give +1 or -1 for each of the {nd} axes, got {given!r}")
    parity = tuple(parity)
    # True == 1: a bool is not a parity
    if len(parity) != nd or not all(
        p in (1, -1) and not isinstance(p, (bool, np.bool_)) for p in parity
    ):
        raise ValueError(f"parity must give +1 or -1 for each of the {nd} axes, got {given!r}")
    width = grid.halo if width is None else width
    if isinstance(width, np.integer):
        width = int(width)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive integer, got {width!r}")
    for axis, (n, s) in enumerate(zip(field.shape, location)):
        # a face field on a wall mirrors faces 1..width: one more than the halo where the
        # axis is split (face n of a block is the neighbour's); on a whole axis face n is
        # the high wall, where the field is zero, so the halo may be as deep as the axis
        split = grid.mesh_shape[axis] > 1 and grid.mesh_axes[axis] is not None
        need = width + (1 if s == "face" and not grid.periodic[axis] and split else 0)
        if n < need:
            name = grid.axis_names[axis]
            raise ValueError(
                f"a block of n{name}={n} cells cannot fill a halo of width {width} along "
                f"{name} ({s} field{' on a walled axis' if need > width else ''}: needs "
                f"{need} cells); use a smaller width, or fewer devices along {name}"
            )
    # Pad the last axis first, then the others on the padded array, so corners are filled.
    for axis in reversed(range(nd)):
        field = _pad_axis(field, grid, axis, location[axis], parity[axis], width)
    return field


def interior(padded: jax.Array, grid: Grid, width: int | None = None) -> jax.Array:
    """Strip a halo of ``width`` (default ``grid.halo``) from every grid axis (the trailing
    ``grid.ndim`` axes, which must be the grid's local shape plus ``2 * width``; leading
    batch axes are kept)."""
    if not isinstance(padded, (jax.Array, np.ndarray)):  # a list stopped on .ndim
        raise TypeError(
            f"padded must be a jax or NumPy array, got {type(padded).__name__}; wrap it in "
            "jnp.asarray(...)"
        )
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a physjax.grids.Grid, got {type(grid).__name__}")
    w = grid.halo if width is None else width
    if isinstance(w, np.integer):
        w = int(w)
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        raise ValueError(f"width must be a whole number >= 0, got {width!r}")
    if padded.ndim < grid.ndim:
        raise ValueError(
            f"padded must have at least the grid's {grid.ndim} dimensions, got shape {padded.shape}"
        )
    if w == 0:
        return padded
    for axis, n in zip(grid.axis_names, padded.shape[-grid.ndim :]):
        if n <= 2 * w:
            raise ValueError(
                f"padded has {n} points along {axis}: nothing is left inside a halo of "
                f"width {w} on each side"
            )
    trailing = tuple(padded.shape[-grid.ndim :])
    expected = tuple(n + 2 * w for n in grid.local_shape)
    if trailing != expected:
        # an unpadded field lost its outermost cells, and a field of another grid was cut to
        # some shape, without a word
        unpadded = " (the unpadded shape: there is no halo to strip)"
        raise ValueError(
            f"padded has shape {tuple(padded.shape)}: a field of this grid "
            f"{grid.local_shape} padded by a halo of width {w} ends in {expected}"
            f"{unpadded if trailing == tuple(grid.local_shape) else ''}"
        )
    return padded[(Ellipsis,) + (slice(w, -w),) * grid.ndim]
