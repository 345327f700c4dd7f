"""Grids, halo filling, stencils and the parallel layer."""

import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import physjax.grids as grids
from physjax.grids import (
    CENTRE,
    X_FACE,
    Y_FACE,
    Grid,
    diff_x_c2f,
    diff_y_f2c,
    fill_halo,
    interior,
    interp_x_c2f,
    laplacian,
)
from physjax.parallel import decompose, make_mesh, shard, shard_map_fields


def test_grid_geometry():
    g = Grid((4, 8), (2.0, 8.0), periodic=(False, True), origin=(1.0, -4.0), dtype="float64")
    assert g.spacing == (0.5, 1.0)
    np.testing.assert_allclose(g.coordinates("x", "centre"), -4 + np.arange(8) + 0.5)
    np.testing.assert_allclose(g.coordinates("y", "face"), 1 + 0.5 * np.arange(4))
    y, x = g.mesh_coordinates(X_FACE)
    assert y.shape == x.shape == (4, 8)
    assert g.cell_volume == 0.5


def test_sub_grid_keeps_the_parents_spacing():
    """A grid of another row count can carry its parent's dy exactly (strips of rows need
    it, and 6e5 / 42 * 48 / 48 is not 6e5 / 42); decomposing keeps it; a wrong one is
    refused."""
    g = Grid((42, 20), (6.0e5, 2.0e5))
    dy = g.spacing[0]
    sub = Grid((48, 20), (dy * 48, 2.0e5), _spacing=g.spacing)
    assert (dy * 48) / 48 != dy  # the extent alone would not give it back
    assert sub.spacing == g.spacing
    assert sub.on_mesh(("y", None), (2, 1)).spacing == g.spacing
    assert sub.on_mesh(("y", None), (2, 1)).unsharded().spacing == g.spacing
    with pytest.raises(ValueError, match="_spacing"):
        Grid((48, 20), (dy * 48, 2.0e5), _spacing=(2 * dy, g.spacing[1]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"shape": (0, 4), "extent": (1, 1)}, "ny must be a positive integer"),
        ({"shape": (4, -1), "extent": (1, 1)}, "nx must be a positive integer"),
        ({"shape": (4, 4), "extent": (1, 0)}, "Lx must be a finite number > 0"),
        ({"shape": (4, 4), "extent": (1,)}, "extent must have 2 entries"),
        ({"shape": (4,), "extent": (1,)}, "shape must have 2"),
        ({"shape": (4, 4), "extent": (1, 1), "dtype": "int32"}, "dtype must be one of"),
        # silently misread before: strings as True, None/"float" as float64, True as 1
        ({"shape": (4, 4), "extent": (1, 1), "periodic": ("false", "false")}, "periodic must"),
        ({"shape": (4, 4), "extent": (1, 1), "periodic": "no"}, "periodic must be a sequence"),
        ({"shape": (4, 4), "extent": (1, 1), "dtype": None}, "dtype must be one of"),
        ({"shape": (4, 4), "extent": (1, 1), "dtype": "float"}, "dtype must be one of"),
        ({"shape": (4, 4), "extent": (1, 1), "origin": (np.nan, 0)}, "origin must be 2 finite"),
        ({"shape": (4, 4), "extent": (1, 1), "halo": True}, "halo must be a positive integer"),
        ({"shape": (4, 3), "extent": (1, 1), "halo": 5}, "halo=5 is wider than the grid along"),
        ({"shape": 4, "extent": (1, 1)}, "shape must be a sequence"),
        ({"shape": (4, 4), "extent": 1.0}, "extent must be a sequence"),
        # True is an int in Python: it was taken as a length of 1 and an origin of 1
        ({"shape": (4, 4), "extent": (True, 1)}, "Ly must be a finite number > 0, got True"),
        ({"shape": (4, 4), "extent": (1, 1), "origin": (0, False)}, "origin must be 2 finite"),
    ],
)
def test_grid_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Grid(**kwargs)


def test_zero_dimensional_arrays_are_numbers_for_extent_and_origin():
    # an origin of jax scalars was refused while the same extent was accepted
    g = Grid((4, 4), jnp.array([1.0, 2.0]), origin=jnp.array([0.0, 5.0]), dtype="float64")
    assert g.extent == (1.0, 2.0) and g.origin == (0.0, 5.0)
    assert Grid((4, 4), (1.0, 2.0), origin=np.array([0.0, 5.0])).origin == (0.0, 5.0)


def test_a_traced_extent_or_origin_is_refused_by_name():
    # jax.grad with respect to the domain length used to fail with a TracerArrayConversionError
    def length(L):
        return Grid((4, 4), (L, L), dtype="float64").spacing[0]

    with pytest.raises(ValueError, match="extent must be fixed numbers, got a traced value"):
        jax.grad(length)(1.0)
    with pytest.raises(ValueError, match="extent must be fixed numbers"):
        jax.jit(lambda e: Grid((4, 4), e).dx)(jnp.ones(2))
    with pytest.raises(ValueError, match="origin must be fixed numbers"):
        jax.jit(lambda o: Grid((4, 4), (1.0, 1.0), origin=(o, 0.0)).dx)(0.5)


def test_fill_halo_periodic_and_walls():
    f = jnp.arange(12.0).reshape(3, 4)
    p = fill_halo(f, Grid((3, 4), (1, 1), periodic=True, dtype="float64"))
    np.testing.assert_array_equal(p[1:-1, 0], f[:, -1])
    np.testing.assert_array_equal(p[0, 1:-1], f[-1])
    assert p[0, 0] == f[-1, -1]
    w = Grid((3, 4), (1, 1), periodic=False, dtype="float64")
    even = fill_halo(f, w, CENTRE)
    np.testing.assert_array_equal(even[1:-1, 0], f[:, 0])
    odd = fill_halo(f, w, CENTRE, parity=(-1, -1))
    np.testing.assert_array_equal(odd[1:-1, -1], -f[:, -1])
    u = fill_halo(f, w, X_FACE)  # normal velocity: face 0 and face n on walls
    np.testing.assert_array_equal(u[1:-1, 0], -f[:, 1])
    np.testing.assert_array_equal(u[1:-1, -1], 0.0)
    with pytest.raises(ValueError, match="does not match the grid"):
        fill_halo(jnp.zeros((3, 5)), w)


@pytest.mark.multidevice
@pytest.mark.parametrize("layout", [None, (2, 2)])
def test_fill_halo_on_walls_keeps_the_fields_dtype(layout):
    """The wall ghosts of a centre field were ``parity * mirror``: a bool mask (land/sea)
    came back as an int64 array on a walled axis (bool on a periodic one), on which
    ``~padded`` is -2 or -1, true everywhere; a NumPy float parity made a float32 field
    float64. The ghosts are the mirror, negated for odd parity, in the field's dtype."""
    g = Grid((8, 12), (1.0, 1.0), periodic=(False, True), halo=2)
    mask = np.ones(g.shape, bool)  # sea, with land cells by a wall and the periodic edges
    mask[0, 0] = mask[7, 5] = mask[3, 11] = False
    ref = np.pad(mask, ((2, 2), (0, 0)), mode="symmetric")
    ref = np.pad(ref, ((0, 0), (2, 2)), mode="wrap")

    def land_within_two_cells(grid, m):  # uses every ghost
        land = ~fill_halo(m, grid)
        ny, nx = grid.local_shape
        near = [land[j : j + ny, i : i + nx] for j in range(5) for i in range(5)]
        return functools.reduce(jnp.logical_or, near)

    if layout is None:
        near = land_within_two_cells(g, jnp.asarray(mask))
    else:
        near = shard_map_fields(land_within_two_cells, g, make_mesh(layout))(mask)
    expected = np.zeros(g.shape, bool)
    for j in range(5):
        for i in range(5):
            expected |= ~ref[j : j + 8, i : i + 12]
    assert near.dtype == jnp.bool_
    np.testing.assert_array_equal(np.asarray(near), expected)
    # an odd reflection negates the field: for a bool one jax said "neg does not accept
    # dtype bool", naming neither the parity nor the location that asks for it
    for kw in (dict(parity=-1), dict(location=(CENTRE[0], "face"))):
        with pytest.raises(TypeError, match=r"^fill_halo: the odd reflection at a wall"):
            fill_halo(jnp.asarray(mask), Grid((8, 12), (1.0, 1.0), periodic=False), **kw)
    f = jnp.ones(g.shape, jnp.float32)
    assert fill_halo(f, g, parity=(np.float64(-1.0), np.float64(1.0))).dtype == jnp.float32


