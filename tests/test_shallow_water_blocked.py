"""Shallow water advanced in cache-blocked strips of rows: the same result as the plain step
(to the last bit with one step per visit of a strip, to round-off with several), for every
boundary and forcing; the automatic choice; bad input."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from physjax.grids import CENTRE, Grid
from physjax.parallel import make_mesh
from physjax.solvers import ShallowWater
from physjax.solvers.shallow_water import _model, make_case
from physjax.solvers.shallow_water._blocked import auto_strip_rows
from physjax.solvers.shallow_water._model import _strip_plan

NY, NX = 48, 40

# The suite compiles with XLA's older kernel emitter (tests/conftest.py), whose kernels may
# contract a multiply-add where the default ones do not: the plain step and the strips then
# agree to the last bit or two only. The last bit itself, as the package compiles, is checked
# by test_one_step_strips_equal_the_plain_step_to_the_last_bit_under_xla_defaults.
FAST_FLAGS = os.environ.get("PHYSJAX_TEST_FAST_FLAGS", "").split()
LAST_BIT = "--xla_cpu_use_fusion_emitters=false" not in FAST_FLAGS


def assert_same_bits(a, b):
    """Bit for bit under XLA's default emitters; to round-off (relative to the field's largest
    value) under the suite's fast-compiling ones."""
    a, b = np.asarray(a), np.asarray(b)
    if LAST_BIT:
        np.testing.assert_array_equal(a, b)
    else:
        # measured, relative to the field's largest value: h 7e-16 and u, v 4e-14 in float64
        # after 30 steps (a 1-ulp difference in h moves u and v through g ∂h/∂x), h 4e-7 in
        # float32 after 50; the round-off bound of the suite's other comparisons
        tol = {np.float64: 1e-12, np.float32: 2e-6}[a.dtype.type]
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(a)), np.max(np.abs(a - b))


def _jaxpr(fn, state):
    return str(jax.make_jaxpr(fn)(state))


def assert_strips_taken(plain, blocked, state, dt, several=False):
    """``blocked`` advances in strips: its step is not the plain step, and (``several``) a
    run of ``strip_steps`` steps takes them in one visit of each strip (the S-step strip
    function is traced, not S single steps). The comparisons of this file would pass
    between two plain runs: with the strips skipped (no strip rows in ``_stepper``) every
    test here passed, and with one step per visit (no block) every test of several."""
    rows, steps = _strip_plan(blocked)
    assert rows > 0, "no strips planned"
    plain_step = _jaxpr(lambda st: plain.step(st, dt), state)
    assert _jaxpr(lambda st: blocked.step(st, dt), state) != plain_step, "plain step taken"
    if several:
        assert steps > 1
        traced, real = [], _model.blocked_ssprk3_steps

        def spy(*args, **kwargs):
            traced.append(1)
            return real(*args, **kwargs)

        _model.blocked_ssprk3_steps = spy
        try:  # traced afresh, on one device
            _jaxpr(lambda st: _model._advance.__wrapped__(blocked, st, 0.0, dt, steps, None), state)
        finally:
            _model.blocked_ssprk3_steps = real
        assert traced, "one step per visit was taken"


def _setup(periodic, dtype="float64", bottom=False, wind=False, seed=1, **kw):
    g = Grid((NY, NX), (4.8e5, 4.0e5), periodic=periodic, dtype=dtype)
    rng = np.random.default_rng(seed)
    y, x = g.mesh_coordinates(CENTRE)
    h = 1000 + 10 * np.exp(-((x - 2e5) ** 2 + (y - 2.4e5) ** 2) / 5e4**2)
    h = h + rng.standard_normal((NY, NX))
    if bottom:
        kw["bottom"] = 5 * rng.standard_normal((NY, NX))
    if wind:
        kw["wind_stress"] = tuple(0.1 * rng.standard_normal((NY, NX)) for _ in range(2))
    model = ShallowWater(g, strip_rows=0, **kw)
    state = model.initial_state(
        h, 0.3 * rng.standard_normal((NY, NX)), 0.3 * rng.standard_normal((NY, NX))
    )
    return model, state, 0.5 * model.max_stable_dt(state)


FULL = dict(beta=1e-11, viscosity=100.0, drag=1e-6, bottom=True, wind=True)

