"""Halo exchange between neighbouring devices with ``lax.ppermute``."""

from __future__ import annotations

import jax
import numpy as np
from jax import lax


def exchange_halo(
    field: jax.Array,
    *,
    axis: int,
    width: int,
    axis_name: str,
    num_blocks: int,
    periodic: bool,
) -> tuple[jax.Array, jax.Array]:
    """Receive the ``width`` slices that border this block along ``axis`` from its neighbours.

    Must be called inside ``shard_map`` where array ``axis`` is split over the mesh axis
    ``axis_name`` into ``num_blocks`` blocks. Returns ``(low, high)``: ``low`` holds the last
    ``width`` slices of the block below (``k - 1``), ``high`` the first ``width`` slices of
    the block above (``k + 1``). On a non-periodic axis the outermost blocks receive zeros
    on their outer side; the caller replaces those by the physical boundary condition.
    """
    if not -field.ndim <= axis < field.ndim:
        raise ValueError(f"axis={axis} is not an axis of the field of shape {field.shape}")
    n = field.shape[axis]
    if isinstance(width, np.integer):
        width = int(width)
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= n:
        raise ValueError(
            f"width must be a whole number from 1 to the block's {n} cells along axis {axis}, "
            f"got {width!r}"
        )
    try:
        size = lax.axis_size(axis_name)
    except NameError:
        raise ValueError(
            f"exchange_halo needs the mesh axis {axis_name!r}: call it inside jax.shard_map "
            "over a mesh with that axis (physjax.parallel.shard_map_fields does it)"
        ) from None
    # a wrong count exchanged with the wrong neighbours (or none) and returned no error
    if num_blocks != size:
        raise ValueError(
            f"num_blocks={num_blocks!r} but the mesh axis {axis_name!r} has {size} devices"
        )
    first = lax.slice_in_dim(field, 0, width, axis=axis)
    last = lax.slice_in_dim(field, n - width, n, axis=axis)
    up = [(k, k + 1) for k in range(num_blocks - 1)]
    down = [(k + 1, k) for k in range(num_blocks - 1)]
    if periodic:
        up.append((num_blocks - 1, 0))
        down.append((0, num_blocks - 1))
    low = lax.ppermute(last, axis_name, perm=up)
    high = lax.ppermute(first, axis_name, perm=down)
    return low, high