def test_halo_helpers_refuse_what_they_used_to_misread():
    """A list gave an AttributeError, parity=(True, 1) was read as (+1, +1), and interior
    with a negative width returned an empty array."""
    g = Grid((3, 4), (1, 1), periodic=False, dtype="float64")
    f = jnp.arange(12.0).reshape(3, 4)
    with pytest.raises(TypeError, match="field must be a jax or NumPy array, got list"):
        fill_halo(f.tolist(), g)
    np.testing.assert_array_equal(fill_halo(np.asarray(f), g), fill_halo(f, g))  # NumPy is fine
    with pytest.raises(
        ValueError,
        match=re.escape("parity must give +1 or -1 for each of the 2 axes, got (True, 1)"),
    ):
        fill_halo(f, g, parity=(True, 1))
    p = fill_halo(f, g, width=1)
    np.testing.assert_array_equal(interior(p, g), f)
    np.testing.assert_array_equal(interior(f, g, 0), f)
    for width, match in [(-1, "width must be a whole number >= 0, got -1"), (1.0, "got 1.0")]:
        with pytest.raises(ValueError, match=match):
            interior(p, g, width)
    with pytest.raises(ValueError, match="padded has 5 points along y: nothing is left inside"):
        interior(p, g, 3)
    with pytest.raises(ValueError, match="at least the grid's 2 dimensions"):
        interior(p[0], g)
    # an unpadded field lost its outer cells, another grid's field was cut, without a word
    with pytest.raises(ValueError, match=r"shape \(3, 4\): .* \(5, 6\) \(the unpadded shape"):
        interior(f, g)
    with pytest.raises(ValueError, match=r"padded has shape \(2, 7, 6\): a field of this grid"):
        interior(jnp.zeros((2, 7, 6)), g)
    np.testing.assert_array_equal(interior(jnp.stack([p, 2 * p]), g)[1], 2 * f)  # a batch


def test_zeros_of_a_float64_grid_needs_x64():
    # without x64 they were float32 zeros with no more than a warning
    g = Grid((3, 4), (1, 1), dtype="float64")
    assert g.zeros().dtype == jnp.float64
    with pytest.raises(ValueError, match="grid.dtype is float64 but jax_enable_x64 is off"):
        with jax.enable_x64(False):
            g.zeros()


def test_zeros_asked_in_float64_need_x64():
    """``grid.zeros(jnp.float64)`` without x64 gave float32 zeros with jax's warning alone,
    where ``grid.zeros()`` of a float64 grid is refused; both are refused now."""
    for grid_dtype in ("float32", "float64"):
        g = Grid((3, 4), (1, 1), dtype=grid_dtype)
        for dtype in ("float64", jnp.float64, np.float64):
            assert g.zeros(dtype).dtype == jnp.float64  # x64 on (conftest)
            with jax.enable_x64(False):
                with pytest.raises(ValueError, match="dtype float64 needs jax_enable_x64"):
                    g.zeros(dtype)
    with jax.enable_x64(False):
        assert g.zeros("float32").dtype == jnp.float32
        assert g.zeros(jnp.int32).dtype == jnp.int32


@pytest.mark.parametrize("periodic", [True, False])
def test_stencils_second_order(periodic):
    errs, dxs = [], []
    for n in (16, 32, 64):
        g = Grid((n, n), (1.0, 1.0), periodic=periodic, dtype="float64")
        y, x = g.mesh_coordinates(CENTRE)
        f = jnp.cos(2 * np.pi * x) * jnp.cos(2 * np.pi * y)  # even about the walls
        p = fill_halo(f, g)
        yf, xf = g.mesh_coordinates(X_FACE)
        dfdx = interior(diff_x_c2f(p, g), g)
        ref = -2 * np.pi * np.sin(2 * np.pi * xf) * np.cos(2 * np.pi * yf)
        lap = interior(laplacian(p, g), g)
        e1 = float(jnp.max(jnp.abs(dfdx - ref)))
        e2 = float(jnp.max(jnp.abs(lap + 8 * np.pi**2 * f))) / (8 * np.pi**2)
        avg = interior(interp_x_c2f(p), g)
        e3 = float(jnp.max(jnp.abs(avg - np.cos(2 * np.pi * xf) * np.cos(2 * np.pi * yf))))
        errs.append((e1, e2, e3))
        dxs.append(g.dx)
    errs = np.array(errs)
    for k in range(3):
        order = np.polyfit(np.log(dxs), np.log(errs[:, k]), 1)[0]
        assert abs(order - 2) <= 0.15, (k, order)


def test_diff_y_f2c_exact_on_linear():
    g = Grid((8, 4), (8.0, 4.0), periodic=False, dtype="float64")
    yf, _ = g.mesh_coordinates(Y_FACE)
    v = jnp.asarray(yf * 3.0)
    p = fill_halo(v, g, Y_FACE)
    d = interior(diff_y_f2c(p, g), g)
    np.testing.assert_allclose(d[:-1], 3.0, rtol=1e-14)


@pytest.mark.parametrize("periodic", [True, False])
def test_staggered_differences_and_averages_are_adjoint(periodic):
    """Summation by parts, Σ u·δc2f(h) = −Σ h·δf2c(u), and Σ u·avg_c2f(h) = Σ h·avg_f2c(u),
    along x, y and z, periodic or walled (normal velocity zero on the low wall face): the
    discrete identity behind the model's energy conservation."""
    g = Grid((3, 4, 5), (1.0, 1.3, 0.7), periodic=periodic, dtype="float64")
    rng = np.random.default_rng(7)
    h = jnp.asarray(rng.normal(size=g.shape))
    ph = fill_halo(h, g)
    for k, name in enumerate(g.axis_names):
        loc = tuple("face" if j == k else "centre" for j in range(3))
        u = jnp.asarray(rng.normal(size=g.shape))
        if not periodic:
            u = u.at[(slice(None),) * k + (0,)].set(0.0)  # face 0: the low wall
        pu = fill_halo(u, g, loc)
        c2f, f2c = (getattr(grids, f"diff_{name}_{d}") for d in ("c2f", "f2c"))
        a2f, a2c = (getattr(grids, f"interp_{name}_{d}") for d in ("c2f", "f2c"))
        lhs, rhs = jnp.sum(u * interior(c2f(ph, g), g)), -jnp.sum(h * interior(f2c(pu, g), g))
        assert abs(float(lhs - rhs)) <= 1e-13 * float(jnp.sum(jnp.abs(u * h))) / g.spacing[k]
        lhs, rhs = jnp.sum(u * interior(a2f(ph), g)), jnp.sum(h * interior(a2c(pu), g))
        assert abs(float(lhs - rhs)) <= 1e-13 * float(jnp.sum(jnp.abs(u * h)))


def test_make_mesh_layouts_and_errors():
    assert dict(make_mesh(4).shape) == {"y": 2, "x": 2}
    assert dict(make_mesh(2).shape) == {"y": 2, "x": 1}
    assert dict(make_mesh((1, 4)).shape) == {"y": 1, "x": 4}
    with pytest.raises(ValueError, match="devices=16 requested but only 4"):
        make_mesh(16)
    with pytest.raises(ValueError, match="needs 2 positive entries"):
        make_mesh((2, 0))
    assert dict(make_mesh(4, ndim=3).shape) == {"z": 1, "y": 2, "x": 2}  # columns whole
    # a layout gives its own number of axes; an explicit ndim must agree with it
    assert dict(make_mesh((1, 2, 2)).shape) == {"z": 1, "y": 2, "x": 2}
    assert dict(make_mesh((2, 1, 2), ndim=3).shape) == {"z": 2, "y": 1, "x": 2}
    with pytest.raises(ValueError, match=r"needs 2 positive entries, one per grid axis \(y×x\)"):
        make_mesh((1, 2, 2), ndim=2)
    with pytest.raises(ValueError, match=r"needs 3 positive entries"):
        make_mesh((2, 2), ndim=3)
    with pytest.raises(ValueError, match="needs 2 or 3 positive entries"):
        make_mesh((4,))
    grid3 = Grid((4, 8, 8), (1.0, 1.0, 1.0), dtype="float64")
    with pytest.raises(ValueError, match=r"named like the grid axes .*make_mesh\(n, ndim=3\)"):
        decompose(grid3, make_mesh(4))  # a 2-D mesh for a 3-D grid
    for bad in (True, (2.5, 1), ("2", 1)):  # (2.5, 1) was truncated to a 2×1 mesh
        with pytest.raises(ValueError, match="devices must be a number of devices or a layout"):
            make_mesh(bad)
    grid = Grid((8, 8), (1.0, 1.0), dtype="float64")
    with pytest.raises(TypeError, match="not a Grid: make_mesh"):  # was "ndim must be 2 or 3"
        make_mesh(grid, (2, 2))