CASES = [
    (True, 16, FULL, True),  # doubly periodic, every term
    ((False, True), 12, dict(FULL, boundary="no-slip"), True),  # channel: walls across
    (False, 8, FULL, False),  # closed basin
    (False, NY, dict(boundary="no-slip", viscosity=50.0), True),  # one strip, both walls
    pytest.param((False, True), 8, dict(beta=1e-11), False, marks=pytest.mark.slow),
    pytest.param(
        (True, False),
        6,
        dict(beta=1e-11, viscosity=100.0, bottom=True),
        False,
        marks=pytest.mark.slow,
    ),  # walls along the strips
    pytest.param(
        False, 3, dict(boundary="no-slip", viscosity=50.0), False, marks=pytest.mark.slow
    ),  # smallest strip
]


@pytest.mark.parametrize("periodic, m, kw, check_step", CASES)
def test_strips_equal_plain_step_bit_for_bit(periodic, m, kw, check_step):
    plain, s, dt = _setup(periodic, **kw)
    blocked = dataclasses.replace(plain, strip_rows=m, strip_steps=1)
    assert_strips_taken(plain, blocked, s, dt)
    sol_a = plain.run(s, dt=dt, n_steps=30, save_every=10)
    sol_b = blocked.run(s, dt=dt, n_steps=30, save_every=10)
    for a, b in zip(jax.tree.leaves(sol_a.states), jax.tree.leaves(sol_b.states)):
        assert_same_bits(a, b)
    # the run moved: the comparison is not between two copies of the initial state
    assert float(jnp.max(jnp.abs(sol_a.states.h[-1] - s.h))) > 1e-3
    if not check_step:
        return
    # A compiled single step too. (Run eagerly, op by op, the plain step has no fused
    # multiply-adds while the strip loop is always compiled: they then differ in the last bit.)
    step_a = jax.jit(lambda st: plain.step(st, dt))(s)
    step_b = jax.jit(lambda st: blocked.step(st, dt))(s)
    for a, b in zip(jax.tree.leaves(step_a), jax.tree.leaves(step_b)):
        if m < NY:
            assert_same_bits(a, b)
        else:
            # One strip: XLA inlines the one-trip loop and fuses it with its surroundings,
            # which may contract a multiply-add differently (last bit).
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-15)


def _rows(case):
    return (case.values if hasattr(case, "values") else case)[1]


@pytest.mark.parametrize("periodic, m, kw, check_step", [c for c in CASES if _rows(c) >= 6])
def test_strips_of_several_steps_equal_plain_steps(periodic, m, kw, check_step):
    """Several steps per visit of a strip (``3 S`` rows of overlap, walls refilled between
    the steps): the plain steps' result to round-off, with frames of 10 steps = blocks of
    ``S`` steps and single steps for the rest."""
    steps = min(3, m // 3)
    plain, s, dt = _setup(periodic, **kw)
    a = plain.run(s, dt=dt, n_steps=30, save_every=10).states
    # the default for strips of m rows is min(3, m // 3) steps per visit
    blocked = dataclasses.replace(plain, strip_rows=m)
    assert _strip_plan(blocked) == (m, steps)
    assert_strips_taken(plain, blocked, s, dt, several=True)
    b = blocked.run(s, dt=dt, n_steps=30, save_every=10).states
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(x))
    assert float(jnp.max(jnp.abs(a.h[-1] - s.h))) > 1e-3


# strips of m rows that do not divide NY = 48, with S steps per visit: the first strip takes
# the rest (r rows, or r + m when r is under the 3 S rows of overlap, the whole grid when
# nothing is left)
UNEVEN = [
    (True, 10, FULL, (3,)),  # r = 8 < 9: a first strip of 18 rows
    ((False, True), 45, dict(FULL, boundary="no-slip"), (1,)),  # r = 3: a first strip of 3
    pytest.param(True, 10, FULL, (1,), marks=pytest.mark.slow),  # r = 8: a first strip of 8
    pytest.param(  # r = 8: 8 or 28 rows, one loop strip
        (False, True), 20, dict(FULL, boundary="no-slip"), (1, 3), marks=pytest.mark.slow
    ),
    pytest.param(False, 30, FULL, (1, 3), marks=pytest.mark.slow),  # r = 18 (walls all round)
    pytest.param(  # r = 3 < 9: the whole grid in the first strip
        (False, True), 45, dict(FULL, boundary="no-slip"), (3,), marks=pytest.mark.slow
    ),
    pytest.param(False, 40, FULL, (1, 3), marks=pytest.mark.slow),  # 8 rows or the whole grid
    pytest.param((True, False), 13, FULL, (1, 3), marks=pytest.mark.slow),  # r = 9, walls along
]


