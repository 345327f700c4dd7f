"""Device meshes and ``shard_map`` execution of grid computations."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .._custom_types import is_concrete
from ..grids import AXIS_NAMES_2D, AXIS_NAMES_3D, Grid


def _default_layout(n: int, ndim: int) -> tuple[int, ...]:
    # Split the slowest (outermost) axis first: those halos are contiguous in memory.
    # Among factorisations prefer the most square one with the larger factor first.
    best = None
    for p in range(1, n + 1):
        if n % p:
            continue
        q = n // p
        if p < q:
            continue
        score = p / q
        if best is None or score < best[0]:
            best = (score, p, q)
    _, p, q = best
    return (p, q) if ndim == 2 else (1, p, q)


def make_mesh(devices: int | Sequence[int] | None = None, ndim: int | None = None) -> Mesh:
    """A device mesh whose axes are named like the grid's: ``("y", "x")`` or ``("z", "y", "x")``.

    **Arguments:**

    - `devices`: the number of devices (laid out as square as possible over y and x, y
      split first: 4 → 2×2, 2 → 2×1, 8 → 4×2; in 3-D z is not split: 4 → 1×2×2, which
      suits thin layers and keeps vertical columns on one device), or the layout itself,
      e.g. ``(4, 1)`` or ``(2, 1, 2)`` — one positive integer per grid axis. Default: all
      available devices.
    - `ndim`: 2 or 3, the grid's number of dimensions. Default: the layout's length when
      a layout is given (``(1, 2, 2)`` is 3-D), else 2; when given, a layout must match it.
    """
    if isinstance(devices, Grid):
        raise TypeError(
            "make_mesh takes a number of devices or a layout, not a Grid: "
            f"make_mesh(4, ndim={devices.ndim}) or make_mesh((2, 2)); solvers take the grid "
            "and the mesh separately (mesh=)"
        )
    if ndim is not None and (
        not isinstance(ndim, (int, np.integer))
        or isinstance(ndim, (bool, np.bool_))
        or ndim not in (2, 3)
    ):  # ndim=2.0 was taken for 2
        raise ValueError(f"ndim must be 2 or 3, got {ndim!r}")
    available = jax.devices()
    if devices is None:
        devices = len(available)
    if isinstance(devices, jax.Array) and is_concrete(devices):
        # jnp.array(4) stopped with "iteration over a 0-d array", jnp.array([2, 2]) was
        # refused while np.array([2, 2]) was taken
        devices = np.asarray(devices)
    if isinstance(devices, np.ndarray) and devices.ndim == 0:  # np.array(4) is a count
        devices = devices[()]
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if devices < 1:
            raise ValueError(f"devices must be a positive integer, got {devices}")
        ndim = 2 if ndim is None else ndim
        layout = _default_layout(int(devices), ndim)
    else:
        entries = tuple(devices) if hasattr(devices, "__iter__") else (devices,)
        if not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))
            for d in entries
        ):
            raise ValueError(
                "devices must be a number of devices or a layout of "
                f"{ndim or '2 or 3'} positive integers, "
                f"got {devices!r}"
            )
        layout = tuple(int(d) for d in entries)
        given_ndim = ndim
        if ndim is None and len(layout) in (2, 3):
            ndim = len(layout)
        ndim = 2 if ndim is None else ndim
        if len(layout) != ndim or any(d < 1 for d in layout):
            if given_ndim is None and len(layout) not in (2, 3):
                # (2, 2, 1, 1) was told it needs 2 entries, as if 2-D had been asked for
                need, axes = "2 or 3", "y×x or z×y×x"
            else:
                need, axes = ndim, "z×y×x" if ndim == 3 else "y×x"
            raise ValueError(
                f"a device layout needs {need} positive entries, one per grid axis ({axes}), "
                f"got {devices}"
            )
    n = math.prod(layout)
    if n > len(available):
        raise ValueError(
            f"devices={n} requested but only {len(available)} available "
            f"({available[0].platform}); on a CPU simulate more with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} set before jax is imported"
        )
    names = AXIS_NAMES_2D if ndim == 2 else AXIS_NAMES_3D
    grid_of_devices = np.asarray(available[:n]).reshape(layout)
    auto = getattr(getattr(jax.sharding, "AxisType", None), "Auto", None)
    if auto is None:  # a jax without axis types: every mesh axis is Auto already
        return Mesh(grid_of_devices, names)
    # the halo exchange needs Auto axes (decompose refuses others); asked for by name so
    # a jax whose Mesh default changes (as jax.make_mesh's did, to Explicit) still works
    return Mesh(grid_of_devices, names, axis_types=(auto,) * ndim)


def field_spec(grid: Grid, mesh: Mesh, batch_dims: int = 0) -> PartitionSpec:
    """PartitionSpec of a field on ``grid`` (with ``batch_dims`` leading axes unsplit)."""
    _check_mesh_axes(grid, mesh)  # a 2-D mesh for a 3-D grid stopped with KeyError: 'z'
    if (
        isinstance(batch_dims, (bool, np.bool_))
        or not isinstance(batch_dims, (int, np.integer))
        or batch_dims < 0
    ):
        raise ValueError(f"batch_dims must be a whole number >= 0, got {batch_dims!r}")
    axes = tuple(name if mesh.shape[name] > 1 else None for name in grid.axis_names)
    return PartitionSpec(*((None,) * batch_dims + axes))


def decompose(grid: Grid, mesh: Mesh) -> Grid:
    """The grid as seen from one device of ``mesh``; raises if the mesh does not divide it."""
    _check_mesh_axes(grid, mesh)
    # jax.make_mesh's default (Explicit axes) failed later inside shard_map or a stencil's
    # slice with jax's sharding-in-types messages: the halo exchange needs Auto axes
    kinds = tuple(getattr(t, "name", str(t)) for t in getattr(mesh, "axis_types", ()))
    if mesh.size > 1 and any(k != "Auto" for k in kinds):
        raise ValueError(
            f"mesh axes {tuple(mesh.axis_names)} have axis_types {kinds}; physjax splits "
            "fields by shard_map over Auto axes: build the mesh with "
            f"physjax.parallel.make_mesh(n, ndim={grid.ndim}), or jax.make_mesh(..., "
            f"axis_types=(jax.sharding.AxisType.Auto,) * {grid.ndim})"
        )
    return grid.on_mesh(grid.axis_names, tuple(mesh.shape[a] for a in grid.axis_names))


def _check_mesh_axes(grid: Grid, mesh: Mesh) -> None:
    _check_types(grid, mesh)
    if mesh is None:
        raise TypeError(
            "mesh must be a jax.sharding.Mesh, got None: build it with "
            f"physjax.parallel.make_mesh(n, ndim={grid.ndim})"
        )
    names = tuple(mesh.axis_names)
    if set(names) != set(grid.axis_names):
        raise ValueError(
            f"mesh axes {names} must be named like the grid axes {grid.axis_names}; "
            f"build it with physjax.parallel.make_mesh(n, ndim={grid.ndim}) or a layout of "
            f"{grid.ndim} entries"
        )


def _check_types(grid: Grid, mesh: Mesh | None) -> None:
    # None, a count or arguments swapped stopped with AttributeError on axis_names/on_mesh
    if not isinstance(grid, Grid):
        raise TypeError(f"grid must be a physjax.grids.Grid, got {type(grid).__name__}")
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}: build it with "
            f"physjax.parallel.make_mesh(n, ndim={grid.ndim})"
        )


def _is_field(x: Any, grid: Grid) -> bool:
    shape = getattr(x, "shape", None)
    return (
        shape is not None and len(shape) >= grid.ndim and tuple(shape[-grid.ndim :]) == grid.shape
    )


def _specs(tree: Any, grid: Grid, mesh: Mesh) -> Any:
    def spec(x):
        if _is_field(x, grid):
            return field_spec(grid, mesh, batch_dims=len(x.shape) - grid.ndim)
        return PartitionSpec()

    return jax.tree.map(spec, tree)


def shard(tree: Any, grid: Grid, mesh: Mesh) -> Any:
    """Place every field-shaped array of ``tree`` on ``mesh``, split like the grid; replicate
    the rest (scalars, small arrays). Inside ``jit``/``vmap`` a traced array is constrained to
    that sharding (``jax.lax.with_sharding_constraint``, whose batching rule leaves a
    ``vmap`` axis unsplit)."""
    decompose(grid, mesh)
    specs = _specs(tree, grid, mesh)

    def place(x, s):
        if not eqx.is_array(x):
            return x
        if is_concrete(x):
            return jax.device_put(x, NamedSharding(mesh, s))
        # device_put of a tracer keeps the spec under vmap (splitting the wrong axes, or
        # failing with IndivisibleError) and inside jit leaves the result replicated
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s))

    return jax.tree.map(place, tree, specs)


def place_on_mesh(tree: Any, grid: Grid, mesh: Mesh | None) -> Any:
    """[`shard`][physjax.parallel.shard] ``tree`` onto ``mesh`` when every array in it has a
    value (called eagerly), so that arrays committed to one device (``jax.device_put``) can
    enter a compiled call on the mesh; unchanged inside ``jit``/``vmap``/``grad`` (tracers
    are placed by the enclosing transformation) or without a mesh of several devices."""
    if mesh is None or mesh.size == 1:
        return tree
    if not all(is_concrete(x) for x in jax.tree.leaves(tree)):
        return tree
    return shard(tree, grid, mesh)


def shard_map_fields(fn: Callable[..., Any], grid: Grid, mesh: Mesh | None) -> Callable[..., Any]:
    """Run ``fn(grid, *args)`` on one device or split over ``mesh`` by ``shard_map``.

    Every field-shaped array among the arguments and results (trailing axes equal to
    ``grid.shape``) is split like the grid; everything else is replicated. Inside, ``fn``
    receives the decomposed grid, whose [`physjax.grids.fill_halo`][] exchanges halos with
    the neighbouring devices; the same stencil code thus runs on 1 or N devices. ``fn``
    must work on the undecomposed grid as well (the result shapes are taken from a call on
    it, and with one device it is all there is), so it may not use collectives such as
    ``lax.psum``: return the fields and reduce them outside (``jnp.sum`` of a sharded
    result is a global sum). Non-field results are replicated: compute them identically on
    every device. On a mesh of several devices the call is compiled (``eqx.filter_jit``,
    once per ``fn``, grid, mesh and argument shapes; arguments that are not arrays, such as
    Python numbers, are static: a new value compiles again).
    """
    _check_types(grid, mesh)  # a count for the mesh stopped on mesh.size
    if mesh is None or mesh.size == 1:

        def whole(*args):
            # refused here too: a padded result passed on one device and was refused only
            # once the same code ran on a mesh
            out = fn(grid, *args)
            _refuse_padded(out, grid)
            return out

        return whole
    decompose(grid, mesh)  # a mesh that does not divide the grid is refused here, eagerly

    def wrapped(*args):
        return _shard_map_call(fn, grid, mesh, args)

    return wrapped


@eqx.filter_jit
def _shard_map_call(fn: Callable[..., Any], grid: Grid, mesh: Mesh, args: tuple) -> Any:
    """``shard_map_fields``'s call on a mesh of several devices, compiled once per ``fn``,
    grid, mesh and argument layout: called eagerly, a ``jax.shard_map`` of a new function
    compiled its body again, operation by operation, at every call (67 programs and 2-3 s
    for a 256² Laplacian on a 2×2 mesh that runs in 1 ms compiled)."""
    local = decompose(grid, mesh)
    arrays, static = eqx.partition(args, eqx.is_array)
    out_shape = jax.eval_shape(lambda a: fn(grid, *eqx.combine(a, static)), arrays)
    # taken for a replicated result, it fails in shard_map with a message about
    # replication and check_vma, which would be the wrong fix
    _refuse_padded(out_shape, grid)

    def body(a):
        return fn(local, *eqx.combine(a, static))

    try:
        return jax.shard_map(
            body,
            mesh=mesh,
            in_specs=(_specs(arrays, grid, mesh),),
            out_specs=_specs(out_shape, grid, mesh),
        )(arrays)
    except ValueError as error:
        if "out_specs which require replication" not in str(error):
            raise
        # jax's message named an internal 'body' and suggested check_vma=False, which would
        # return one device's block value as the result
        raise ValueError(
            "shard_map_fields: fn returned a result that is not a field (its trailing axes "
            f"are not the grid's shape {grid.shape}) but differs from device to device, such "
            "as a sum over a device's block. Non-field results must be the same on every "
            "device: return the field and reduce it outside (jnp.sum of the sharded result "
            "is the global sum)"
        ) from None


def _refuse_padded(out: Any, grid: Grid) -> None:
    """Refuse a result of ``shard_map_fields``'s ``fn`` with a padded shape: the grid's
    shape with the same ``w >= 1`` cells added on each side of every axis (the grid's halo
    or any other width given to ``fill_halo``)."""
    for leaf in jax.tree.leaves(out):
        shape = getattr(leaf, "shape", None)
        if shape is None or len(shape) < grid.ndim:
            continue
        added = {m - n for m, n in zip(shape[len(shape) - grid.ndim :], grid.shape)}
        if len(added) == 1 and (twice := added.pop()) > 0 and twice % 2 == 0:
            raise ValueError(
                f"shard_map_fields: fn returned an array of shape {tuple(shape)}, the grid's "
                f"shape {grid.shape} with a halo of {twice // 2} cell(s): a field result must "
                "have the grid's shape; return physjax.grids.interior(a, grid) of a padded "
                "field (with width= the halo's width if it is not the grid's)"
            )


def error_if(x: jax.Array, pred, message: str, grid: Grid, mesh: Mesh | None) -> jax.Array:
    """``eqx.error_if(x, pred, message)`` for a field ``x`` of ``grid`` (leading batch axes
    allowed, under ``vmap`` or not), safe on a mesh: with several devices it runs inside
    ``shard_map`` on each device's block with the replicated predicate, so that every device
    raises at the same point. An ``x`` that is not field-shaped (a scalar parameter) is
    checked replicated. ``pred`` may be one flag or an array of them, e.g. ``x < 0`` (any
    true raises, as for ``eqx.error_if``): an array is reduced to one flag first, so that
    it is not gathered onto every device. Called eagerly, ``x`` and ``pred`` are first
    placed on the mesh
    ([`place_on_mesh`][physjax.parallel.place_on_mesh]).

    Applied to a sharded field directly, equinox's callback runs on device 0 alone: XLA
    gathers the whole field there on every call, and when the error fires the other devices
    wait for it at the next collective until XLA aborts the process.
    """
    _check_types(grid, mesh)
    if mesh is None or mesh.size == 1:
        return eqx.error_if(x, pred, message)
    # a 2-D mesh for a 3-D grid stopped with KeyError: 'z', a grid the mesh does not divide
    # with shard_map's message about axis sizes
    decompose(grid, mesh)
    # called eagerly, an array committed to one device was refused by jax's device check
    x, pred = place_on_mesh((x, pred), grid, mesh)
    return _error_if_on_blocks(x, pred, message, grid, mesh)


@eqx.filter_jit
def _error_if_on_blocks(x, pred, message: str, grid: Grid, mesh: Mesh):
    """``eqx.error_if`` inside ``shard_map`` on each device's block, compiled once per
    shape, message, grid and mesh: called eagerly, a ``jax.shard_map`` of a new function
    compiled its body again at every call."""
    # split like the grid with its leading axes whole, as shard does: the grid's spec was
    # laid on the leading axes of (2, ny, nx), which were split, and (3, ny, nx) or a
    # non-field array stopped with shard_map's message
    spec = _specs(x, grid, mesh)
    if jnp.ndim(pred) > 0:
        # eqx.error_if raises when any element is true: reduce here, a local reduction and
        # a scalar all-reduce; taken whole into shard_map (replicated), a field-shaped
        # predicate (x < 0) was gathered onto every device at every call
        pred = jnp.any(pred)
    return jax.shard_map(
        lambda block, p: eqx.error_if(block, p, message),
        mesh=mesh,
        in_specs=(spec, PartitionSpec()),
        out_specs=spec,
        check_vma=False,
    )(x, pred)