@pytest.mark.multidevice
@pytest.mark.parametrize("layout", [(4, 1), (2, 2), (1, 4)])
@pytest.mark.parametrize("periodic", [(True, True), (False, True), (False, False)])
def test_sharded_halo_equals_single_device(layout, periodic):
    g = Grid((8, 16), (1.0, 2.0), periodic=periodic, dtype="float64")
    f = jnp.asarray(np.random.default_rng(0).normal(size=g.shape))
    mesh = make_mesh(layout)

    def op(grid, a):
        u = fill_halo(a, grid, X_FACE, parity=(-1, -1))
        return interior(laplacian(u, grid) + diff_x_c2f(fill_halo(a, grid), grid), grid)

    ref = op(g, f)
    out = jax.jit(shard_map_fields(op, g, mesh))(shard(f, g, mesh))
    assert float(jnp.max(jnp.abs(out - ref))) == 0.0
    assert out.sharding.shard_shape(out.shape) == (8 // layout[0], 16 // layout[1])


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=8, deadline=None)
@given(
    ny=st.integers(2, 9),
    nx=st.integers(2, 9),
    py=st.booleans(),
    px=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_halo_round_trip_and_discrete_gauss(ny, nx, py, px, seed):
    """interior(fill_halo(f)) == f, and with zero-flux walls or periodic axes the five-point
    Laplacian of any field sums to zero (discrete Gauss theorem)."""
    g = Grid((ny, nx), (1.0, 2.0), periodic=(py, px), dtype="float64")
    f = jnp.asarray(np.random.default_rng(seed).normal(size=(ny, nx)))

    @jax.jit  # one program per shape, not a few dozen eager operations
    def round_trip_and_total(f):
        p = fill_halo(f, g)
        return interior(p, g), jnp.sum(interior(laplacian(p, g), g))

    back, total = round_trip_and_total(f)
    assert np.array_equal(back, f)
    total = float(total)
    assert abs(total) <= 1e-10 * float(jnp.sum(jnp.abs(f))) * (nx * ny) ** 2


def test_zero_d_arrays_are_numbers_for_extent():
    g = Grid((4, 8), (jnp.asarray(2.0), np.float64(8.0)), dtype="float64")
    assert g.extent == (2.0, 8.0) and isinstance(g.extent[0], float)
    with pytest.raises(ValueError, match="Ly must be a finite number > 0"):
        Grid((4, 8), (jnp.asarray(-2.0), 8.0))


def test_locations_parities_and_widths_are_checked():
    """A misspelt stagger used to be taken for a face (odd reflection, face coordinates, a
    file whose dims contradict its metadata); wrong lengths and parities were accepted."""
    from physjax.io import NetCDFWriter, Variable

    g = Grid((4, 6), (1.0, 1.0), periodic=(False, True), dtype="float64")
    f = jnp.arange(24.0).reshape(4, 6)
    with pytest.raises(ValueError, match='location must give "centre" or "face" for each of'):
        fill_halo(f, g, ("center", "centre"))
    with pytest.raises(ValueError, match="location must give"):
        fill_halo(f, g, ("centre", "centre", "face"))
    with pytest.raises(ValueError, match="parity must give"):
        fill_halo(f, g, CENTRE, parity=(2, 1))
    with pytest.raises(ValueError, match="parity must give"):
        fill_halo(f, g, CENTRE, parity=(1,))
    # one number is the parity of every axis; any other number is refused by name (it used
    # to fail with "'int' object is not iterable")
    np.testing.assert_array_equal(
        fill_halo(f, g, CENTRE, parity=-1), fill_halo(f, g, CENTRE, (-1, -1))
    )
    with pytest.raises(ValueError, match="parity must give .* got 2$"):
        fill_halo(f, g, CENTRE, parity=2)
    # a face on a wall mirrors faces 1..width; on the whole axis face n = 4 is the high
    # wall, where the field is zero, so a halo as deep as the axis is filled (it was refused)
    v = f.at[0].set(0.0)
    deep = fill_halo(v, g, Y_FACE, width=4)[:, 4]
    np.testing.assert_array_equal(deep, [0, -18, -12, -6, 0, 6, 12, 18, 0, -18, -12, -6])
    with pytest.raises(ValueError, match=r"a block of ny=4 cells cannot fill a halo of width 5"):
        fill_halo(v, g, Y_FACE, width=5)
    # a block of a split axis does not hold the next block's face: it needs width + 1 cells
    split = g.on_mesh(("y", None), (2, 1))
    with pytest.raises(ValueError, match=r"ny=2 cells cannot fill a halo of width 2 .*needs 3"):
        fill_halo(v[:2], split, Y_FACE, width=2)
    assert fill_halo(f, g, CENTRE, width=4).shape == (12, 14)
    with pytest.raises(ValueError, match="stagger must give"):
        g.coordinates("x", "center")
    with pytest.raises(ValueError, match="Variable.location must give"):
        NetCDFWriter(
            "/nonexistent-dir-is-not-reached/q.h5",
            g,
            [Variable("q", ("center", "centre"), "1", "q")],
        )
    for name in ("a/b", ".", ".."):
        with pytest.raises(ValueError, match="Variable.name must be a non-empty netCDF name"):
            NetCDFWriter("/nonexistent-dir/q.h5", g, [Variable(name, CENTRE, "1", "q")])


def test_variable_units_long_name_and_time_dependence_are_checked(tmp_path):
    """``Variable(units=None)`` (a dimensionless field) stopped in h5py with "Object dtype
    dtype('O') has no native HDF5 equivalent", a number for units was stored as a number,
    and ``time_dependent="no"`` was taken for True (``None`` for False)."""
    from physjax.io import NetCDFWriter, Variable

    g = Grid((4, 6), (1.0, 1.0))
    for kw, match in (
        (dict(units=None), r"Variable\.units of 'q' must be a non-empty string \(units \"1\""),
        (dict(units=5), r"Variable\.units of 'q' must be a non-empty string"),
        (dict(long_name=None), r"Variable\.long_name of 'q' must be a non-empty string"),
        (dict(time_dependent="no"), r"Variable\.time_dependent of 'q' must be True or False"),
        (dict(time_dependent=None), r"Variable\.time_dependent of 'q' must be True or False"),
    ):
        args = dict(name="q", location=CENTRE, units="1", long_name="q")
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            NetCDFWriter(tmp_path / "q.h5", g, [Variable(**args)])
        assert not (tmp_path / "q.h5").exists()
    w = NetCDFWriter(tmp_path / "q.h5", g, [Variable("q", CENTRE, "1", "q", np.bool_(False))])
    w.write_static({"q": np.ones(g.shape)})


def test_interior_keeps_batch_axes_and_zeros_is_local():
    g = Grid((8, 8), (1.0, 1.0))
    batch = jnp.arange(3 * 10 * 10.0).reshape(3, 10, 10)
    out = interior(batch, g)
    assert out.shape == (3, 8, 8)
    np.testing.assert_array_equal(out[1], batch[1, 1:-1, 1:-1])
    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    mesh = make_mesh(4)
    h = jnp.ones((8, 8), jnp.float32)
    z = shard_map_fields(lambda grid, h: h + grid.zeros(), g, mesh)(h)
    assert z.shape == (8, 8) and float(jnp.abs(z - 1).max()) == 0


def test_laplacian_keeps_leading_batch_axes():
    """Batch axes lead, as for the other stencils: the grid's axes are the trailing ones."""
    grid = Grid((4, 6), (4.0, 12.0), periodic=(False, True), dtype="float64")
    y, x = grid.mesh_coordinates(CENTRE)
    p = fill_halo(jnp.asarray(x**2 + 3 * y**3), grid)
    one = interior(laplacian(p, grid), grid)
    both = interior(laplacian(jnp.stack([p, 2 * p]), grid), grid)
    assert float(jnp.max(jnp.abs(both[0] - one))) == 0.0
    assert float(jnp.max(jnp.abs(both[1] - 2 * one))) == 0.0
    # interior x-periodic rows of x² + 3y³ away from the x-wrap: 2 + 18 y exactly
    yc = grid.coordinates("y")[1:-1, None]
    assert np.allclose(np.asarray(one)[1:-1, 1:-1], 2 + 18 * yc, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match=r"at least the grid's 2 axes"):
        laplacian(jnp.zeros(6), grid)


def test_coordinates_refuse_a_misspelt_or_short_location():
    grid = Grid((3, 4), (3.0, 4.0))
    g3 = Grid((2, 3, 4), (2.0, 3.0, 4.0))
    with pytest.raises(ValueError, match=r'stagger must give "centre" or "face"'):
        grid.local_coordinates("x", "center")  # was taken for a face
    with pytest.raises(ValueError, match=r'location must give "centre" or "face" for each of'):
        g3.mesh_coordinates(CENTRE)  # a 2-D location on a 3-D grid
    with pytest.raises(ValueError, match="for each of the 2 axes"):
        grid.mesh_coordinates(("centre",))
    z, y, x = g3.mesh_coordinates(("centre", "centre", "face"))
    assert z.shape == y.shape == x.shape == (2, 3, 4) and x[0, 0, 1] == 1.0
    assert np.array_equal(grid.local_coordinates("x", "centre"), [0.5, 1.5, 2.5, 3.5])
    # a NumPy integer is an integer, as everywhere else
    assert fill_halo(jnp.zeros((3, 4)), grid, width=np.int64(1)).shape == (5, 6)


def test_a_float64_model_needs_x64():
    """Without x64 jax makes float64 arrays float32 with a warning only; the model said so
    only at run time, blaming the state."""
    from physjax.solvers import ShallowWater

    grid = Grid((8, 8), (1e5, 1e5), periodic=True, dtype="float64")
    with pytest.raises(ValueError, match="grid.dtype is float64 but jax_enable_x64 is off"):
        with jax.enable_x64(False):
            ShallowWater(grid, gravity=9.81, coriolis=1e-4)


def test_a_decomposition_given_to_the_constructor_is_checked_like_on_mesh():
    """Grid(..., mesh_shape=(3, 1)) of 4 rows was accepted with local blocks of 1 row (the
    last row on no device); only on_mesh checked the split."""
    with pytest.raises(ValueError, match="ny=4 cannot be split into 3 equal blocks"):
        Grid((4, 4), (1.0, 1.0), mesh_axes=("y", "x"), mesh_shape=(3, 1))
    with pytest.raises(ValueError, match="mesh_shape must be positive block counts"):
        Grid((4, 4), (1.0, 1.0), mesh_axes=("y", "x"), mesh_shape=(0, 1))
    with pytest.raises(ValueError, match="fewer than the halo width 2"):
        Grid((4, 4), (1.0, 1.0), halo=2, mesh_axes=("y", "x"), mesh_shape=(4, 1))
    g = Grid((4, 8), (1.0, 1.0), mesh_axes=("y", "x"), mesh_shape=(2, 4))
    assert g.local_shape == (2, 2)
    assert g == Grid((4, 8), (1.0, 1.0)).on_mesh(("y", "x"), (2, 4))


def test_make_mesh_takes_a_0d_array_as_a_count():
    assert dict(make_mesh(np.array(4)).shape) == dict(make_mesh(4).shape) == {"y": 2, "x": 2}
    with pytest.raises(ValueError, match="devices must be a number of devices or a layout"):
        make_mesh(np.array(2.5))
    # a JAX array like a NumPy one: jnp.array(4) stopped with "iteration over a 0-d array",
    # jnp.array([1, 4]) was refused as no layout
    assert dict(make_mesh(jnp.array(4)).shape) == {"y": 2, "x": 2}
    assert dict(make_mesh(jnp.array([1, 4])).shape) == {"y": 1, "x": 4}
    with pytest.raises(ValueError, match="devices must be a number of devices or a layout"):
        make_mesh(jnp.array(2.5))


def test_make_mesh_refuses_a_non_integer_ndim_and_names_both_lengths():
    for bad in (2.0, 3.0, "2", True):  # 2.0 and 3.0 were taken for 2 and 3
        with pytest.raises(ValueError, match=f"ndim must be 2 or 3, got {bad!r}"):
            make_mesh(4, ndim=bad)
    assert dict(make_mesh(4, ndim=np.int64(3)).shape) == {"z": 1, "y": 2, "x": 2}
    # four entries without ndim: the layout may be 2-D or 3-D (was "needs 2 … (y×x)")
    with pytest.raises(
        ValueError, match=r"needs 2 or 3 positive entries, one per grid axis \(y×x or z×y×x\)"
    ):
        make_mesh((2, 2, 1, 1))


def test_error_if_on_a_mesh_raises_on_every_device_without_gathering():
    import re

    from physjax.parallel import error_if

    grid = Grid((16, 16), (1.0, 1.0), dtype="float64")
    mesh = make_mesh((2, 2))

    @jax.jit
    def halve(x):
        x = shard(x, grid, mesh) / 2
        return error_if(x, jnp.mean(x) > 1, "mean above 1", grid, mesh) + 1

    text = halve.lower(np.zeros(grid.shape)).compile().as_text()
    assert not re.findall(r"all-gather\(", text)
    x = np.arange(256.0).reshape(16, 16) / 256
    np.testing.assert_array_equal(np.asarray(halve(x)), x / 2 + 1)
    with pytest.raises(Exception, match="mean above 1"):
        halve(np.full(grid.shape, 4.0)).block_until_ready()
    batch = np.stack([x, x + 1])  # under vmap too
    np.testing.assert_array_equal(np.asarray(jax.vmap(halve)(batch)), batch / 2 + 1)
    with pytest.raises(Exception, match="mean above 1"):
        jax.vmap(halve)(np.stack([x, x + 4])).block_until_ready()


@pytest.mark.multidevice
def test_error_if_on_a_mesh_with_a_field_predicate_does_not_gather_it():
    """A predicate of the field's shape (``x > 1``, as in eqx.error_if's own examples) went
    into shard_map replicated: XLA gathered the whole field onto every device at every call
    (2048² float32 on a 2×2 mesh: 82 ms against 2 ms for the step it checked). It is
    reduced to one flag now, a scalar all-reduce, and raises as before."""
    from physjax.parallel import error_if

    grid = Grid((16, 16), (1.0, 1.0), dtype="float64")
    mesh = make_mesh((2, 2))

    @jax.jit
    def halve(x):
        x = shard(x, grid, mesh) / 2
        return error_if(x, x > 1, "above 1", grid, mesh) + 1

    text = halve.lower(np.zeros(grid.shape)).compile().as_text()
    assert not re.findall(r"all-gather", text)
    x = np.arange(256.0).reshape(16, 16) / 256
    np.testing.assert_array_equal(np.asarray(halve(x)), x / 2 + 1)
    big = x.copy()
    big[15, 15] = 4.0  # one point, on the last device's block
    with pytest.raises(Exception, match="above 1"):
        halve(big).block_until_ready()
    with pytest.raises(Exception, match="above 1"):
        jax.vmap(halve)(np.stack([x, big])).block_until_ready()
    eager = jnp.asarray(big)
    with pytest.raises(Exception, match="above 1"):
        error_if(eager, eager > 3, "above 1", grid, mesh).block_until_ready()


@pytest.mark.multidevice
def test_error_if_on_a_mesh_takes_batches_committed_arrays_and_names_a_wrong_mesh():
    """error_if laid the grid's spec on the leading axes of a (2, ny, nx) batch (splitting
    the batch over y), stopped with shard_map's message for (3, ny, nx) or a 1-D array,
    refused an eager array committed to one device (jax's "incompatible devices"), and
    met a 2-D mesh for a 3-D grid with KeyError: 'z'."""
    from physjax.parallel import error_if

    grid = Grid((16, 16), (1.0, 1.0), dtype="float64")
    mesh = make_mesh((2, 2))
    batch = np.arange(3 * 256.0).reshape(3, 16, 16)
    out = error_if(batch, False, "boom", grid, mesh)
    np.testing.assert_array_equal(np.asarray(out), batch)
    assert out.sharding.spec == jax.sharding.PartitionSpec(None, "y", "x")
    with pytest.raises(Exception, match="boom"):
        error_if(batch, True, "boom", grid, mesh).block_until_ready()
    np.testing.assert_array_equal(np.asarray(error_if(np.ones(5), False, "boom", grid, mesh)), 1)
    committed = jax.device_put(batch[0], jax.devices()[1])
    np.testing.assert_array_equal(
        np.asarray(error_if(committed, False, "boom", grid, mesh)), batch[0]
    )
    with pytest.raises(Exception, match="boom"):
        error_if(committed, True, "boom", grid, mesh).block_until_ready()
    grid3 = Grid((4, 16, 16), (1.0, 1.0, 1.0), dtype="float64")
    with pytest.raises(ValueError, match=r"named like the grid axes .*make_mesh\(n, ndim=3\)"):
        error_if(np.ones(grid3.shape), False, "boom", grid3, mesh)
    odd = Grid((6, 16), (1.0, 1.0), dtype="float64")
    with pytest.raises(ValueError, match="the mesh does not divide the grid: ny=6 cannot be split"):
        error_if(np.ones(odd.shape), False, "boom", odd, make_mesh((4, 1)))


@pytest.mark.multidevice
def test_error_if_on_a_mesh_called_eagerly_compiles_once(compilations):
    """Called eagerly, error_if ran a jax.shard_map of a new function, which compiled its
    body again at every call (4 programs each time); a second call now compiles nothing."""
    from physjax.parallel import error_if

    grid = Grid((16, 16), (1.0, 1.0), dtype="float64")
    mesh = make_mesh((2, 2))
    x = np.arange(256.0).reshape(16, 16)
    error_if(x, False, "boom", grid, mesh).block_until_ready()
    with compilations() as seen:
        out = error_if(x + 1, False, "boom", grid, mesh).block_until_ready()
    assert seen == []
    np.testing.assert_array_equal(np.asarray(out), x + 1)
    with pytest.raises(Exception, match="boom"):
        error_if(x, True, "boom", grid, mesh).block_until_ready()


def test_z_stencils_refuse_2d_fields_and_grids():
    """interp_z_c2f of a 2-D field averaged along x (axis -3 wrapped round), and
    diff_z_c2f with a 2-D grid raised a bare IndexError."""
    from physjax.grids import diff_z_c2f, interp_z_c2f, interp_z_f2c

    f2 = jnp.arange(20.0).reshape(4, 5) ** 2
    for op in (interp_z_c2f, interp_z_f2c):
        with pytest.raises(ValueError, match=r"along z needs a field of ≥ 3 dimensions"):
            op(f2)
    g2 = Grid((4, 5), (1.0, 1.0), dtype="float64")
    with pytest.raises(ValueError, match="along z needs a field"):
        diff_z_c2f(f2, g2)
    with pytest.raises(ValueError, match="along z needs a 3-D grid, got a 2-D one"):
        diff_z_c2f(jnp.ones((3, 4, 5)), g2)
    g3 = Grid((3, 4, 5), (3.0, 1.0, 1.0), dtype="float64")
    f3 = jnp.arange(60.0).reshape(3, 4, 5) ** 2
    assert float(jnp.abs(interp_z_c2f(f3)[1:] - 0.5 * (f3[1:] + f3[:-1])).max()) == 0.0
    assert float(jnp.abs(diff_z_c2f(f3, g3)[1:] - (f3[1:] - f3[:-1])).max()) == 0.0


@pytest.mark.multidevice
def test_shard_map_fields_names_a_padded_result():
    """A stencil's result keeps the halo; returned as it is, shard_map refused it with a
    message about replication and check_vma=False (the wrong fix)."""
    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    g = Grid((8, 8), (1.0, 2.0))
    mesh = make_mesh((2, 2))
    a = jnp.asarray(np.random.default_rng(0).normal(size=g.shape), g.dtype)
    padded = shard_map_fields(lambda G, f: laplacian(fill_halo(f, G), G), g, mesh)
    with pytest.raises(ValueError, match=r"shape \(10, 10\), the grid's shape \(8, 8\) with a"):
        padded(a)
    # padded by a width other than the grid's halo: refused with the same message, where it
    # was taken for a non-field result "that differs from device to device, such as a sum"
    wide = shard_map_fields(lambda G, f: fill_halo(f, G, width=2), g, mesh)
    with pytest.raises(ValueError, match=r"shape \(12, 12\), .* with a halo of 2 cell"):
        wide(a)
    good = shard_map_fields(lambda G, f: interior(laplacian(fill_halo(f, G), G), G), g, mesh)
    one = interior(laplacian(fill_halo(a, g), g), g)
    np.testing.assert_allclose(good(a), one, rtol=0, atol=1e-12 * float(jnp.abs(one).max()))
    # a reduction over each device's block is not the same on every device: jax's message
    # named an internal 'body' and suggested check_vma=False (one block's sum as the result)
    local_sum = shard_map_fields(lambda G, f: jnp.sum(f), g, mesh)
    with pytest.raises(ValueError, match=r"^shard_map_fields: fn returned a result that is not"):
        local_sum(a)
    total = shard_map_fields(lambda G, f: (f, jnp.float32(2.0)), g, mesh)(a)
    assert float(jnp.sum(total[0])) == pytest.approx(float(jnp.sum(a)), rel=1e-5)
    assert float(total[1]) == 2.0


def _laplacian_of(G, f, scale):
    return scale * interior(laplacian(fill_halo(f, G, CENTRE), G), G)


@pytest.mark.multidevice
def test_shard_map_fields_called_eagerly_on_a_mesh_compiles_once(compilations):
    """Called eagerly on a mesh, shard_map_fields ran jax.shard_map on a new function at
    every call, which compiled its body again operation by operation: 67 programs and 2-3 s
    at every call of a 256² Laplacian on a 2×2 mesh, which runs in 1 ms compiled. A second
    call, through the same wrapper or a new one, and with new field values, now compiles
    nothing; the result is the one-device one."""
    g = Grid((12, 16), (1.0, 2.0), periodic=(False, True), dtype="float64")
    mesh = make_mesh((2, 2))
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.normal(size=g.shape)) for _ in range(2))
    shard_map_fields(_laplacian_of, g, mesh)(a, 2.0)
    with compilations() as seen:
        out = shard_map_fields(_laplacian_of, g, mesh)(b, 2.0).block_until_ready()
    assert seen == []
    one = _laplacian_of(g, b, 2.0)
    np.testing.assert_allclose(out, one, rtol=0, atol=1e-12 * float(jnp.abs(one).max()))
    assert out.sharding.spec == jax.sharding.PartitionSpec("y", "x")