@pytest.mark.parametrize("periodic, m, kw, steps_per_visit", UNEVEN)
def test_strips_that_do_not_divide_the_grid_equal_plain_steps(periodic, m, kw, steps_per_visit):
    """Strips of rows that do not divide ny: one step per visit gives the plain step's
    result to the last bit, several (3) agree to round-off."""
    plain, s, dt = _setup(periodic, **kw)
    a = plain.run(s, dt=dt, n_steps=12, save_every=6).states
    assert float(jnp.max(jnp.abs(a.h[-1] - s.h))) > 1e-3
    for steps in steps_per_visit:
        blocked = dataclasses.replace(plain, strip_rows=m, strip_steps=steps)
        assert_strips_taken(plain, blocked, s, dt)
        b = blocked.run(s, dt=dt, n_steps=12, save_every=6).states
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            x, y = np.asarray(x), np.asarray(y)
            if steps == 1:
                assert_same_bits(x, y)
            else:
                assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(x))


@pytest.mark.parametrize(
    "ny, Ly, m", [(42, 6.0e5, 6), pytest.param(45, 3.0e5, 9, marks=pytest.mark.slow)]
)
def test_strips_keep_the_spacing_of_any_grid(ny, Ly, m):
    """A strip's grid keeps the parent's dy to the last bit even when no domain length
    divides back to it for the strip's row count (these grids used to fail there)."""
    g = Grid((ny, 20), (Ly, 2.0e5), periodic=True, dtype="float64")
    rng = np.random.default_rng(3)
    plain = ShallowWater(g, strip_rows=0, beta=1e-11)
    s = plain.initial_state(1000 + rng.standard_normal((ny, 20)), 0.3 * rng.random((ny, 20)))
    dt = 0.5 * plain.max_stable_dt(s)
    a = plain.run(s, dt=dt, n_steps=6, save_every=6).states
    for steps in (1, m // 3):
        b = dataclasses.replace(plain, strip_rows=m, strip_steps=steps)
        assert_strips_taken(plain, b, s, dt)
        b = b.run(s, dt=dt, n_steps=6, save_every=6).states
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            x, y = np.asarray(x), np.asarray(y)
            assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(x))


@pytest.mark.parametrize("ny, steps", [(3, 1), (6, 2)])
def test_one_strip_of_the_whole_walled_grid(ny, steps):
    """strip_rows = ny = 3 × strip_steps between walls: the strip's ghost rows mirror the
    whole grid, the last one the opposite wall's face (this used to fail while tracing)."""
    g = Grid((ny, 10), (ny * 1e4, 1e5), periodic=(False, True), dtype="float64")
    rng = np.random.default_rng(4)
    plain = ShallowWater(g, strip_rows=0, coriolis=1e-4, viscosity=10.0)
    shape = (ny, 10)
    s = plain.initial_state(1000 + rng.standard_normal(shape), 0.3 * rng.random(shape),
                            0.3 * rng.random(shape))  # fmt: skip
    dt = 0.5 * plain.max_stable_dt(s)
    a = plain.run(s, dt=dt, n_steps=2 * steps, save_every=2 * steps).states
    b = dataclasses.replace(plain, strip_rows=ny, strip_steps=steps)
    assert_strips_taken(plain, b, s, dt)
    b = b.run(s, dt=dt, n_steps=2 * steps, save_every=2 * steps).states
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(x))


