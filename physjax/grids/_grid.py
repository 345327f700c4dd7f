"""Uniform structured grids with Arakawa C-grid staggering."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

AXIS_NAMES_2D = ("y", "x")
AXIS_NAMES_3D = ("z", "y", "x")

#: Where a variable lives along one axis: at cell centres or on the cell faces. A face
#: variable with index ``i`` sits on the low (west/south/bottom) face of cell ``i``.
Stagger = Literal["centre", "face"]

#: Named Arakawa C-grid locations in 2-D, as a stagger per axis in ``(y, x)`` order.
CENTRE: tuple[Stagger, Stagger] = ("centre", "centre")
X_FACE: tuple[Stagger, Stagger] = ("centre", "face")
Y_FACE: tuple[Stagger, Stagger] = ("face", "centre")
CORNER: tuple[Stagger, Stagger] = ("face", "face")

_DTYPES = ("float32", "float64")


def _as_tuple(name: str, value, what: str) -> tuple:
    """``value`` as a tuple, refusing a single number or string by name."""
    if isinstance(value, jax.core.Tracer) or (
        isinstance(value, (tuple, list)) and any(isinstance(v, jax.core.Tracer) for v in value)
    ):
        raise ValueError(
            f"{name} must be fixed numbers, got a traced value: a grid's geometry is static "
            "(it sets array shapes and stencil constants), so it cannot be an argument of "
            "jax.jit/grad/vmap; build the Grid outside the transformed function"
        )
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a sequence of {what}, got {value!r}")
    return tuple(value)


def check_location(location, ndim: int, what: str = "location") -> tuple[str, ...]:
    """A stagger per axis, each ``"centre"`` or ``"face"`` (anything else — ``"center"``
    included — would silently be taken for a face)."""
    loc = _as_tuple(what, location, f'"centre"/"face" per axis ({ndim} of them)')
    if len(loc) != ndim or not all(s in ("centre", "face") for s in loc):
        raise ValueError(
            f'{what} must give "centre" or "face" for each of the {ndim} axes, got {location!r}'
        )
    return loc


def spacing_out_of_range(length: float, n: int, dtype) -> str | None:
    """Why ``length / n`` cannot be a grid spacing in ``dtype``: the stencils divide by h²
    (and a Poisson solution grows as f h²), so h² and 1/h² must both be finite. ``None``
    when it can; else the end of a message whose caller names the length."""
    largest = float(np.finfo(dtype).max)
    low, high, h = largest**-0.5, largest**0.5, length / n
    if low < h < high:
        return None
    return (
        f"over {n} cells gives a spacing of {h:.3g} m, whose square or its inverse is beyond "
        f"the range of {np.dtype(dtype).name}: give a spacing between {low:.1e} and "
        f"{high:.1e} m"
    )


def require_enabled_dtype(grid: Grid) -> None:
    """Refuse a float64 grid while ``jax_enable_x64`` is off: jax would make its arrays
    float32 with no more than a warning, and a solver built on it compute in float32."""
    if grid.dtype == "float64" and not jax.config.jax_enable_x64:
        raise ValueError(
            "grid.dtype is float64 but jax_enable_x64 is off (arrays would silently be "
            "float32): call jax.config.update('jax_enable_x64', True) first, or use a "
            "float32 grid"
        )


def _block_counts(mesh_shape) -> tuple[int, ...]:
    """``mesh_shape`` as whole numbers: ``int()`` took 2.5 for 2 and ``"2"`` or ``True`` for
    a block count."""
    counts = _as_tuple("mesh_shape", mesh_shape, "block counts, one per axis")
    if not all(
        isinstance(m, (int, np.integer)) and not isinstance(m, (bool, np.bool_)) for m in counts
    ):
        raise ValueError(f"mesh_shape must be whole numbers of blocks per axis, got {mesh_shape!r}")
    return tuple(int(m) for m in counts)


def _axis_names(ndim: int) -> tuple[str, ...]:
    return AXIS_NAMES_2D if ndim == 2 else AXIS_NAMES_3D


def as_number(value):
    """A concrete 0-d NumPy or JAX array (``np.array(False)``, ``jnp.float64(1e6)``) as the
    Python number it holds; anything else (a tracer, a sequence, a number) as given."""
    if (
        getattr(value, "ndim", None) == 0
        and hasattr(value, "dtype")
        and not isinstance(value, jax.core.Tracer)
    ):
        return np.asarray(value).item()
    return value


class Grid(eqx.Module):
    """A uniform structured grid of 2 or 3 dimensions, periodic or walled per axis.

    Axes are ordered as in the output files: ``(y, x)`` in 2-D and ``(z, y, x)`` in 3-D.
    Cell ``(j, i)`` covers ``[y0 + j dy, y0 + (j+1) dy] x [x0 + i dx, x0 + (i+1) dx]``.
    On the Arakawa C-grid a centre variable has index ``i`` at ``x0 + (i + 1/2) dx`` and a face
    variable at ``x0 + i dx`` (the low face of the cell). Every location holds ``n`` values
    per axis: on a walled axis the face value ``0`` lies on the low wall and the high wall
    (``x0 + n dx``) is implied by the boundary condition, so that all fields share one
    shape and shard alike.

    **Arguments:**

    - `shape`: number of cells per axis, ``(ny, nx)`` or ``(nz, ny, nx)``; each ≥ 1.
    - `extent`: domain length per axis in metres (or any unit), each > 0.
    - `periodic`: per axis, ``True`` for periodic and ``False`` for walls (default all
      periodic); a single bool applies to all axes.
    - `origin`: coordinate of the low corner (default zeros).
    - `dtype`: ``"float32"`` (default) or ``"float64"``: the dtype of fields on this grid.
    - `halo`: halo width used by [`physjax.grids.fill_halo`][] (default 1).

    The fields ``mesh_axes`` and ``mesh_shape`` describe a domain decomposition; they are set
    by [`physjax.grids.Grid.on_mesh`][] and used only inside ``shard_map``.
    """

    shape: tuple[int, ...] = eqx.field(static=True)
    extent: tuple[float, ...] = eqx.field(static=True)
    periodic: tuple[bool, ...] = eqx.field(static=True)
    origin: tuple[float, ...] = eqx.field(static=True)
    dtype: str = eqx.field(static=True)
    halo: int = eqx.field(static=True)
    mesh_axes: tuple[str | None, ...] = eqx.field(static=True)
    mesh_shape: tuple[int, ...] = eqx.field(static=True)
    _spacing: tuple[float, ...] = eqx.field(static=True, repr=False)

    def __init__(
        self,
        shape: Sequence[int],
        extent: Sequence[float],
        periodic: bool | Sequence[bool] = True,
        origin: Sequence[float] | None = None,
        dtype: str = "float32",
        halo: int = 1,
        mesh_axes: Sequence[str | None] | None = None,
        mesh_shape: Sequence[int] | None = None,
        *,
        _spacing: Sequence[float] | None = None,
    ):
        shape = _as_tuple("shape", shape, "sizes (ny, nx) or (nz, ny, nx)")
        # 0-d arrays are numbers, as for extent: jnp.array([64, 128]) was refused as
        # "ny must be a positive integer, got Array(64, dtype=int32)"
        shape = tuple(as_number(n) for n in shape)
        extent = _as_tuple("extent", extent, "domain lengths [m], one per axis")
        # 0-d arrays (np.array(1e6), jnp.float64(1e6)) are numbers
        extent = tuple(as_number(e) for e in extent)
        ndim = len(shape)
        if ndim not in (2, 3):
            raise ValueError(f"shape must have 2 (ny, nx) or 3 (nz, ny, nx) entries, got {shape}")
        names = _axis_names(ndim)
        for name, n in zip(names, shape):
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
                raise ValueError(f"grid size n{name} must be a positive integer, got {n!r}")
        if len(extent) != ndim:
            raise ValueError(f"extent must have {ndim} entries like shape {shape}, got {extent}")
        for name, length in zip(names, extent):
            if (
                isinstance(length, (bool, np.bool_))  # True is an int: not a length
                or not isinstance(length, (int, float, np.floating, np.integer))
                or not (math.isfinite(length) and length > 0)
            ):
                raise ValueError(
                    f"domain length L{name} must be a finite number > 0, got {length!r}"
                )
        # a 0-d array (np.array(False), jnp.array(False)) is one bool, as for extent's entries:
        # it stopped with "iteration over a 0-d array"
        periodic = as_number(periodic)
        if isinstance(periodic, (bool, np.bool_)):
            periodic = (bool(periodic),) * ndim
        periodic = _as_tuple("periodic", periodic, f"True/False or {ndim} of them")
        # bool("false") is True: only real booleans (or 0/1) are read as such
        if not all(isinstance(p, (bool, np.bool_)) or p in (0, 1) for p in periodic):
            raise ValueError(f"periodic must be True/False or {ndim} of them, got {periodic!r}")
        periodic = tuple(bool(p) for p in periodic)
        if len(periodic) != ndim:
            raise ValueError(f"periodic must have {ndim} entries, got {periodic}")
        if origin is None:
            origin = (0.0,) * ndim
        origin = _as_tuple("origin", origin, "coordinates [m] of the low corner")
        origin = tuple(as_number(o) for o in origin)  # 0-d arrays are numbers, as for extent
        if len(origin) != ndim or not all(
            isinstance(o, (int, float, np.integer, np.floating))
            and not isinstance(o, (bool, np.bool_))
            and math.isfinite(o)
            for o in origin
        ):
            raise ValueError(f"origin must be {ndim} finite numbers, got {origin!r}")
        origin = tuple(float(o) for o in origin)
        # names only ("float32"/"float64"): dtype=None or "float" would silently mean float64
        if isinstance(dtype, str):
            name = dtype
        elif dtype is None or isinstance(dtype, (bool, int, float)):
            name = None
        else:  # a NumPy/JAX dtype or scalar type
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = None
        if name not in _DTYPES:
            raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        dtype = name
        if isinstance(halo, bool) or not isinstance(halo, (int, np.integer)) or halo < 1:
            raise ValueError(f"halo must be a positive integer, got {halo!r}")
        halo = int(halo)
        for name_, n in zip(names, shape):
            if halo > n:
                raise ValueError(
                    f"halo={halo} is wider than the grid along {name_} (n{name_}={n}): a halo "
                    f"holds at most the cells it mirrors or wraps"
                )
        self.shape = tuple(int(n) for n in shape)
        self.extent = tuple(float(length) for length in extent)
        self.periodic = periodic
        self.origin = origin
        self.dtype = dtype
        self.halo = halo
        self.mesh_axes = (None,) * ndim if mesh_axes is None else tuple(mesh_axes)
        self.mesh_shape = (1,) * ndim if mesh_shape is None else _block_counts(mesh_shape)
        if len(self.mesh_shape) == ndim:  # a decomposition given here, as by on_mesh, divides
            self._check_split()
        spacing = tuple(length / n for length, n in zip(self.extent, self.shape))
        if _spacing is not None:
            # A sub-grid (a strip of rows of a larger grid) keeps its parent's cell size to
            # the last bit; no extent need divide back to it exactly for every row count.
            _spacing = tuple(float(d) for d in _spacing)
            if len(_spacing) != ndim or not all(
                math.isclose(d, e, rel_tol=1e-12) for d, e in zip(_spacing, spacing)
            ):
                raise ValueError(f"_spacing {_spacing} does not match extent/shape {spacing}")
            spacing = _spacing
        self._spacing = spacing

    # ------------------------------------------------------------------ geometry
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """``("y", "x")`` or ``("z", "y", "x")``."""
        return _axis_names(self.ndim)

    @property
    def spacing(self) -> tuple[float, ...]:
        """Cell size per axis, ``(dy, dx)`` or ``(dz, dy, dx)``."""
        return self._spacing

    @property
    def dx(self) -> float:
        return self.spacing[-1]

    @property
    def dy(self) -> float:
        return self.spacing[-2]

    @property
    def dz(self) -> float:
        if self.ndim < 3:
            raise AttributeError("a 2-D grid has no dz")
        return self.spacing[-3]

    @property
    def cell_volume(self) -> float:
        """Area (2-D) or volume (3-D) of one cell."""
        return math.prod(self.spacing)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def axis(self, name: str) -> int:
        """Array axis index (negative) of the named axis ``"x"``, ``"y"`` or ``"z"``."""
        names = self.axis_names
        if name not in names:
            raise ValueError(f"axis must be one of {names}, got {name!r}")
        return names.index(name) - self.ndim

    def coordinates(self, name: str, stagger: Stagger = "centre") -> np.ndarray:
        """Global 1-D coordinates (NumPy, float64) of centres or low faces along an axis."""
        check_location((stagger,), 1, "stagger")
        a = self.axis(name)
        n, d, o = self.shape[a], self.spacing[a], self.origin[a]
        offset = 0.5 if stagger == "centre" else 0.0
        return o + (np.arange(n) + offset) * d

    def mesh_coordinates(self, location: Sequence[Stagger]) -> tuple[np.ndarray, ...]:
        """Global coordinate arrays of a location, broadcast to full field shape (``ij``)."""
        location = check_location(location, self.ndim)
        axes = [self.coordinates(name, s) for name, s in zip(self.axis_names, location)]
        return tuple(np.meshgrid(*axes, indexing="ij"))

    def zeros(self, dtype=None) -> jax.Array:
        """Zeros of the (local) block shape: the whole grid, or inside ``shard_map`` one
        device's block, in the grid's dtype or ``dtype``. A float64 grid, or ``dtype``
        float64, needs ``jax_enable_x64`` (without it jax would hand back float32 zeros)."""
        if dtype is None:
            require_enabled_dtype(self)
        elif not jax.config.jax_enable_x64 and np.dtype(dtype) == np.float64:
            raise ValueError(
                "dtype float64 needs jax_enable_x64, which is off (the zeros would silently be "
                "float32): call jax.config.update('jax_enable_x64', True) first, or ask for "
                "float32"
            )
        return jnp.zeros(self.local_shape, dtype or self.dtype)

    # ---------------------------------------------------------- decomposition
    @property
    def is_sharded(self) -> bool:
        return any(m is not None for m in self.mesh_axes)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of the block held by one device."""
        return tuple(n // m for n, m in zip(self.shape, self.mesh_shape))

    def on_mesh(self, mesh_axes: Sequence[str | None], mesh_shape: Sequence[int]) -> Grid:
        """The same grid, decomposed: axis ``k`` split ``mesh_shape[k]`` ways over the mesh
        axis named ``mesh_axes[k]`` (``None``: not split). Raises if the split is uneven."""
        mesh_axes = tuple(mesh_axes)
        mesh_shape = _block_counts(mesh_shape)
        if len(mesh_axes) != self.ndim or len(mesh_shape) != self.ndim:
            raise ValueError(
                f"mesh_axes and mesh_shape need {self.ndim} entries, got {mesh_axes}, {mesh_shape}"
            )
        return self._with_mesh(mesh_axes, mesh_shape)

    def _check_split(self) -> None:
        if any(m < 1 for m in self.mesh_shape):
            raise ValueError(f"mesh_shape must be positive block counts, got {self.mesh_shape}")
        # a count without a mesh axis gave blocks whose halos wrapped (or mirrored) within
        # each block, as no neighbour could be reached
        for name, axis_name, m in zip(self.axis_names, self.mesh_axes, self.mesh_shape):
            if axis_name is None and m > 1:
                raise ValueError(
                    f"mesh_shape splits {name} {m} ways but mesh_axes names no mesh axis for "
                    f"it (None: not split): give the mesh axis it is split over, or 1 "
                    f"(physjax.parallel.decompose(grid, mesh) gives both)"
                )
        for name, n, m in zip(self.axis_names, self.shape, self.mesh_shape):
            if n % m != 0:
                raise ValueError(
                    f"the mesh does not divide the grid: n{name}={n} cannot be split into {m} "
                    f"equal blocks; choose n{name} a multiple of {m} or another device layout"
                )
            if n // m < self.halo:
                raise ValueError(
                    f"n{name}={n} split {m} ways leaves {n // m} cells per device, fewer than "
                    f"the halo width {self.halo}"
                )

    def unsharded(self) -> Grid:
        return self._with_mesh(None, None)

    def _with_mesh(self, mesh_axes, mesh_shape) -> Grid:
        """This grid (its spacing to the last bit) with another decomposition."""
        return Grid(
            self.shape,
            self.extent,
            self.periodic,
            self.origin,
            self.dtype,
            self.halo,
            mesh_axes,
            mesh_shape,
            _spacing=self._spacing,
        )

    def block_index(self, axis: int) -> jax.Array | int:
        """Index of this device's block along array ``axis`` (0 when the axis is not split).

        Only valid inside ``shard_map`` when the grid is decomposed.
        """
        axis = self._array_axis(axis)
        name = self.mesh_axes[axis]
        if name is None or self.mesh_shape[axis] == 1:
            return 0
        return jax.lax.axis_index(name)

    def _array_axis(self, axis) -> int:
        # axis % ndim took axis 2 of a 2-D grid for y
        if (
            isinstance(axis, (bool, np.bool_))
            or not isinstance(axis, (int, np.integer))
            or not -self.ndim <= axis < self.ndim
        ):
            raise ValueError(
                f"axis must be an array axis of the {self.ndim}-D grid, -{self.ndim} to "
                f"{self.ndim - 1}, got {axis!r} (grid.axis(name) gives it for a name)"
            )
        return int(axis) % self.ndim

    def local_index(self, axis: int, padded: bool = False) -> jax.Array:
        """Global integer index of each local point along ``axis`` (with halo if ``padded``)."""
        a = self._array_axis(axis)
        n_local = self.local_shape[a]
        h = self.halo if padded else 0
        index = jnp.arange(-h, n_local + h)
        # the block's offset (an int32 under shard_map) in the dtype of the index, as
        # standard promotion gives it: "strict" promotion refused int32 + int64
        return jnp.asarray(self.block_index(a) * n_local, index.dtype) + index

    def local_coordinates(
        self, name: str, stagger: Stagger = "centre", padded: bool = False
    ) -> jax.Array:
        """1-D coordinates of this device's block along an axis, in the grid's dtype.

        Works alike outside ``shard_map`` (the whole grid) and inside it (one block). A
        float64 grid needs ``jax_enable_x64``, as for [`physjax.grids.Grid.zeros`][].
        """
        check_location((stagger,), 1, "stagger")
        require_enabled_dtype(self)  # jax made them float32 with no more than a warning
        a = self.axis(name)
        offset = 0.5 if stagger == "centre" else 0.0
        idx = self.local_index(a, padded).astype(self.dtype)
        return self.origin[a] + (idx + offset) * self.spacing[a]

    def __check_init__(self):
        if len(self.mesh_axes) != self.ndim or len(self.mesh_shape) != self.ndim:
            raise ValueError("mesh_axes and mesh_shape need one entry per axis")