def test_shard_map_fields_names_a_padded_result_on_one_device_too():
    """Without a mesh (or on a mesh of one device) a padded result was returned as it was:
    code that passed on one device was refused only once it ran on a mesh."""
    g = Grid((8, 8), (1.0, 2.0))
    a = jnp.asarray(np.random.default_rng(0).normal(size=g.shape), g.dtype)
    for mesh in (None, make_mesh((1, 1))):
        padded = shard_map_fields(lambda G, f: laplacian(fill_halo(f, G), G), g, mesh)
        with pytest.raises(ValueError, match=r"shape \(10, 10\), the grid's shape \(8, 8\)"):
            padded(a)
        with pytest.raises(ValueError, match=r"shape \(10, 10\), the grid's shape \(8, 8\)"):
            jax.jit(padded)(a)
        # any width of halo, not only the grid's: (12, 12) was returned as it was
        wide = shard_map_fields(lambda G, f: fill_halo(f, G, width=2), g, mesh)
        with pytest.raises(ValueError, match=r"shape \(12, 12\), .* with a halo of 2 cell"):
            wide(a)
        good = shard_map_fields(lambda G, f: (interior(fill_halo(f, G), G), 2.0), g, mesh)
        np.testing.assert_array_equal(good(a)[0], a)
        # arrays that only share the trailing size of one axis are no padded fields
        other = shard_map_fields(lambda G, f: (f, jnp.zeros((10, 8)), jnp.zeros((9, 11))), g, mesh)
        assert [x.shape for x in other(a)] == [(8, 8), (10, 8), (9, 11)]