def test_strips_float32_and_mass():
    plain, s, dt = _setup((False, True), dtype="float32", **FULL)
    one = dataclasses.replace(plain, strip_rows=12, strip_steps=1)
    blocked = dataclasses.replace(plain, strip_rows=12)  # three steps per visit
    assert_strips_taken(plain, blocked, s, dt)
    a = plain.advance(s, t0=0.0, dt=dt, n_steps=50)
    b = blocked.advance(s, t0=0.0, dt=dt, n_steps=50)
    assert b.h.dtype == jnp.float32
    assert_same_bits(a.h, one.advance(s, t0=0.0, dt=dt, n_steps=50).h)
    assert float(jnp.max(jnp.abs(a.h - b.h))) <= 1e-6 * float(jnp.max(a.h))
    assert abs(float(blocked.mass(b) / blocked.mass(s)) - 1) <= 2e-7


_LAST_BIT_SCRIPT = """
import dataclasses
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import os
import test_shallow_water_blocked as t

assert "fusion_emitters" not in os.environ.get("XLA_FLAGS", "")
assert "optimization_level" not in os.environ.get("XLA_FLAGS", "")

cases = [  # (periodic, strip rows, parameters, steps, dtype)
    (True, 16, t.FULL, 30, "float64"),  # doubly periodic, every term
    ((False, True), 12, dict(t.FULL, boundary="no-slip"), 30, "float64"),  # walls across
    (False, 8, t.FULL, 30, "float64"),  # closed basin
    ((False, True), 45, dict(t.FULL, boundary="no-slip"), 12, "float64"),  # a first strip of 3
    ((False, True), 12, t.FULL, 50, "float32"),
]
for periodic, m, kw, n, dtype in cases:
    plain, s, dt = t._setup(periodic, dtype=dtype, **kw)
    blocked = dataclasses.replace(plain, strip_rows=m, strip_steps=1)
    t.assert_strips_taken(plain, blocked, s, dt)
    a = plain.advance(s, t0=0.0, dt=dt, n_steps=n)
    b = blocked.advance(s, t0=0.0, dt=dt, n_steps=n)
    assert float(jax.numpy.max(jax.numpy.abs(a.h - s.h))) > 1e-3
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    if m == 12 and dtype == "float64":  # a compiled single step too
        one = jax.jit(lambda st: plain.step(st, dt))(s)
        other = jax.jit(lambda st: blocked.step(st, dt))(s)
        for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(other)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
print("last bit equal in", len(cases), "cases")
"""


def test_one_step_strips_equal_the_plain_step_to_the_last_bit_under_xla_defaults():
    """Strips advanced one step per visit give the plain step's result to the last bit in
    compiled runs (docs/shallow_water.md), checked as the package compiles: in a child
    process with XLA's default settings (the suite's fast-compiling flags removed), for
    periodic, channel, closed-basin and uneven strips and float32."""
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in FAST_FLAGS:
        flags = flags.replace(flag, "")
    env = dict(os.environ, XLA_FLAGS=" ".join(flags.split()), JAX_PLATFORMS="cpu")
    env["PHYSJAX_TEST_FAST_FLAGS"] = ""
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).parent), env.get("PYTHONPATH")) if p
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LAST_BIT_SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "last bit equal in 5 cases" in done.stdout


def test_strips_mass_conserved_barotropic_instability():
    case = make_case("barotropic-instability", nx=64, ny=32, precision="float64")
    m = dataclasses.replace(case.model, strip_rows=8)
    s = case.state
    plain = dataclasses.replace(case.model, strip_rows=0)
    assert_strips_taken(plain, m, s, m.max_stable_dt(s, 0.5))
    out = m.advance(s, t0=0.0, dt=m.max_stable_dt(s, 0.5), n_steps=500)
    assert abs(float((m.mass(out) - m.mass(s)) / m.mass(s))) <= 1e-12
    assert float(jnp.max(jnp.abs(out.v))) > 1e-3


@pytest.mark.slow  # reverse mode through the strip loop inside the step loop: 12 s to compile
def test_strips_grad_matches_finite_difference():
    plain, s, dt = _setup((False, True), beta=1e-11, drag=1e-6)

    def loss(r):
        m = ShallowWater(plain.grid, beta=plain.beta, drag=r, strip_rows=8)
        out = m.advance(s, t0=0.0, dt=dt, n_steps=4)
        return jnp.sum(out.u**2 + out.v**2)

    r0, eps = 1e-5, 1e-8
    g = float(jax.grad(loss)(r0))
    fd = (float(loss(r0 + eps)) - float(loss(r0 - eps))) / (2 * eps)
    assert g < 0  # drag removes kinetic energy
    assert abs(g - fd) / abs(fd) < 1e-6


