"""The accelerator form of the shallow-water tendency (every intermediate recomputed at each
point, so that XLA:GPU fuses a stage into few kernels) computes the same thing as the CPU
form (each intermediate computed once): term by term, over whole runs, and on a mesh."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from physjax.grids import CENTRE, Grid
from physjax.parallel import make_mesh
from physjax.solvers import ShallowWater
from physjax.solvers.shallow_water import _model

NY, NX = 24, 20


def _setup(periodic, boundary="free-slip", full=False, dtype="float64"):
    g = Grid((NY, NX), (4.8e5, 4.0e5), periodic=periodic, dtype=dtype)
    rng = np.random.default_rng(3)
    y, x = g.mesh_coordinates(CENTRE)
    h = 1000 + 10 * np.exp(-((x - 2e5) ** 2 + (y - 2.4e5) ** 2) / 5e4**2)
    h = h + rng.standard_normal((NY, NX))
    kw = {}
    if full:
        kw = dict(
            beta=1e-11,
            viscosity=100.0,
            drag=1e-6,
            bottom=5 * rng.standard_normal((NY, NX)),
            wind_stress=tuple(0.1 * rng.standard_normal((NY, NX)) for _ in range(2)),
        )
    model = ShallowWater(g, coriolis=1e-4, boundary=boundary, strip_rows=0, **kw)
    state = model.initial_state(
        h, 0.3 * rng.standard_normal((NY, NX)), 0.3 * rng.standard_normal((NY, NX))
    )
    return model, state, 0.5 * model.max_stable_dt(state)


SETUPS = [
    (True, "free-slip", False),
    (True, "free-slip", True),
    ((False, True), "free-slip", True),
    ((True, False), "no-slip", True),
    (False, "free-slip", True),
    (False, "no-slip", False),
]


def _advance(model, state, dt, n_steps, mesh=None, pointwise=True):
    """``model.advance`` traced afresh (the form is chosen when a step is traced, and
    ``model.advance`` would reuse a program traced with the other form)."""
    old = _model._pointwise_core
    _model._pointwise_core = lambda: pointwise
    try:
        fn = _model._advance.__wrapped__
        return jax.jit(lambda s: fn(model, s, 0.0, dt, n_steps, mesh))(state)
    finally:
        _model._pointwise_core = old


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-300))


def test_the_cpu_uses_the_shared_form():
    assert jax.default_backend() == "cpu"
    assert _model._pointwise_core() is False


@pytest.mark.parametrize("periodic, boundary, full", SETUPS)
def test_pointwise_core_equals_shared_core(periodic, boundary, full):
    model, state, _ = _setup(periodic, boundary, full)

    @jax.jit
    def cores(state):
        padded = model._pad(state)
        f = model._coriolis_at_corner_rows(model.grid.local_index(0, padded=True)[1:])
        bottom = model._padded_bottom()
        return model._core_shared(padded, bottom, f), model._core_pointwise(padded, bottom, f)

    shared, point = cores(state)
    for name, a, b in zip("h u v".split(), shared, point):
        # float64 round-off: the two forms differ only in how XLA fuses the same arithmetic
        assert _rel(a, b) < 1e-13, name
        assert float(jnp.max(jnp.abs(a))) > 0, name


@pytest.mark.parametrize("periodic, boundary, full", SETUPS[1::2])
def test_runs_with_the_pointwise_form_equal_the_default(periodic, boundary, full):
    model, state, dt = _setup(periodic, boundary, full)
    ref = model.advance(state, t0=0.0, dt=dt, n_steps=30)
    out = _advance(model, state, dt, 30)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
        assert _rel(a, b) < 1e-12
    # the run moved: the comparison is not between two copies of the initial state
    assert _rel(ref.h, state.h) > 1e-6


def test_strips_with_the_pointwise_form_equal_the_plain_step():
    # strips (the CPU's temporal blocking), which a user may ask for on a GPU: each strip's
    # tendency reads its own rows of the Coriolis parameter, between walls along y
    model, state, dt = _setup((False, True), full=True)
    ref = model.advance(state, t0=0.0, dt=dt, n_steps=12)
    strips = dataclasses.replace(model, strip_rows=12, strip_steps=3)
    out = _advance(strips, state, dt, 12)
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
        assert _rel(a, b) < 1e-12


@pytest.mark.multidevice
def test_pointwise_form_on_a_mesh_equals_one_device():
    assert len(jax.devices()) >= 4
    model, state, dt = _setup((True, False), "no-slip", True)
    ref = model.advance(state, t0=0.0, dt=dt, n_steps=20)
    out = _advance(model, state, dt, 20, mesh=make_mesh((2, 2)))
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(out)):
        assert _rel(a, b) < 1e-12
    assert len(out.h.sharding.device_set) == 4


def test_float32_pointwise_form_stays_within_float32_round_off():
    model, state, dt = _setup(True, full=True, dtype="float32")
    ref = model.advance(state, t0=0.0, dt=dt, n_steps=20)
    out = _advance(model, state, dt, 20)
    assert out.h.dtype == jnp.float32
    # anomalies of ~10 m on a 1000 m layer: a few float32 ulps of h, not a different answer
    assert float(jnp.max(jnp.abs(out.h - ref.h))) < 1e-3
    assert float(jnp.max(jnp.abs(out.u - ref.u))) < 1e-4
    assert float(jnp.max(jnp.abs(out.h - state.h))) > 1e-2