@pytest.mark.multidevice
def test_exchange_halo_checks_its_block_count_width_and_mesh_axis():
    """num_blocks=2 on a mesh axis of 4 devices exchanged with the wrong neighbours and
    returned wrong halos without an error; a width wider than the block stopped in
    lax.slice, and a call outside shard_map with ppermute's "evaluation rule" message."""
    from jax.sharding import PartitionSpec as P

    from physjax.parallel import exchange_halo

    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    mesh = make_mesh((4, 1))
    x = jnp.arange(32.0).reshape(8, 4)

    def run(**kwargs):
        def body(f):
            return jnp.concatenate(exchange_halo(f, axis=0, axis_name="y", **kwargs))

        return jax.shard_map(body, mesh=mesh, in_specs=P("y", None), out_specs=P("y", None))(x)

    good = np.asarray(run(width=1, num_blocks=4, periodic=True))
    blocks = np.asarray(x).reshape(4, 2, 4)
    np.testing.assert_array_equal(good[0::2], np.roll(blocks[:, -1], 1, axis=0))
    np.testing.assert_array_equal(good[1::2], np.roll(blocks[:, 0], -1, axis=0))
    with pytest.raises(ValueError, match="num_blocks=2 but the mesh axis 'y' has 4 devices"):
        run(width=1, num_blocks=2, periodic=True)
    for width in (0, 3):
        with pytest.raises(ValueError, match=f"width must be .* 2 cells along axis 0, got {width}"):
            run(width=width, num_blocks=4, periodic=False)
    with pytest.raises(ValueError, match=r"needs the mesh axis 'y': call it inside jax.shard_map"):
        exchange_halo(x, axis=0, width=1, axis_name="y", num_blocks=4, periodic=True)