@pytest.mark.slow  # reverse mode through strips of several steps, checkpointed: ~30 s
def test_strips_checkpointed_gradient_equals_plain_steps():
    """The gradient of a run with frames through strips of three steps (blocks of the
    checkpointed loop counted in visits) equals that through plain steps, with respect to
    the state, the bottom and the wind stress."""
    plain, s, dt = _setup((False, True), **FULL)
    blocked = dataclasses.replace(plain, strip_rows=8)
    assert_strips_taken(plain, blocked, s, dt)

    def loss(state, model):
        st = model.run(state, dt=dt, n_steps=30, save_every=10).states
        return jnp.sum((st.h - 1000.0) ** 2) + jnp.sum(st.u**2 + st.v**2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    ref, got = grad(s, plain), grad(s, blocked)
    pairs = [(ref[0], got[0]), (ref[1].bottom, got[1].bottom)]
    pairs += [(ref[1].wind_stress, got[1].wind_stress)]
    for a, b in pairs:
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            assert float(jnp.max(jnp.abs(x - y))) <= 1e-12 * float(jnp.max(jnp.abs(x)))


def test_strips_vmap_equals_loop():
    plain, s, dt = _setup((False, True), beta=1e-11, drag=1e-6)
    blocked = dataclasses.replace(plain, strip_rows=8)
    assert_strips_taken(plain, blocked, s, dt)
    amps = jnp.array([0.5, 1.0, 2.0])
    states = jax.vmap(lambda a: jax.tree.map(lambda f: f * a, s))(amps)
    batched = jax.vmap(lambda st: blocked.advance(st, t0=0.0, dt=dt, n_steps=3))(states)
    for i in range(3):
        one = plain.advance(jax.tree.map(lambda f, i=i: f[i], states), t0=0.0, dt=dt, n_steps=3)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(batched)):  # h, u and v
            assert float(jnp.max(jnp.abs(a - b[i]))) <= 1e-12