def test_on_mesh_refuses_block_counts_that_are_not_whole_numbers():
    """int() took mesh_shape 2.5 for 2 blocks, and "2" or True for a count."""
    g = Grid((8, 8), (1.0, 1.0))
    assert g.on_mesh(("y", "x"), (np.int64(2), 1)).local_shape == (4, 8)
    for bad in [(2.5, 1), ("2", 1), (True, 1), 2]:
        with pytest.raises(ValueError, match="mesh_shape must be"):
            g.on_mesh(("y", "x"), bad)
        with pytest.raises(ValueError, match="mesh_shape must be"):
            Grid((8, 8), (1.0, 1.0), mesh_axes=("y", "x"), mesh_shape=bad)


@pytest.mark.multidevice
def test_field_spec_names_a_mesh_of_other_axes_and_a_negative_batch():
    """field_spec of a 3-D grid on a 2-D mesh stopped with KeyError: 'z', and batch_dims=-1
    gave the spec of an unbatched field."""
    from jax.sharding import PartitionSpec as P

    from physjax.parallel import field_spec

    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    grid3 = Grid((4, 8, 8), (1.0, 1.0, 1.0))
    assert field_spec(grid3, make_mesh((2, 1, 2)), batch_dims=1) == P(None, "z", None, "x")
    with pytest.raises(ValueError, match=r"named like the grid axes .*make_mesh\(n, ndim=3\)"):
        field_spec(grid3, make_mesh((2, 2)))
    with pytest.raises(ValueError, match="batch_dims must be a whole number >= 0, got -1"):
        field_spec(Grid((8, 8), (1.0, 1.0)), make_mesh((2, 2)), batch_dims=-1)


def test_stencils_name_a_grid_or_field_in_the_wrong_place():
    """diff_x_c2f(grid, f) stopped in lax.slice ("Error interpreting argument to slice"),
    a number for the grid or a list for the field with AttributeError: ... 'ndim'."""
    from physjax.grids import diff_z_f2c, interp_y_f2c

    g = Grid((4, 6), (1.0, 3.0), dtype="float64")
    p = fill_halo(jnp.arange(24.0).reshape(4, 6), g)
    np.testing.assert_array_equal(diff_x_c2f(np.asarray(p), g), diff_x_c2f(p, g))
    with pytest.raises(TypeError, match="takes a halo-padded field .* first, .* got Grid"):
        diff_x_c2f(g, p)
    with pytest.raises(TypeError, match="takes a halo-padded field .* got list"):
        interp_y_f2c(p.tolist())
    with pytest.raises(TypeError, match="grid must be a physjax.grids.Grid, got float"):
        diff_y_f2c(p, 0.5)
    with pytest.raises(TypeError, match="grid must be a physjax.grids.Grid, got float"):
        laplacian(p, 0.5)
    with pytest.raises(TypeError, match="takes a halo-padded field .* got Grid"):
        laplacian(g, p)
    with pytest.raises(TypeError, match="grid must be a physjax.grids.Grid, got ArrayImpl"):
        diff_z_f2c(jnp.ones((3, 4, 5)), jnp.ones(3))


def test_fill_halo_and_interior_name_a_field_or_grid_of_the_wrong_type():
    """interior of a list and fill_halo or interior with a number for the grid stopped with
    AttributeError: ... 'ndim'."""
    g = Grid((4, 6), (1.0, 3.0), dtype="float64")
    p = fill_halo(np.arange(24.0).reshape(4, 6), g)
    np.testing.assert_array_equal(interior(np.asarray(p), g), np.arange(24.0).reshape(4, 6))
    with pytest.raises(TypeError, match="padded must be a jax or NumPy array, got list"):
        interior(p.tolist(), g)
    with pytest.raises(TypeError, match="grid must be a physjax.grids.Grid, got float"):
        interior(p, 0.5)
    with pytest.raises(TypeError, match="grid must be a physjax.grids.Grid, got float"):
        fill_halo(jnp.ones((4, 6)), 0.5)
    with pytest.raises(TypeError, match="field must be a jax or NumPy array, got Grid"):
        fill_halo(g, jnp.ones((4, 6)))


def test_fill_halo_points_a_stack_of_fields_to_vmap():
    """A (3, ny, nx) stack was refused as having the wrong number of dimensions, with no word
    that jax.vmap gives fill_halo batch axes; the message says so now, and vmap agrees with a
    loop."""
    g = Grid((4, 6), (1.0, 3.0), periodic=(False, True), dtype="float64")
    stack = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 6)))
    with pytest.raises(
        ValueError, match=r"got shape \(3, 4, 6\); .*jax\.vmap\(lambda f: fill_halo"
    ):
        fill_halo(stack, g)
    with pytest.raises(ValueError, match=r"got shape \(3, 5, 6\)$"):  # not a stack of g's
        fill_halo(jnp.ones((3, 5, 6)), g)
    mapped = jax.vmap(lambda f: fill_halo(f, g, parity=-1))(stack)
    looped = jnp.stack([fill_halo(f, g, parity=-1) for f in stack])
    assert mapped.shape == (3, 6, 8)
    np.testing.assert_array_equal(mapped, looped)


def test_zero_dimensional_integer_arrays_are_sizes_for_shape():
    """jnp.array([4, 8]) was refused as "ny must be a positive integer, got Array(4, ...)"
    while the same array was taken for extent."""
    g = Grid(jnp.array([4, 8]), jnp.array([2.0, 8.0]))
    assert g.shape == (4, 8) and all(type(n) is int for n in g.shape)
    assert Grid((np.int32(4), jnp.int32(8)), (1.0, 1.0)).shape == (4, 8)
    with pytest.raises(ValueError, match="grid size ny must be a positive integer, got 4.0"):
        Grid(jnp.array([4.0, 8.0]), (1.0, 1.0))
    with pytest.raises(ValueError, match="grid size nx must be a positive integer, got 0"):
        Grid(jnp.array([4, 0]), (1.0, 1.0))


def test_local_index_refuses_an_axis_the_grid_does_not_have():
    """local_index(2) of a 2-D grid wrapped round to axis 0 (y) and gave y's indices;
    block_index(2) raised a bare IndexError, local_index("x") a string-formatting one."""
    g = Grid((4, 8), (1.0, 1.0))
    np.testing.assert_array_equal(g.local_index(-1), np.arange(8))
    np.testing.assert_array_equal(g.local_index(0, padded=True), np.arange(-1, 5))
    for bad in (2, -3, "x", True):
        with pytest.raises(ValueError, match=r"axis must be an array axis of the 2-D grid, -2"):
            g.local_index(bad)
        with pytest.raises(ValueError, match=r"axis must be an array axis of the 2-D grid"):
            g.block_index(bad)


def test_parallel_helpers_name_a_mesh_or_grid_of_the_wrong_type():
    """shard, decompose and field_spec with mesh=None, shard_map_fields and error_if with a
    count for the mesh, and decompose(mesh, grid) stopped with AttributeError."""
    from physjax.parallel import error_if, field_spec

    g = Grid((4, 8), (1.0, 1.0))
    f = jnp.ones(g.shape)
    np.testing.assert_array_equal(shard_map_fields(lambda G, a: 2 * a, g, None)(f), 2 * f)
    for call in (
        lambda: shard(f, g, None),
        lambda: decompose(g, None),
        lambda: field_spec(g, None),
    ):
        with pytest.raises(TypeError, match=r"mesh must be a jax.sharding.Mesh, got None"):
            call()
    for call in (
        lambda: shard_map_fields(lambda G, a: a, g, 4),
        lambda: error_if(f, False, "boom", g, 4),
    ):
        with pytest.raises(TypeError, match=r"mesh must be a jax.sharding.Mesh, got int: build"):
            call()
    with pytest.raises(TypeError, match="grid must be a physjax.grids.Grid, got Mesh"):
        decompose(make_mesh((1, 1)), g)


@pytest.mark.multidevice
@pytest.mark.parametrize("layout", [(2, 1, 2), (4, 1, 1), (1, 2, 2)])
def test_3d_stencils_sharded_equal_one_device_batched_and_differentiated(layout):
    """The z stencils with a z-face field on a walled z, a no-slip x-face field and a
    centre field, on a 3-D mesh: equal to one device to 1e-12 for a vmapped batch of two,
    and their gradient too."""
    from physjax.grids import diff_z_c2f, diff_z_f2c, interp_z_c2f, interp_z_f2c

    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    g = Grid((8, 4, 12), (1.0, 2.0, 3.0), periodic=(False, True, False), dtype="float64")
    f = jnp.asarray(np.random.default_rng(1).normal(size=(2, *g.shape)))

    def op(grid, a):
        c = fill_halo(a, grid)
        w = fill_halo(a, grid, ("face", "centre", "centre"))
        u = fill_halo(a, grid, ("centre", "centre", "face"), parity=-1)
        r = laplacian(c, grid) + diff_z_f2c(w, grid) * interp_z_c2f(c) + interp_z_f2c(w)
        return interior(r + diff_z_c2f(c, grid) + diff_x_c2f(u, grid), grid)

    batched = lambda grid, a: jax.vmap(lambda x: op(grid, x))(a)
    mesh = make_mesh(layout)
    ref = batched(g, f)
    out = jax.jit(shard_map_fields(batched, g, mesh))(shard(f, g, mesh))
    scale = float(jnp.abs(ref).max())
    assert float(jnp.abs(out - ref).max()) <= 1e-12 * scale
    assert out.sharding.shard_shape(out.shape)[1:] == tuple(n // m for n, m in zip(g.shape, layout))
    loss = lambda fn: jax.grad(lambda a: jnp.sum(fn(a) ** 2))
    one = loss(lambda a: batched(g, a))(f)
    many = jax.jit(loss(shard_map_fields(batched, g, mesh)))(shard(f, g, mesh))
    assert float(jnp.abs(many - one).max()) <= 1e-12 * float(jnp.abs(one).max())


@pytest.mark.multidevice
def test_a_mesh_of_explicit_axes_is_refused_by_name():
    """jax.make_mesh's default mesh (Explicit axes) stopped shard_map_fields with jax's
    "in_specs ... does not match the specs of the input", a sharded input (and a solver's
    run) with "slicing on sharded dims ... is not implemented"; it is now refused, naming
    axis_types, before anything compiles. Auto axes from jax.make_mesh work as ours do."""
    from jax.sharding import AxisType

    from physjax.parallel import error_if

    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    g = Grid((8, 12), (1.0, 2.0), periodic=(False, True), dtype="float64")
    f = jnp.asarray(np.random.default_rng(0).normal(size=g.shape))
    explicit = jax.make_mesh((2, 2), ("y", "x"), axis_types=(AxisType.Explicit,) * 2)
    match = r"axis_types \('Explicit', 'Explicit'\); .* physjax.parallel.make_mesh\(n, ndim=2\)"
    for call in (
        lambda: shard_map_fields(_laplacian_of, g, explicit)(f, 1.0),
        lambda: shard(f, g, explicit),
        lambda: error_if(f, False, "boom", g, explicit),
    ):
        with pytest.raises(ValueError, match=match):
            call()
    auto = jax.make_mesh((2, 2), ("y", "x"), axis_types=(AxisType.Auto,) * 2)
    out = shard_map_fields(_laplacian_of, g, auto)(f, 1.0)
    np.testing.assert_allclose(out, _laplacian_of(g, f, 1.0), rtol=0, atol=1e-9)
    # physjax's own meshes name their axis types rather than rely on Mesh's default
    for layout in ((2, 2), (1, 2, 2)):
        kinds = {t.name for t in make_mesh(layout).axis_types}
        assert kinds == {"Auto"}, (layout, kinds)


def test_a_zero_dimensional_array_is_one_periodic_flag_or_parity():
    """periodic=np.array(False) (one flag for every axis) and parity=np.array(-1) (one
    parity for every axis) stopped with TypeError: iteration over a 0-d array."""
    for flag in (np.array(False), jnp.array(False)):
        assert Grid((4, 6), (1.0, 1.0), periodic=flag).periodic == (False, False)
    assert Grid((4, 6), (1.0, 1.0), periodic=np.array(True)).periodic == (True, True)
    g = Grid((4, 6), (1.0, 1.0), periodic=False, dtype="float64")
    f = jnp.arange(24.0).reshape(4, 6)
    for p in (np.array(-1), jnp.array(-1)):
        np.testing.assert_array_equal(fill_halo(f, g, parity=p), fill_halo(f, g, parity=-1))
    with pytest.raises(ValueError, match=r"parity must give \+1 or -1 .* got array\(2\)"):
        fill_halo(f, g, parity=np.array(2))
    with pytest.raises(ValueError, match="periodic must be a sequence"):
        Grid((4, 6), (1.0, 1.0), periodic=np.array(2))


def test_a_split_without_a_mesh_axis_is_refused():
    """on_mesh((None, "x"), (2, 2)) (y "not split" and split in two) was accepted with
    blocks of half the rows whose y halo fill_halo then wrapped within the block: wrong
    halos, no error. The same in the constructor, where mesh_axes defaults to None."""
    g = Grid((8, 12), (1.0, 1.0))
    with pytest.raises(ValueError, match=r"mesh_shape splits y 2 ways but mesh_axes names no"):
        g.on_mesh((None, "x"), (2, 2))
    with pytest.raises(ValueError, match=r"mesh_shape splits x 3 ways but mesh_axes names no"):
        Grid((8, 12), (1.0, 1.0), mesh_shape=(1, 3))
    assert g.on_mesh((None, "x"), (1, 2)).local_shape == (8, 6)


def test_local_coordinates_of_a_float64_grid_need_x64():
    """Without x64 a float64 grid's local_coordinates were float32 (jax truncated the
    astype with no more than a warning), though documented in the grid's dtype."""
    g = Grid((3, 4), (3.0, 4.0), dtype="float64")
    assert g.local_coordinates("x", "face").dtype == jnp.float64
    with pytest.raises(ValueError, match="grid.dtype is float64 but jax_enable_x64 is off"):
        with jax.enable_x64(False):
            g.local_coordinates("x", "face")
    with jax.enable_x64(False):
        assert Grid((3, 4), (3.0, 4.0)).local_coordinates("y").dtype == jnp.float32


def test_stencils_of_a_bool_mask_or_int8_field_equal_those_of_the_float_field():
    """``True + True`` is ``True`` and int8 sums wrap: the average of two sea cells of a
    bool land/sea mask came out 0.5 (every interior face of an all-sea row), int8 values of
    100 averaged to -28 and their Laplacian overflowed in ``2 * f``; differences of a bool
    mask stopped in ``sub``. Each stencil now gives what it gives for the same values as
    floats, in the default floating dtype."""
    g2 = Grid((3, 6), (1.0, 1.0))
    sea = fill_halo(jnp.ones(g2.shape, bool), g2)
    np.testing.assert_array_equal(interior(interp_x_c2f(sea), g2), 1.0)
    g = Grid((4, 3, 6), (1.0, 0.75, 1.5), periodic=(False, True, False))
    mask = np.random.default_rng(3).random(g.shape) > 0.3  # sea
    values = np.where(mask, 100, -100).astype(np.int8)
    for field in (jnp.asarray(mask), jnp.asarray(values)):
        p, ref = fill_halo(field, g), fill_halo(field.astype(jnp.float64), g)
        stencils = [
            (getattr(grids, f"interp_{a}_{k}"), False) for a in "zyx" for k in ("c2f", "f2c")
        ]
        stencils += [(getattr(grids, f"diff_{a}_{k}"), True) for a in "zyx" for k in ("c2f", "f2c")]
        stencils.append((laplacian, True))
        for stencil, takes_grid in stencils:
            out, want = (stencil(q, g) if takes_grid else stencil(q) for q in (p, ref))
            assert out.dtype == jnp.float64, (stencil.__name__, out.dtype)
            np.testing.assert_array_equal(interior(out, g), interior(want, g), stencil.__name__)


_GRADS_ON_MESHES = """
import jax, jax.numpy as jnp, numpy as np, sys
jax.config.update("jax_enable_x64", True)
from physjax.grids import Grid, fill_halo, interior, laplacian
from physjax.parallel import make_mesh, shard_map_fields

g = Grid((16, 12), (2.0, 3.0), dtype="float64")
a = jnp.asarray(np.random.default_rng(3).standard_normal(g.shape))
w = jnp.asarray(np.random.default_rng(4).standard_normal(g.shape))
jit_loss = sys.argv[1] == "jit"

def op(g, a):
    return interior(laplacian(fill_halo(jnp.sin(a), g), g), g)

def grad(mesh):
    def loss(a):
        return jnp.sum(shard_map_fields(op, g, mesh)(a) * w)
    return (jax.jit(jax.grad(loss)) if jit_loss else jax.grad(loss))(a)

# the meshes of several devices first: after a first gradient on one device the defect
# below does not show, so it depends on what the process did before
grads = {s: grad(make_mesh(s)) for s in [(4, 1), (2, 2), (1, 4)]}
one = grad(make_mesh((1, 1)))
print(max(float(jnp.max(jnp.abs(v - one))) for v in grads.values()))
"""


def _grads_on_meshes(mode: str) -> subprocess.CompletedProcess:
    """Gradients of ``sum(op(a) * w)`` through ``shard_map_fields`` on three meshes in turn
    (``w`` a closed-over array on one device), in a fresh process with 4 simulated devices,
    eagerly or with the loss jitted; prints the largest difference from one device."""
    code = _GRADS_ON_MESHES
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run(
        [sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.multidevice
def test_gradients_on_several_meshes_in_one_process_under_a_jitted_loss():
    """The workaround docs/parallel.md gives for the JAX defect below: with the loss jitted,
    one mesh after another differentiates, each equal to one device."""
    done = _grads_on_meshes("jit")
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) <= 1e-12, done.stdout


@pytest.mark.multidevice
@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="JAX 0.10: an eager jax.grad through a jitted shard_map on a second mesh, with a "
    "closed-over single-device array in the loss, takes the first mesh for the cotangent "
    "('is incompatible with mesh_shape'); docs/parallel.md. Strict: passes once JAX is fixed.",
)
def test_eager_gradients_on_a_second_mesh_with_a_closed_over_array():
    done = _grads_on_meshes("eager")
    if done.returncode != 0 and "is incompatible with mesh_shape" not in done.stderr:
        pytest.fail(f"not the known JAX defect:\n{done.stderr[-2000:]}")
    assert done.returncode == 0, "the known JAX defect"
    if not float(done.stdout.split()[-1]) <= 1e-12:  # once JAX is fixed, the numbers count
        pytest.fail(f"the meshes differ from one device by {done.stdout}")


def _wall_pad(a, axis, w, location, parity):
    """NumPy reference of a wall's ghosts, index by index: a centre mirrors about the wall
    half a cell beyond its last value (ghost k of the high side is value n-1-k); a face
    (face 0 on the low wall, face n on the high wall, not stored) reflects oddly about
    each wall."""
    a = np.moveaxis(a, axis, 0)
    n = a.shape[0]
    if location == "centre":
        low = [parity * a[k] for k in range(w)][::-1]  # ghost -1-k is value k
        high = [parity * a[n - 1 - k] for k in range(w)]  # ghost n+k is value n-1-k
    else:
        low = [-a[k + 1] for k in range(w)][::-1]  # ghost -1-k is -(value 1+k)
        high = [np.zeros_like(a[0])] + [-a[n - k] for k in range(1, w)]  # face n is 0
    out = np.concatenate([np.stack(low), a, np.stack(high)])
    return np.moveaxis(out, 0, axis)


@pytest.mark.parametrize("parity", [1, -1])
def test_wall_halos_wider_than_one_cell_mirror_in_order(parity):
    """Halos of width 2 and 3 on walls: checked before by shape or by values found
    somewhere near, which would not see ghosts in the wrong order (a high-side centre halo
    not mirrored passed every test)."""
    rng = np.random.default_rng(0)
    for width in (2, 3):
        g = Grid((6, 5), (1.0, 1.0), periodic=False, halo=width, dtype="float64")
        f = rng.normal(size=g.shape)
        got = np.asarray(fill_halo(jnp.asarray(f), g, parity=(parity, parity)))
        want = _wall_pad(_wall_pad(f, 0, width, "centre", parity), 1, width, "centre", parity)
        np.testing.assert_array_equal(got, want)
        # an x-face field: odd about the walls along x, a centre along y
        got = np.asarray(fill_halo(jnp.asarray(f), g, X_FACE, (parity, -1)))
        want = _wall_pad(_wall_pad(f, 0, width, "centre", parity), 1, width, "face", -1)
        np.testing.assert_array_equal(got, want)


def test_local_coordinates_take_the_origin_and_put_faces_on_the_low_side():
    """`local_coordinates` start at the origin, faces on the low side of their cells."""
    g = Grid((3, 4), (3.0, 8.0), origin=(-1.0, 10.0), dtype="float64")
    np.testing.assert_array_equal(g.local_coordinates("x", "face"), [10.0, 12.0, 14.0, 16.0])
    np.testing.assert_array_equal(g.local_coordinates("y", "centre"), [-0.5, 0.5, 1.5])
    for name in ("y", "x"):
        for s in ("centre", "face"):
            np.testing.assert_array_equal(g.local_coordinates(name, s), g.coordinates(name, s))
    # padded: one halo point each side, continuing the face spacing
    np.testing.assert_array_equal(
        g.local_coordinates("x", "face", padded=True), [8.0, 10.0, 12.0, 14.0, 16.0, 18.0]
    )


@pytest.mark.parametrize("periodic", [(False,), (False, True, True)])
def test_grid_refuses_a_periodic_flag_count_unlike_the_axes(periodic):
    """One periodic flag per axis, or an error naming `periodic`."""
    with pytest.raises(ValueError, match=r"periodic must have 2 entries"):
        Grid((4, 6), (1.0, 1.0), periodic=periodic)


@pytest.mark.parametrize("origin", [(5.0,), (5.0, 6.0, 7.0)])
def test_grid_refuses_an_origin_of_another_length(origin):
    """One origin per axis, or an error naming `origin`."""
    with pytest.raises(ValueError, match=r"origin must be 2 finite numbers"):
        Grid((4, 6), (1.0, 1.0), origin=origin)


@pytest.mark.multidevice
def test_exchange_halo_on_a_non_periodic_axis_gives_the_outer_blocks_zeros():
    """`exchange_halo` along a walled axis: neighbours' columns inside, zeros at the outer sides."""
    from jax.sharding import PartitionSpec as P

    from physjax.parallel import exchange_halo, make_mesh

    assert jax.device_count() >= 4, "needs 4 (simulated) devices: see tests/conftest.py"
    x = jnp.arange(1.0, 33.0).reshape(4, 8)  # no zeros in the data
    mesh = make_mesh((1, 4))  # split along x, axis 1

    def body(f):
        low, high = exchange_halo(f, axis=1, width=1, axis_name="x", num_blocks=4, periodic=False)
        return jnp.concatenate([low, high], axis=1)

    got = np.asarray(
        jax.shard_map(body, mesh=mesh, in_specs=P(None, "x"), out_specs=P(None, "x"))(x)
    )
    blocks = np.asarray(x).reshape(4, 4, 2)  # (row, block, column within block)
    low, high = got[:, 0::2], got[:, 1::2]  # per block
    np.testing.assert_array_equal(low[:, 0], 0.0)  # block 0 has no block below
    np.testing.assert_array_equal(high[:, 3], 0.0)  # block 3 has none above
    np.testing.assert_array_equal(low[:, 1:], blocks[:, :3, -1])
    np.testing.assert_array_equal(high[:, :3], blocks[:, 1:, 0])


def test_make_mesh_splits_y_first_in_3d_too():
    """A 3-D default mesh splits y first, as in 2-D."""
    assert dict(make_mesh(2, ndim=3).shape) == {"z": 1, "y": 2, "x": 1}
    assert dict(make_mesh(2).shape) == {"y": 2, "x": 1}


def test_make_mesh_of_zero_devices_is_refused_by_name():
    """Zero or negative devices: an error naming `devices`."""
    for bad in (0, np.int64(0), -1):
        with pytest.raises(ValueError, match=r"devices must be a positive integer, got"):
            make_mesh(bad)


@pytest.mark.multidevice
def test_shard_map_fields_refuses_a_mesh_that_does_not_divide_the_grid_eagerly():
    """A mesh that does not divide the grid is refused when the function is built."""
    odd = Grid((6, 16), (1.0, 1.0), dtype="float64")
    with pytest.raises(ValueError, match="the mesh does not divide the grid: ny=6 cannot be split"):
        shard_map_fields(lambda g, f: f, odd, make_mesh((4, 1)))


@pytest.mark.multidevice
def test_the_writer_stores_the_whole_field_of_a_sharded_array(tmp_path):
    """A field split over a 2×2 mesh is written whole."""
    from physjax.io import NetCDFWriter, Variable, read_frame, read_static

    g = Grid((4, 6), (4e3, 6e3), dtype="float32")
    mesh = make_mesh((2, 2))
    h = np.arange(24, dtype=np.float32).reshape(g.shape)
    hs, bs = shard((h, 2 * h), g, mesh)
    assert len(hs.sharding.device_set) == 4 and hs.sharding.shard_shape(hs.shape) == (2, 3)
    path = tmp_path / "sharded.nc"
    w = NetCDFWriter(
        path, g, [Variable("h", CENTRE, "m", "H"), Variable("b", CENTRE, "m", "B", False)]
    )
    w.write_static({"b": bs})
    w.append(0.0, 0, {"h": hs})
    w.append(1.0, 1, {"h": hs + 1})
    w.finish()
    np.testing.assert_array_equal(read_frame(path, 0)["h"], h)
    np.testing.assert_array_equal(read_frame(path, -1)["h"], h + 1)
    np.testing.assert_array_equal(read_static(path)["b"], 2 * h)