@pytest.mark.multidevice
def test_strips_sharded_run_equals_one_device():
    plain, s, dt = _setup((False, True), **FULL)
    blocked = dataclasses.replace(plain, strip_rows=8)
    assert_strips_taken(plain, blocked, s, dt)  # on one device
    ref = blocked.run(s, dt=dt, n_steps=20)
    out = blocked.run(s, dt=dt, n_steps=20, mesh=make_mesh((2, 2)))
    for a, b in zip(jax.tree.leaves(ref.states), jax.tree.leaves(out.states)):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-12
    # run on the mesh, not on one device (each block of 24 rows is stepped unblocked there:
    # strips are a one-device optimisation, as the strip_rows docstring says)
    h = out.states.h
    assert h.sharding.shard_shape(h.shape) == (1, NY // 2, NX // 2)
    assert len(h.sharding.device_set) == 4
    assert float(jnp.max(jnp.abs(ref.states.h[-1] - s.h))) > 1e-3  # and the run moved


def test_periodic_beta_plane_conserves_energy_at_scheme_order():
    # On a y-periodic beta-plane corner row ny is corner row 0: one potential vorticity per
    # corner, so the inviscid energy drift falls with dt at the time scheme's order (with f
    # taken at the unwrapped y of row ny the drift stalled near 5e-8, order ~1.4).
    g = Grid((32, 32), (2e6, 2e6), periodic=True, dtype="float64")
    y, x = g.mesh_coordinates(CENTRE)
    h = 500 + 20 * np.exp(-((x - 1e6) ** 2 + (y - 1.5e6) ** 2) / 2e5**2)
    model = ShallowWater(g, coriolis=1e-4, beta=5e-11)
    s = model.initial_state(h)
    e0 = float(model.energy(s))
    t_end = 12 * 3600.0
    dts, drifts = [], []
    for n in (80, 160, 320, 640):
        out = model.advance(s, t0=0.0, dt=t_end / n, n_steps=n)
        drifts.append(abs(float(model.energy(out)) - e0) / e0)
        dts.append(t_end / n)
    order = np.polyfit(np.log(dts), np.log(drifts), 1)[0]
    assert abs(order - 3.0) <= 0.3, (order, drifts)
    assert drifts[-1] < 1e-8


def test_automatic_strip_rows():
    def grid(n, dtype):
        return Grid((n, n), (1.0, 1.0), dtype=dtype)

    def auto(g, cache, min_rows=8):
        return auto_strip_rows(g, cache_bytes=cache, min_rows=min_rows)

    for cache in (None, 32 * 2**20):  # cache size unknown, or a 32 MiB L3
        assert auto(grid(512, "float64"), cache) == 0  # 2 MiB fields: plain step
        assert auto(grid(1024, "float32"), cache) == 256  # 4 MiB: 1 MiB per strip field
        assert auto(grid(768, "float64"), cache) == 128
        assert auto(grid(1024, "float64"), cache) == 128
        assert auto(grid(2048, "float64"), cache) == 64
        assert auto(grid(2048, "float32"), cache) == 128
        # a prime ny: 128 rows, the first strip taking the 7 left over
        assert auto(Grid((1031, 1024), (1.0, 1.0), dtype="float64"), cache) == 128
        m = auto(Grid((1536, 1024), (1.0, 1.0), dtype="float64"), cache)
        assert m and 1536 % m == 0 and m <= 128
    # where blocking starts (docs/shallow_water.md): 13 fields over the cache, or 4 MiB fields
    for n, dtype, cache in [
        (569, "float64", 32 * 2**20),
        (804, "float32", 32 * 2**20),
        (1740, "float64", 300 * 2**20),
        (2460, "float32", 300 * 2**20),
        (725, "float64", None),
        (1024, "float32", None),
    ]:
        # the first size that blocks, to the cell (the page said 576² and 808² for 32 MiB,
        # 1744² and 2464² for 300 MiB: the multiples of 8 above them)
        assert auto(grid(n - 1, dtype), cache) == 0 and auto(grid(n, dtype), cache) > 0
    # 300 MiB of L3: the plain step's 13 fields fit up to 1024² float64 and 2048² float32
    big = 300 * 2**20
    assert auto(grid(1024, "float64"), big) == 0
    assert auto(grid(2048, "float32"), big) == 0
    assert auto(grid(2048, "float64"), big) == 64
    # a 1 MiB cache: 256² float64 (0.5 MiB fields) already blocks, in two strips
    assert auto(grid(256, "float64"), 2**20) == 128
    # strips must hold the overlap of the steps per visit: 3 per step
    assert auto(Grid((18, 4096), (1.0, 1.0), dtype="float64"), 2**20, min_rows=9) == 9
    assert auto(Grid((16, 4096), (1.0, 1.0), dtype="float64"), 2**20, min_rows=9) == 0
    model = ShallowWater(grid(1024, "float64"))
    assert model.strip_rows is None and model.strip_steps is None


def test_narrow_grids_are_not_blocked_automatically(monkeypatch):
    """A tall grid of short rows outgrows the cache like a square one, but XLA:CPU ran its
    strips several times slower than the plain step (16384×64 float32: 203 against 34 ns
    per cell-update, 8192×64 float64: 270 against 111): below 128 columns the automatic
    choice keeps the plain step; 128 columns still block (there 22 against 33)."""
    from physjax.solvers.shallow_water import _blocked
    from physjax.solvers.shallow_water._model import _strip_plan

    for cache in (None, 32 * 2**20):
        for shape, dtype in [((16384, 64), "float32"), ((16384, 112), "float32")]:
            assert auto_strip_rows(Grid(shape, (1.0, 1.0), dtype=dtype), cache_bytes=cache) == 0
        g = Grid((8192, 64), (1.0, 1.0), dtype="float64")
        assert auto_strip_rows(g, cache_bytes=cache) == 0
        assert auto_strip_rows(Grid((16384, 128), (1.0, 1.0)), cache_bytes=cache) == 2048
    monkeypatch.setattr(_blocked, "last_level_cache_bytes", lambda: 32 * 2**20)
    assert _strip_plan(ShallowWater(Grid((16384, 64), (1.0, 1.0)))) == (0, 1)
    assert _strip_plan(ShallowWater(Grid((16384, 128), (1.0, 1.0)))) == (2048, 3)
    # a forced choice is the user's
    assert _strip_plan(ShallowWater(Grid((16384, 64), (1.0, 1.0)), strip_rows=4096)) == (4096, 3)


def test_last_level_cache_from_sysfs(tmp_path, monkeypatch):
    """The largest data/unified cache of the highest level is the one read."""
    from physjax.solvers.shallow_water import _blocked

    caches = [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K")]
    caches.append((3, "Unified", "307200K"))
    for i, (level, kind, size) in enumerate(caches):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    monkeypatch.setattr(_blocked, "CACHE_SYSFS", str(tmp_path))
    _blocked.last_level_cache_bytes.cache_clear()
    try:
        assert _blocked.last_level_cache_bytes() == 300 * 2**20
        (tmp_path / "index3" / "size").write_text("garbage\n")
        _blocked.last_level_cache_bytes.cache_clear()
        assert _blocked.last_level_cache_bytes() == 2 * 2**20  # unreadable entry skipped
        monkeypatch.setattr(_blocked, "CACHE_SYSFS", str(tmp_path / "missing"))
        _blocked.last_level_cache_bytes.cache_clear()
        assert _blocked.last_level_cache_bytes() is None
        # unknown cache: from 4 MiB fields up
        assert _blocked.auto_strip_rows(Grid((1024, 1024), (1.0, 1.0), dtype="float64")) == 128
    finally:
        _blocked.last_level_cache_bytes.cache_clear()


@pytest.mark.parametrize(
    "strip_rows, scheme, match",
    [
        (-1, "ssprk3", "from 3 .* to ny=48, got -1"),
        (49, "ssprk3", "from 3 .* to ny=48, got 49"),
        (2, "ssprk3", "from 3 .* to ny=48, got 2"),
        (True, "ssprk3", "strip_rows must be None, 0 or a positive integer"),
        (2.5, "ssprk3", "strip_rows must be None, 0 or a positive integer"),
        (8, "rk4", "strip_rows needs scheme='ssprk3'"),
    ],
)
def test_bad_strip_rows(strip_rows, scheme, match):
    g = Grid((NY, NX), (1.0, 1.0))
    with pytest.raises(ValueError, match=match):
        ShallowWater(g, strip_rows=strip_rows, scheme=scheme)


@pytest.mark.parametrize(
    "strip_rows, strip_steps, scheme, match",
    [
        (12, 0, "ssprk3", "strip_steps must be None or an integer >= 1, got 0"),
        (12, True, "ssprk3", "strip_steps must be None or an integer >= 1, got True"),
        (12, 1.5, "ssprk3", "strip_steps must be None or an integer >= 1, got 1.5"),
        (None, 2, "rk4", "strip_steps needs scheme='ssprk3'"),
        (0, 2, "ssprk3", "strip_steps=2 needs strips, got strip_rows=0"),
        (8, 3, "ssprk3", r"strip_rows=8 is too few for strip_steps=3: .* \(9\)"),
    ],
)
def test_bad_strip_steps(strip_rows, strip_steps, scheme, match):
    g = Grid((NY, NX), (1.0, 1.0))
    with pytest.raises(ValueError, match=match):
        ShallowWater(g, strip_rows=strip_rows, strip_steps=strip_steps, scheme=scheme)


def test_automatic_strips_choose_rows_that_hold_the_steps(monkeypatch):
    """With the cache read as 1 MiB, narrow grids of 4096 float64 columns block: the rows
    chosen hold the overlap of the steps per visit (3 per step), and fewer steps allow
    fewer rows."""
    from physjax.solvers.shallow_water import _blocked
    from physjax.solvers.shallow_water._model import _strip_plan

    monkeypatch.setattr(_blocked, "last_level_cache_bytes", lambda: 2**20)
    g = Grid((NY, 4096), (1.0, 1.0))
    assert _strip_plan(ShallowWater(g)) == (24, 3)  # divisors of 48 in 9 .. 24: the largest
    assert _strip_plan(ShallowWater(g, strip_steps=4)) == (24, 4)
    g = Grid((20, 4096), (1.0, 1.0))
    assert _strip_plan(ShallowWater(g)) == (10, 3)
    assert _strip_plan(ShallowWater(Grid((16, 4096), (1.0, 1.0)))) == (0, 1)  # 8 < 9
    assert _strip_plan(ShallowWater(Grid((16, 4096), (1.0, 1.0)), strip_steps=2)) == (8, 2)
    # no divisor from half the target up: the target, the first strip taking the rest
    assert _strip_plan(ShallowWater(Grid((38, 4096), (1.0, 1.0)))) == (19, 3)
    assert _strip_plan(ShallowWater(Grid((37, 4096), (1.0, 1.0)))) == (18, 3)
    assert _strip_plan(ShallowWater(Grid((2056, 4096), (1.0, 1.0)))) == (64, 3)
    assert _strip_plan(ShallowWater(Grid((2063, 4096), (1.0, 1.0)))) == (64, 3)


@pytest.mark.parametrize("n_steps", [1, 2, 3, 7, 9])
def test_advance_in_blocks_uses_each_steps_time(n_steps):
    """``advance(..., block=(S, step_S))`` gives ``step_S`` the times of its S steps and
    takes the rest one at a time: forward Euler for y' = cos t, where every step's time
    matters, equals the plain loop; ``integrate`` passes the block on to every frame."""
    from physjax.solvers import advance, integrate

    def step(y, t, dt):
        return y + dt * jnp.cos(t)

    calls = []

    def step_3(y, ts, dt):
        calls.append(len(ts))
        for t in ts:
            y = step(y, t, dt)
        return y

    y0, t0, dt = jnp.float64(0.5), 0.25, 0.1
    ref = y0
    for k in range(n_steps):
        ref = ref + dt * np.cos(t0 + k * dt)
    out = advance(step, y0, t0, dt, n_steps, block=(3, step_3))
    assert abs(float(out) - ref) <= 1e-15
    assert calls == ([3] if n_steps >= 3 else [])  # traced once inside the scan
    frames = integrate(step, y0, t0, dt, 3, n_steps, block=(3, step_3))
    plain = integrate(step, y0, t0, dt, 3, n_steps)
    np.testing.assert_allclose(np.asarray(frames), np.asarray(plain), rtol=0, atol=1e-15)
    assert abs(float(frames[0]) - ref) <= 1e-15


def test_automatic_strips_take_no_divisor_below_half_the_target():
    """The automatic strip height takes a divisor of ny only from half its target up."""
    from physjax.solvers.shallow_water._blocked import auto_strip_rows

    # 1 MiB per strip field of 4096 float64 columns: a target of 32 rows; 407 = 11 x 37 has
    # no divisor from 16 to 32, and 11 below
    g = Grid((407, 4096), (1.0, 1.0), dtype="float64")
    assert auto_strip_rows(g, cache_bytes=2**20, min_rows=9) == 32
    g = Grid((416, 4096), (1.0, 1.0), dtype="float64")  # 416 = 13 x 32: the target divides
    assert auto_strip_rows(g, cache_bytes=2**20, min_rows=9) == 32


def test_walled_strips_whose_first_strip_is_under_the_overlap_equal_plain_steps():
    """Strips between walls whose first strip is under the overlap equal plain steps."""
    # 20 rows in strips of 9, 3 steps per visit (9 rows of overlap): 20 % 9 = 2 < 9, so the
    # first strip takes 11 rows. (With one step per visit the mutant happens to be exact.)
    ny, m, steps = 20, 9, 3
    nx = 8
    g = Grid((ny, nx), (ny * 1e4, nx * 1e4), periodic=(False, True), dtype="float64")
    rng = np.random.default_rng(5)
    plain = ShallowWater(g, strip_rows=0, coriolis=1e-4, viscosity=10.0, boundary="no-slip")
    s = plain.initial_state(
        1000 + rng.standard_normal(g.shape),
        0.3 * rng.standard_normal(g.shape),
        0.3 * rng.standard_normal(g.shape),
    )
    dt = 0.5 * plain.max_stable_dt(s)
    assert ny % m < 3 * steps  # the case: a first strip of ny % m + m rows
    a = plain.run(s, dt=dt, n_steps=2 * steps, save_every=2 * steps).states
    b = dataclasses.replace(plain, strip_rows=m, strip_steps=steps)
    b = b.run(s, dt=dt, n_steps=2 * steps, save_every=2 * steps).states
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert np.max(np.abs(x - y)) <= 1e-12 * np.max(np.abs(x))
