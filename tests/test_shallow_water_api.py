"""Shallow-water library API: input checks, transformations (jit/grad/vmap), diffrax paths."""

import math
import os
import re
import subprocess
import sys
import textwrap
import warnings

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from physjax.grids import CENTRE, Grid
from physjax.parallel import make_mesh, shard
from physjax.solvers import ShallowWater, ShallowWaterState
from physjax.solvers.shallow_water import CASES, make_case

NAN, INF = float("nan"), float("inf")


def _last(sol):
    return jax.tree.map(lambda a: a[-1], sol.states)


def _max_diff(a, b):
    return max(
        float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


@pytest.fixture(scope="module")
def gyre():
    c = make_case("wind-gyre", nx=16, ny=16, precision="float64")
    return c.model, c.state, c.model.max_stable_dt(c.state, 0.5)


@pytest.fixture(scope="module")
def adjust():
    c = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64")
    return c.model, c.state, c.model.max_stable_dt(c.state, 0.5)


# ------------------------------------------------------------------ 1. flow through walls
def test_state_with_flow_through_a_wall_is_refused_and_left_alone(gyre):
    m, s, dt = gyre
    leaky_u = ShallowWaterState(h=s.h, u=s.u.at[:, 0].set(0.05), v=s.v)
    leaky_v = ShallowWaterState(h=s.h, u=s.u, v=s.v.at[0, :].set(-0.02))
    with pytest.raises(ValueError, match=r"state\.u must be 0 on the west wall .* = 0\.05 m/s"):
        m.run(leaky_u, dt=dt, n_steps=2)
    with pytest.raises(ValueError, match=r"state\.v must be 0 on the south wall .* = 0\.02 m/s"):
        m.advance(leaky_v, t0=0.0, dt=dt, n_steps=2)
    assert float(leaky_u.u[3, 0]) == 0.05  # the user's data is not modified
    # a periodic axis has no wall: the same u[:, 0] is fine there
    jet = make_case("zonal-jet", nx=16, ny=8, precision="float64")
    assert float(jnp.min(jet.state.u[:, 0])) > 0
    out = jet.model.run(jet.state, dt=jet.model.max_stable_dt(jet.state, 0.5), n_steps=2)
    assert out.states.u.shape == (1, 8, 16)


# ----------------------------------------------------------------------- 2. NaN and Inf
@pytest.mark.parametrize("name", ["gravity", "coriolis", "beta", "drag", "viscosity", "density"])
@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_non_finite_model_parameters_are_refused(name, value):
    g = Grid((8, 12), (1e6, 1e6), periodic=(False, True), dtype="float64")
    with pytest.raises(ValueError, match=f"^{name} must be a finite number, got {value}$"):
        ShallowWater(g, **{name: value})


def test_a_grid_with_a_wider_halo_is_refused():
    # the tendency is written for a one-cell halo; halo=2 used to fail inside rhs/run with a
    # broadcasting error
    g = Grid((8, 8), (8e5, 8e5), dtype="float64", halo=2)
    with pytest.raises(ValueError, match=r"must have halo=1, got halo=2"):
        ShallowWater(g)


def test_no_slip_without_walls_is_refused():
    """It was accepted and did nothing: a doubly periodic grid has no wall to hold."""
    periodic = Grid((8, 8), (8e5, 8e5), dtype="float64")
    with pytest.raises(ValueError, match=r"boundary='no-slip' sets the condition at walls"):
        ShallowWater(periodic, boundary="no-slip", viscosity=10.0)
    channel = Grid((8, 8), (8e5, 8e5), periodic=(False, True), dtype="float64")
    assert ShallowWater(channel, boundary="no-slip").boundary == "no-slip"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_takes_drag_and_viscosity(name):
    """Damping on any case (it was refused where the case had no such default, and a case's
    model held None there, out of reach of grad and vmap); 0 leaves the term out."""
    plain = make_case(name, nx=16, ny=16, precision="float64", drag=0.0, viscosity=0.0)
    assert plain.model.drag is None and plain.model.viscosity is None
    damped = make_case(name, nx=16, ny=16, precision="float64", drag=2e-5, viscosity=3e3)
    assert float(damped.model.drag) == 2e-5 and float(damped.model.viscosity) == 3e3
    assert damped.parameters["drag"] == 2e-5 and damped.parameters["viscosity"] == 3e3
    with pytest.raises(ValueError, match=r"parameter drag must be a finite number >= 0"):
        make_case(name, nx=16, ny=16, drag=-1e-6)


def test_drag_on_a_case_takes_energy_out():
    """Linear drag r on the balanced jet: total energy falls at the rate 2r KE (dE/dt =
    -r ∫h|u|²), so KE (all the energy that changes) as exp(-2rt), while the undamped jet
    keeps it to round-off. Measured 8.5e-4 from the exponential; the linear rate alone
    was 2.8e-3 off (KE falls by 0.7% over the run), and its 2% let a drag 1.5% off pass."""
    r = 1e-7
    steady = make_case("zonal-jet", nx=32, ny=16, precision="float64")
    damped = make_case("zonal-jet", nx=32, ny=16, precision="float64", drag=r)
    s0 = steady.state
    at_rest = ShallowWaterState(h=s0.h, u=0 * s0.u, v=0 * s0.v)
    kinetic = float(steady.model.energy(s0) - steady.model.energy(at_rest))
    dt = float(steady.model.max_stable_dt(s0, cfl=0.5))
    change = {}
    for key, case in (("steady", steady), ("damped", damped)):
        final = jax.tree.map(lambda a: a[-1], case.model.run(s0, dt=dt, n_steps=100).states)
        change[key] = float(case.model.energy(final) - case.model.energy(s0))
    expected = kinetic * np.expm1(-2 * r * 100 * dt)
    assert abs(change["damped"] / expected - 1) <= 3e-3, (change, expected)
    assert abs(change["steady"]) <= 1e-6 * abs(expected)


def test_non_finite_fields_are_refused():
    g = Grid((8, 12), (1e6, 1e6), periodic=(False, True), dtype="float64")
    one_nan = np.zeros(g.shape)
    one_nan[2, 3] = np.nan
    with pytest.raises(ValueError, match=r"^bottom must be finite everywhere, got 1 NaN/Inf"):
        ShallowWater(g, bottom=one_nan)
    with pytest.raises(ValueError, match=r"^wind_stress\[1\] \(tau_y\) must be finite every"):
        ShallowWater(g, wind_stress=(np.zeros(g.shape), np.full(g.shape, np.inf)))
    m = ShallowWater(g)
    h = np.full(g.shape, 100.0)
    for name, args in (
        ("h", (h + one_nan,)),
        ("h", (np.full(g.shape, np.inf),)),
        ("u", (h, one_nan)),
        ("v", (h, None, one_nan)),
    ):
        with pytest.raises(ValueError, match=f"^{name} must be finite everywhere"):
            m.initial_state(*args)


@pytest.mark.parametrize(
    "name, params",
    [
        ("geostrophic-adjustment", {"step_height": NAN}),
        ("geostrophic-adjustment", {"coriolis": NAN}),
        ("zonal-jet", {"jet_speed": INF}),
        ("barotropic-instability", {"beta": NAN}),
        ("barotropic-instability", {"perturbation": NAN}),
        ("wind-gyre", {"wind_stress": NAN}),
        ("wind-gyre", {"viscosity": INF}),
        ("gravity-wave", {"amplitude": NAN}),
        ("gravity-wave", {"mean_depth": INF}),
    ],
)
def test_non_finite_case_parameters_are_refused(name, params):
    ((key, value),) = params.items()
    with pytest.raises(ValueError, match=f"^parameter {key} must be a finite number, got {value}"):
        make_case(name, nx=8, ny=8, precision="float64", **params)


def test_non_finite_state_and_times_are_refused(adjust):
    m, s, dt = adjust
    bad = ShallowWaterState(h=s.h.at[4, 5].set(jnp.nan), u=s.u, v=s.v)
    with pytest.raises(ValueError, match=r"^state\.h must be finite everywhere, got 1 NaN/Inf"):
        m.run(bad, dt=dt, n_steps=2)
    with pytest.raises(ValueError, match=r"^state\.h must be finite everywhere"):
        m.max_stable_dt(bad)
    bad_u = ShallowWaterState(h=s.h, u=s.u.at[0, 0].set(jnp.inf), v=s.v)
    with pytest.raises(ValueError, match=r"^state\.u must be finite everywhere, got 1 NaN/Inf"):
        m.advance(bad_u, t0=0.0, dt=dt, n_steps=2)
    with pytest.raises(ValueError, match=r"^t0 must be a finite number \(seconds\), got nan"):
        m.run(s, dt=dt, n_steps=2, t0=NAN)
    with pytest.raises(ValueError, match=r"^t1 must be a finite number \(seconds\), got nan"):
        m.solve_diffrax(s, 0.0, NAN)
    with pytest.raises(ValueError, match=r"^t0 must be a finite number \(seconds\), got inf"):
        m.solve_diffrax(s, INF, 100.0)
    # dt0 = 0 used to run max_steps steps of zero length, then blame max_steps
    for dt0, span in ((0.0, 100.0), (-10.0, 100.0), (10.0, -100.0)):
        with pytest.raises(
            ValueError,
            match=rf"^dt0 must be a nonzero number of seconds with the sign of t1 - t0 = {span}",
        ):
            m.solve_diffrax(s, 0.0, span, dt0=dt0)


def test_fields_are_checked_in_the_model_dtype():
    """A finite float64 field that overflows (or a depth that underflows) in a float32
    model is refused naming it; it used to become inf (a NaN run) or h = 0."""
    g = Grid((8, 8), (1e6, 1e6), dtype="float32")
    big = np.full((8, 8), 1e40)
    with pytest.raises(
        ValueError,
        match=r"^bottom must be finite everywhere in the grid's dtype float32, got 64 value",
    ):
        ShallowWater(g, bottom=big)
    with pytest.raises(
        ValueError,
        match=r"^wind_stress\[1\] \(tau_y\) must be finite everywhere in the grid's dtype float32",
    ):
        ShallowWater(g, wind_stress=(np.zeros((8, 8)), big))
    m = ShallowWater(g)
    with pytest.raises(ValueError, match=r"^u must be finite everywhere in the grid's dtype"):
        m.initial_state(np.full((8, 8), 1000.0), big)
    with pytest.raises(
        ValueError, match=r"h must be > 0 everywhere .* got a minimum of 0 m in float32"
    ):
        m.initial_state(np.full((8, 8), 1e-60))
    # the same values are fine where the dtype holds them
    g64 = Grid((8, 8), (1e6, 1e6), dtype="float64")
    assert float(ShallowWater(g64).initial_state(np.full((8, 8), 1e-60)).h.min()) == 1e-60


# --------------------------------------------------------------------------- 3. drag in dt
@pytest.mark.parametrize("scheme, damping", [("ssprk3", 1.64), ("rk4", 0.68)])
def test_max_stable_dt_counts_linear_drag(adjust, scheme, damping):
    _, s, _ = adjust
    g = adjust[0].grid
    r = 1e-2
    m = ShallowWater(g, drag=r, scheme=scheme)
    dt = m.max_stable_dt(s, cfl=0.9)
    assert dt == pytest.approx(0.9 * damping / r, rel=1e-15)  # the drag limit binds
    without = ShallowWater(g, scheme=scheme).max_stable_dt(s, cfl=0.9)
    assert without * r > 2.8  # the old dt: beyond even the real-axis limit of both schemes
    out = m.run(s, dt=dt, n_steps=200).states
    assert bool(jnp.all(jnp.isfinite(out.u)))
    assert float(jnp.max(jnp.abs(out.u))) < 0.1  # the adjustment's flow, damped
    blown = m.advance(s, t0=0.0, dt=without, n_steps=200)  # advance checks no CFL by default
    assert not bool(jnp.all(jnp.isfinite(blown.u)))
    with pytest.raises(ValueError, match="breaks the CFL stability limit"):
        m.run(s, dt=without, n_steps=2)


def test_weak_drag_leaves_dt_unchanged_and_viscosity_counts(gyre, adjust):
    m, s, _ = gyre  # drag 5e-7, viscosity 2500: dt as without the drag, to the last bit
    no_drag = ShallowWater(
        m.grid,
        gravity=m.gravity,
        coriolis=m.coriolis,
        beta=m.beta,
        viscosity=m.viscosity,
        wind_stress=m.wind_stress,
    )
    assert m.max_stable_dt(s, 0.5) == no_drag.max_stable_dt(s, 0.5)
    g = adjust[0].grid
    nu = 1e7  # the damping limit binds: dt = 1.64 / (r + 4ν(1/dx² + 1/dy²))
    k2 = 1 / g.dx**2 + 1 / g.dy**2
    viscous = ShallowWater(g, viscosity=nu).max_stable_dt(adjust[1])
    assert viscous == pytest.approx(1.64 / (4 * nu * k2), rel=1e-15)
    # one rule for drag and viscosity: no jump as the drag goes to zero
    tiny = ShallowWater(g, viscosity=nu, drag=1e-12).max_stable_dt(adjust[1])
    assert tiny == pytest.approx(1.64 / (1e-12 + 4 * nu * k2), rel=1e-15)
    assert viscous / tiny - 1 <= 1e-6


# ------------------------------------------------------------ 4. transformations over parameters
def test_grad_wrt_gravity_and_viscosity_match_finite_differences(adjust):
    m, s, dt = adjust

    def loss(gravity, viscosity):
        model = ShallowWater(m.grid, gravity=gravity, coriolis=m.coriolis, viscosity=viscosity)
        out = _last(model.run(s, dt=dt, n_steps=10))
        return jnp.sum(out.u**2 + out.v**2)

    x0 = (9.81, 1e4)
    grads = jax.grad(loss, argnums=(0, 1))(*x0)
    for i, name in enumerate(("gravity", "viscosity")):
        eps = 1e-5 * x0[i]
        up = [x + eps * (j == i) for j, x in enumerate(x0)]
        down = [x - eps * (j == i) for j, x in enumerate(x0)]
        fd = (float(loss(*up)) - float(loss(*down))) / (2 * eps)
        assert float(grads[i]) != 0
        assert abs(float(grads[i]) - fd) <= 1e-6 * abs(fd), name


def test_vmap_and_jit_over_coriolis_and_beta(adjust):
    m, s, dt = adjust

    def final_v(f, beta=0.0):
        return _last(ShallowWater(m.grid, coriolis=f, beta=beta).run(s, dt=dt, n_steps=6)).v

    fs = jnp.array([5e-5, 1e-4, 2e-4])
    batched = jax.vmap(final_v)(fs)
    loop = jnp.stack([final_v(float(f)) for f in fs])
    assert _max_diff(batched, loop) <= 1e-15
    assert _max_diff(jax.jit(final_v)(1e-4, 1e-11), final_v(1e-4, 1e-11)) <= 1e-15
    # max_stable_dt of traced parameters is a traced value, not an error
    traced = jax.jit(lambda f: ShallowWater(m.grid, coriolis=f).max_stable_dt(s, 0.5))(1e-4)
    assert float(traced) == pytest.approx(ShallowWater(m.grid).max_stable_dt(s, 0.5), rel=1e-12)


# ------------------------------------------------------------ 5. jit over closed-over values
def test_jit_with_closed_over_concrete_state_and_arrays(adjust):
    m, s, dt = adjust
    ref = m.run(s, dt=dt, n_steps=4).states.h.sum()
    assert float(jax.jit(lambda: m.run(s, dt=dt, n_steps=4).states.h.sum())()) == float(ref)
    arr = jnp.asarray(s.h)
    assert _max_diff(jax.jit(lambda: m.initial_state(arr))(), m.initial_state(arr)) == 0
    # the checks still run on closed-over values inside the trace
    with pytest.raises(ValueError, match=r"state\.h \(layer thickness\) must be > 0 everywhere"):
        bad = ShallowWaterState(h=-s.h, u=s.u, v=s.v)
        jax.jit(lambda: m.run(bad, dt=dt, n_steps=4).states.h.sum())()
    negative = -arr
    with pytest.raises(ValueError, match="layer thickness h must be > 0 everywhere"):
        jax.jit(lambda: m.initial_state(negative))()


# ------------------------------------------- step and rhs called eagerly are compiled once
def test_eager_step_and_rhs_trace_once_and_agree_with_run(adjust, monkeypatch):
    """model.step and model.rhs called in a Python loop ran op by op, tracing the scheme at
    every call (50 ms a step at 64² against 0.1 ms compiled); they are compiled once per
    model structure and shapes now, and still give run's numbers and work under jit/grad."""
    import physjax.solvers.shallow_water._model as sw

    m, s, dt = adjust
    m = ShallowWater(m.grid, gravity=9.5, coriolis=1.1e-4)  # a model no other test compiled
    traced = {"step": 0, "rhs": 0}
    stepper, rhs = sw._stepper, ShallowWater._rhs

    def counting_stepper(model):
        traced["step"] += 1
        return stepper(model)

    def counting_rhs(self, state, t):
        traced["rhs"] += 1
        return rhs(self, state, t)

    monkeypatch.setattr(sw, "_stepper", counting_stepper)
    monkeypatch.setattr(ShallowWater, "_rhs", counting_rhs)
    y = s
    for k in range(3):
        y = m.step(y, dt, t=k * dt)
        m.rhs(y, t=k * dt)
    assert traced == {"step": 1, "rhs": 1}, traced
    assert _max_diff(y, _last(m.run(s, dt=dt, n_steps=3))) <= 1e-12
    # inside a jit and a grad the same methods trace inline
    g = jax.grad(lambda gr: eqx.tree_at(lambda q: q.gravity, m, gr).step(s, dt).h.sum())(9.5)
    assert np.isfinite(float(g))


# ------------------------------------------------------------------ 6. NumPy integer counts
def test_numpy_integer_step_counts(adjust):
    m, s, dt = adjust
    ref = m.run(s, dt=dt, n_steps=4, save_every=2)
    for n, k in ((np.int64(4), None), (4, np.int64(2)), (np.int32(4), np.int32(2))):
        out = m.run(s, dt=dt, n_steps=n, save_every=k)
        assert out.states.h.shape[0] == (1 if k is None else 2)
        assert _max_diff(out.states.h[-1], ref.states.h[-1]) == 0
    adv = m.advance(s, t0=0.0, dt=dt, n_steps=np.int64(4))
    assert _max_diff(adv, _last(ref)) == 0


# ----------------------------------------------------------- 7. BacksolveAdjoint wrt the model
@pytest.mark.slow
def test_backsolve_adjoint_gradient_wrt_drag():
    c = make_case("wind-gyre", nx=8, ny=8, precision="float64")
    m, s = c.model, c.state
    T = 5 * m.max_stable_dt(s, 0.5)

    def loss(r, adjoint):
        model = eqx.tree_at(lambda q: q.drag, m, r)
        sol = model.solve_diffrax(s, 0.0, T, adjoint=adjoint, rtol=1e-10, atol=1e-10)
        return jnp.sum(sol.ys.u[-1] ** 2)

    r0, eps = 1e-6, 1e-9
    back = float(jax.grad(loss)(r0, diffrax.BacksolveAdjoint()))
    fd = (float(loss(r0 + eps, None)) - float(loss(r0 - eps, None))) / (2 * eps)
    assert back < 0
    assert abs(back - fd) <= 1e-4 * abs(fd)


def test_forward_mode_through_solve_diffrax_needs_forward_mode_adjoint():
    """docs/shallow_water.md: jax.jacfwd through solve_diffrax works with
    adjoint=diffrax.ForwardMode() (equal to the reverse-mode gradient) and is refused by
    the default checkpointed adjoint."""
    c = make_case("gravity-wave", nx=8, ny=8, precision="float64", drag=1e-5)
    m, s = c.model, c.state

    def loss(r, adjoint=None):
        model = eqx.tree_at(lambda q: q.drag, m, r)
        kw = {} if adjoint is None else {"adjoint": adjoint}
        return jnp.sum(model.solve_diffrax(s, 0.0, 600.0, **kw).ys.u[-1] ** 2)

    r0 = jnp.asarray(1e-5)
    forward = float(jax.jacfwd(lambda r: loss(r, diffrax.ForwardMode()))(r0))
    reverse = float(jax.grad(loss)(r0))
    assert forward < 0 and abs(forward - reverse) <= 1e-8 * abs(reverse)
    with pytest.raises(TypeError, match="forward-mode"):
        jax.jacfwd(loss)(r0)


# --------------------------------------------------------------- 8. solve_diffrax on a mesh
def test_solve_diffrax_on_a_mesh_equals_one_device(gyre):
    assert len(jax.devices()) >= 4
    layout = (2, 2)
    m, s, dt = gyre
    ts = jnp.linspace(0.0, 6 * dt, 3)
    saveat = diffrax.SaveAt(ts=ts)
    ref = m.solve_diffrax(s, 0.0, 6 * dt, saveat=saveat)
    mesh = make_mesh(layout)
    out = m.solve_diffrax(shard(s, m.grid, mesh), 0.0, 6 * dt, saveat=saveat, mesh=mesh)
    assert _max_diff(out.ys, ref.ys) <= 1e-12
    assert int(out.stats["num_steps"]) == int(ref.stats["num_steps"])
    h = out.ys.h
    assert h.sharding.shard_shape(h.shape) == (3, 16 // layout[0], 16 // layout[1])
    assert len(h.sharding.device_set) == 4


def test_a_state_committed_to_one_device_runs_on_a_mesh(gyre):
    """``jax.device_put(state, device)`` then ``run``/``advance``/``solve_diffrax`` on a
    mesh: placed on the mesh, not refused by jit's device check."""
    m, s, dt = gyre
    mesh = make_mesh((2, 2))
    on3 = jax.device_put(s, jax.devices()[3])
    ref = m.run(s, dt=dt, n_steps=4).states
    out = m.run(on3, dt=dt, n_steps=4, mesh=mesh).states
    assert _max_diff(out, ref) <= 1e-12
    assert len(out.h.sharding.device_set) == 4
    got = m.advance(on3, t0=0.0, dt=dt, n_steps=4, mesh=mesh)
    assert _max_diff(got, jax.tree.map(lambda a: a[-1], ref)) <= 1e-12
    sol = m.solve_diffrax(on3, 0.0, 2 * dt, mesh=mesh)
    assert _max_diff(sol.ys, m.solve_diffrax(s, 0.0, 2 * dt).ys) <= 1e-12
    # each result split over the mesh's 4 devices, not left on device 3 (the values alone
    # are the same on one device)
    for h in (out.h, got.h, sol.ys.h):
        assert h.sharding.shard_shape(h.shape)[-2:] == (8, 8), h.sharding
        assert len(h.sharding.device_set) == 4


# --------------------------------------------------------------------------- 9. bad states
def test_bad_states_and_mesh_are_refused_by_name(adjust):
    m, s, dt = adjust
    # every method taking a state names it (mass used to return a number for a wrong
    # shape, rhs to fail on a tuple with an AttributeError)
    wrong_shape = ShallowWaterState(h=jnp.ones((9, 16)), u=s.u, v=s.v)
    for method in (m.rhs, m.mass, m.energy, m.relative_vorticity, m.potential_vorticity):
        with pytest.raises(ValueError, match=r"^state\.h must have the grid shape"):
            method(wrong_shape)
        with pytest.raises(TypeError, match=r"^state must be a physjax.solvers.ShallowWaterState"):
            method((s.h, s.u, s.v))
    with pytest.raises(ValueError, match=r"^t must be a finite number \(seconds\), got 'x'"):
        m.step(s, dt, t="x")
    with pytest.raises(ValueError, match=r"state\.h \(layer thickness\) must be > 0 .* of -1 m"):
        m.run(ShallowWaterState(h=s.h.at[0, 0].set(-1.0), u=s.u, v=s.v), dt=dt, n_steps=2)
    f32 = jax.tree.map(lambda a: a.astype(jnp.float32), s)
    with pytest.raises(TypeError, match=r"state\.h has dtype float32 but the model computes in "):
        m.run(f32, dt=dt, n_steps=2)
    wrong = jax.tree.map(lambda a: jnp.ones((12, 8)), s)
    with pytest.raises(ValueError, match=r"state\.h must have the grid shape \(ny, nx\)=\(16, 16"):
        m.run(wrong, dt=10.0, n_steps=2)
    with pytest.raises(TypeError, match="state must be a physjax.solvers.ShallowWaterState"):
        m.run((s.h, s.u, s.v), dt=dt, n_steps=2)
    with pytest.raises(TypeError, match=r"^mesh must be a jax.sharding.Mesh .* got 4 \(int\)"):
        m.run(s, dt=dt, n_steps=2, mesh=4)
    with pytest.raises(TypeError, match=r"^mesh must be a jax.sharding.Mesh"):
        m.solve_diffrax(s, 0.0, 100.0, mesh="cpu")
    with pytest.raises(TypeError, match=r"state\.v has dtype float32"):
        m.step(ShallowWaterState(h=s.h, u=s.u, v=s.v.astype(jnp.float32)), dt)


# ------------------------------------------------------------------- 10. parameter shapes
def test_parameters_of_the_wrong_kind_or_shape():
    g = Grid((8, 12), (1e6, 1e6), periodic=(False, True), dtype="float64")
    for kwargs, error, match in (
        ({"drag": np.ones((8, 12))}, ValueError, r"^drag must be a scalar .* shape \(8, 12\)"),
        ({"gravity": np.ones(3)}, ValueError, r"^gravity must be a scalar .* shape \(3,\)"),
        ({"coriolis": "1e-4"}, TypeError, r"^coriolis must be a real number, got '1e-4' \(str"),
        ({"beta": 1e-11 + 1j}, TypeError, r"^beta must be a real number, got complex values"),
        ({"bottom": np.zeros((8, 12)) + 1j}, TypeError, r"^bottom must be real .*complex"),
        ({"bottom": np.zeros((12, 8))}, ValueError, r"^bottom must have the grid shape"),
        (
            {"wind_stress": np.zeros((8, 12))},
            ValueError,
            r"^wind_stress must be a pair \(tau_x, tau_y\) .* an array of shape \(8, 12\)",
        ),
        (
            {"wind_stress": (np.zeros((8, 12)),) * 3},
            ValueError,
            r"^wind_stress must be a pair .* got a tuple of 3 item",
        ),
    ):
        with pytest.raises(error, match=match):
            ShallowWater(g, **kwargs)
    m = ShallowWater(g)
    with pytest.raises(TypeError, match=r"^h must be real numbers .* complex values"):
        m.initial_state(np.full((8, 12), 100 + 1j))


# -------------------------------------------------------------------------- 11. dt checks
def test_dt_checks_of_advance_step_check_dt_and_tolerances(adjust):
    m, s, dt = adjust
    limit = m.max_stable_dt(s)
    for bad in (-1.0, NAN, 0.0, "10"):
        for call in (
            lambda bad=bad: m.advance(s, t0=0.0, dt=bad, n_steps=2),
            lambda bad=bad: m.step(s, bad),
        ):
            with pytest.raises(ValueError, match=r"^dt must be a finite number > 0 \(seconds\)"):
                call()
    with pytest.raises(ValueError, match=r"^dt=1e\+09 s breaks the CFL stability limit"):
        m.advance(s, t0=0.0, dt=1e9, n_steps=2, cfl_check=True)
    m.check_dt(s, jnp.asarray(0.5 * limit))  # a 0-d array is a number
    m.check_dt(s, np.float32(0.5 * limit))
    with pytest.raises(ValueError, match=r"lower dt, or take dt = model\.max_stable_dt\(state"):
        m.check_dt(s, jnp.asarray(2 * limit))
    for cfl in (-1, 0, NAN, INF):
        with pytest.raises(ValueError, match=r"^cfl must be a finite number > 0 \(a fraction"):
            m.max_stable_dt(s, cfl=cfl)
    for kw in ({"rtol": -1.0}, {"atol": NAN}, {"rtol": 0.0}):
        ((name, value),) = kw.items()
        with pytest.raises(ValueError, match=f"^{name} must be a finite number > 0 \\(a tol"):
            m.solve_diffrax(s, 0.0, 100.0, **kw)


def test_barotropic_instability_perturbs_a_jet_without_rotation():
    # with coriolis = beta = 0 the balanced h is flat: the bump, scaled by the jet's height
    # range alone, vanished and the unstable jet was never perturbed
    c = make_case("barotropic-instability", nx=32, ny=16, coriolis=0.0, beta=0.0)
    h = np.asarray(c.state.h, np.float64)
    bump = np.ptp(h - h.mean(axis=1, keepdims=True))
    scale = 20.0**2 / 9.81  # U²/g, the default jet's dynamic height
    assert 0.5 * 0.02 * scale < bump < 2 * 0.02 * scale
    default = make_case("barotropic-instability", nx=32, ny=16, perturbation=0.0)
    assert np.ptp(np.asarray(default.state.h)) > scale  # the default run is unchanged


@pytest.mark.parametrize("name", ["zonal-jet", "barotropic-instability"])
def test_a_narrow_jet_is_built_without_overflow_warnings(name):
    # 1 km wide in a 2000-3000 km channel: cosh(y / L) overflows far from the axis, where the
    # jet is zero; NumPy's RuntimeWarnings reached the command's stderr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = make_case(name, nx=8, ny=64, jet_width=1e3)
    u = np.asarray(c.state.u)
    assert np.isfinite(u).all() and np.abs(u[0]).max() == 0.0


# ----------------------------------------------------------------------- 12. make_case checks
def test_make_case_numpy_scalars_and_aliased_modes():
    a = make_case("gravity-wave", nx=8, ny=8, mean_depth=np.float32(100.0))
    b = make_case("gravity-wave", nx=8, ny=8, mean_depth=100.0)
    assert _max_diff(a.state, b.state) == 0
    make_case("wind-gyre", nx=8, ny=8, drag=np.float32(1e-6), viscosity=np.int64(100))
    # 0-d arrays with values are numbers too
    d = make_case("gravity-wave", nx=8, ny=8, mean_depth=np.array(100.0), mode_y=np.array(1))
    assert _max_diff(d.state, b.state) == 0
    make_case("wind-gyre", nx=8, ny=8, gravity=jnp.array(9.8), drag=np.array(1e-6))
    with pytest.raises(TypeError, match="parameter mean_depth must be a number"):
        make_case("gravity-wave", nx=8, ny=8, mean_depth=np.array([100.0]))
    with pytest.raises(ValueError, match=r"^the gravity-wave mode \(mode_x=64, mode_y=64\) alias"):
        make_case("gravity-wave", mode_x=64, mode_y=64)
    with pytest.raises(ValueError, match=r"mode_x is a multiple of nx and mode_y a multiple of"):
        make_case("gravity-wave", nx=8, ny=4, mode_x=16, mode_y=-4)
    with pytest.raises(ValueError, match=r"too small for the gravity-wave mode .* nx >= 3 or ny"):
        make_case("gravity-wave", nx=1, ny=1)


# ------------------------------------------------------------------------ 13. float32 diffrax
def test_solve_diffrax_keeps_a_float32_model_in_float32():
    c = make_case("gravity-wave", nx=8, ny=8, precision="float32")
    sol = c.model.solve_diffrax(c.state, 0.0, 600.0, dt0=60.0)
    assert sol.ts.dtype == jnp.float32
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(sol.ys))
    assert float(sol.ts[-1]) == 600.0
    # NumPy float64 tolerances (with x64 on) do not promote the step-size controller
    tol = c.model.solve_diffrax(c.state, 0.0, 600.0, rtol=np.float64(1e-4), atol=np.float64(1e-6))
    assert tol.ts.dtype == jnp.float32 and tol.ys.h.dtype == jnp.float32
    # nor do save times given as Python floats (float64 with x64 on): they made the whole
    # solve float64, the states included
    ts = diffrax.SubSaveAt(ts=[300.0, 600.0])
    saved = c.model.solve_diffrax(
        c.state, 0.0, 600.0, saveat=diffrax.SaveAt(subs=(ts, diffrax.SubSaveAt(t1=True)))
    )
    for sub_ts, sub_ys in zip(saved.ts, saved.ys):
        assert sub_ts.dtype == jnp.float32 and sub_ys.h.dtype == jnp.float32
    np.testing.assert_array_equal(saved.ts[0], [300.0, 600.0])


def test_run_times_keep_a_float32_model_dtype():
    """A NumPy float64 dt or t0 (with x64 on) made `sol.ts` of a float32 run float64."""
    c = make_case("gravity-wave", nx=8, ny=8, precision="float32")
    sol = c.model.run(c.state, dt=np.float64(60.0), n_steps=4, save_every=2, t0=np.float64(30.0))
    assert sol.ts.dtype == jnp.float32 and sol.states.h.dtype == jnp.float32
    np.testing.assert_array_equal(sol.ts, [150.0, 270.0])


def test_run_refuses_frame_times_its_dtype_cannot_hold():
    """A float32 run from t0 = 10 years (3.1536e8 s, where float32 times are 32 s apart)
    returned frames 96, 192, 288, 384, 512 s after t0 for dt = 100 s, without a word, where
    solve_diffrax refuses such times; run now refuses them before compiling. Times the
    dtype holds (a year, 3.1536e7 s) and float64 still run."""
    c = make_case("gravity-wave", nx=8, ny=8, precision="float32")
    m, s = c.model, c.state
    with pytest.raises(
        ValueError,
        match=r"^t0=315360000\.0 s with dt=100\.0 s: the model's dtype float32 holds frame "
        r"\d's time .* count the times from a nearer origin \(e\.g\. t0=0\) or use float64",
    ):
        m.run(s, dt=100.0, n_steps=5, t0=3.1536e8, save_every=1)
    sol = m.run(s, dt=100.0, n_steps=4, t0=3.1536e7, save_every=2)
    np.testing.assert_array_equal(np.asarray(sol.ts, np.float64) - 3.1536e7, [200.0, 400.0])
    c64 = make_case("gravity-wave", nx=8, ny=8, precision="float64")
    sol = c64.model.run(c64.state, dt=100.0, n_steps=5, t0=3.1536e8, save_every=1)
    np.testing.assert_array_equal(sol.ts - 3.1536e8, [100.0, 200.0, 300.0, 400.0, 500.0])


def test_run_that_blows_up_raises_naming_the_first_bad_frame():
    """A dam break (100 m of water beside 0.5 m) in a 16×24 channel runs dry: run returned
    frames with h down to -117 m and then NaN without a word, where solve_diffrax and the
    command line report a blow-up. It now raises, naming the first frame with h <= 0 (or
    NaN/Inf), its step and time; throw=False returns the frames as they are."""
    g = Grid((16, 24), (1.6e6, 3.0e6), periodic=(False, True))
    _, x = g.mesh_coordinates(("centre", "centre"))
    m = ShallowWater(g, coriolis=0.0)
    s = m.initial_state(h=np.where(np.abs(x - 1.5e6) < 3e5, 100.0, 0.5))
    dt = m.max_stable_dt(s, 0.9)
    with pytest.raises(
        RuntimeError,
        match=r"^run blew up: frame 2 of 20 \(after step 60, t = 116\d+ s\) holds a layer "
        r"thickness h <= 0 \(min -2\.\d+ m\); 2 frames before it are whole",
    ):
        m.run(s, dt=dt, n_steps=400, save_every=20)
    with pytest.raises(RuntimeError, match=r"^run blew up: frame 0 of 1 \(after step 400, t = "):
        m.run(s, dt=dt, n_steps=400)
    kept = m.run(s, dt=dt, n_steps=400, save_every=20, throw=False)
    assert float(kept.states.h[2].min()) < 0 and not np.isfinite(np.asarray(kept.states.h)).all()
    assert np.asarray(kept.states.h[:2]).min() > 0
    fine = m.run(s, dt=dt, n_steps=20, save_every=20)  # before it runs dry
    assert np.asarray(fine.states.h).min() > 0
    with pytest.raises(TypeError, match=r"^throw must be True or False, got 'no'"):
        m.run(s, dt=dt, n_steps=20, throw="no")


def test_solve_diffrax_reports_a_layer_that_ran_dry_like_run():
    """With constant steps the dam break's saved states held h down to -3.8 m (frame 2)
    two frames before NaN, and solve_diffrax named only the NaN frame (4), where run names
    the first frame with h <= 0; it now names that frame too. SaveAt(fn=...) values are
    checked for NaN/Inf only."""
    g = Grid((16, 24), (1.6e6, 3.0e6), periodic=(False, True))
    _, x = g.mesh_coordinates(("centre", "centre"))
    m = ShallowWater(g, coriolis=0.0)
    s = m.initial_state(h=np.where(np.abs(x - 1.5e6) < 3e5, 100.0, 0.5))
    dt = float(m.max_stable_dt(s, 0.9))
    ts = dt * 20 * np.arange(1, 6)
    kw = dict(dt0=dt, stepsize_controller=diffrax.ConstantStepSize(), max_steps=200)
    with pytest.raises(
        RuntimeError,
        match=r"^solve_diffrax blew up: the state saved at t = 116\d+ s \(frame 2 of 5\) holds "
        r"a layer thickness h <= 0 \(min -\d",
    ):
        m.solve_diffrax(s, 0.0, ts[-1], saveat=diffrax.SaveAt(ts=ts), **kw)
    kept = m.solve_diffrax(s, 0.0, ts[-1], saveat=diffrax.SaveAt(ts=ts), throw=False, **kw)
    assert float(kept.ys.h[2].min()) < 0 and float(kept.ys.h[1].min()) > 0
    mass = m.solve_diffrax(  # a saved quantity, not states: NaN/Inf alone
        s, 0.0, ts[2], saveat=diffrax.SaveAt(ts=ts[:3], fn=lambda t, y, a: y.h.sum()), **kw
    )
    assert np.isfinite(np.asarray(mass.ys)).all()


def test_an_adaptive_solve_through_a_layer_that_runs_dry_says_so():
    """Adaptive steps through the dam break's drying layer: the controller shrank the steps
    (173 of 300 rejected) until max_steps, and solve_diffrax raised diffrax's bare 'The
    maximum number of solver steps was reached. Try increasing `max_steps`', though the
    state where it stopped held h down to -8e10 m and more steps would not help. Called
    eagerly it now names the steps, and the frame with h <= 0; a solve that merely runs out
    of steps says so with diffrax's reason; inside jit diffrax's own error still stops it."""
    g = Grid((16, 24), (1.6e6, 3.0e6), periodic=(False, True))
    _, x = g.mesh_coordinates(("centre", "centre"))
    m = ShallowWater(g, coriolis=0.0)
    s = m.initial_state(h=np.where(np.abs(x - 1.5e6) < 3e5, 100.0, 0.5))
    dt = float(m.max_stable_dt(s, 0.9))
    with pytest.raises(
        RuntimeError,
        match=r"^solve_diffrax failed before t1 = 7\d+ s after 300 steps \(\d+ of them "
        r"rejected\): the state saved at t = \d+ s \(frame 0 of 1\) holds a layer thickness "
        r"h <= 0 \(min -[\d.e+]+ m\): the layer ran dry.* a larger max_steps will not help "
        r"\(diffrax: The maximum number of solver steps was reached",
    ):
        m.solve_diffrax(s, 0.0, 400 * dt, max_steps=300)
    kept = m.solve_diffrax(s, 0.0, 400 * dt, max_steps=300, throw=False)
    assert kept.result == diffrax.RESULTS.max_steps_reached and float(kept.ys.h.min()) < 0
    with pytest.raises(
        RuntimeError,
        match=r"^solve_diffrax failed before t1 = 7[\d.]+ s after 2 steps \(0 of them rejected\): "
        r"The maximum number of solver steps was reached. Try increasing `max_steps` \(throw",
    ):
        m.solve_diffrax(s, 0.0, 4 * dt, max_steps=2)
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        jax.block_until_ready(jax.jit(lambda: m.solve_diffrax(s, 0.0, 4 * dt, max_steps=2).ys)())


def test_solve_diffrax_default_tolerances_suit_a_float32_model():
    """rtol 1e-6 is a few float32 ulps: the controller took 1 363 steps for a day of this
    channel (float64: 77), and 33 823 over ten days, past diffrax's own limit of 4096.
    ``stepsize_controller=None``, the documented default given explicitly, took those
    float64 tolerances too (1 363 steps against 155): it now gets the float32 ones."""
    runs = {}
    for precision in ("float32", "float64"):
        c = make_case("zonal-jet", nx=24, ny=16, precision=precision)
        runs[precision] = c.model.solve_diffrax(c.state, 0.0, 86400.0)
        if precision == "float32":
            explicit = c.model.solve_diffrax(c.state, 0.0, 86400.0, stepsize_controller=None)
    steps32, steps64 = (int(runs[p].stats["num_steps"]) for p in ("float32", "float64"))
    assert steps32 <= 3 * steps64, (steps32, steps64)
    assert int(explicit.stats["num_steps"]) == steps32
    h32, h64 = (np.asarray(runs[p].ys.h[-1], np.float64) for p in ("float32", "float64"))
    assert np.max(np.abs(h32 - h64)) <= 1e-5 * np.max(np.abs(h64))


def test_solve_diffrax_saving_every_step_keeps_diffrax_step_limit():
    """diffrax pads SaveAt(steps=True) output to max_steps frames: at physjax's limit of
    100 000 a day of a 24×16 channel took 460 MB for its 155 steps."""
    c = make_case("zonal-jet", nx=24, ny=16, precision="float32")
    every = c.model.solve_diffrax(c.state, 0.0, 86400.0, saveat=diffrax.SaveAt(steps=True))
    n = int(every.stats["num_accepted_steps"])  # one frame per accepted step
    assert every.ts.shape == (4096,) and every.ys.h.shape == (4096, 16, 24)
    assert 10 < n < 4096 and np.isfinite(np.asarray(every.ts[:n])).all()
    assert float(every.ts[n - 1]) == 86400.0 and np.isinf(np.asarray(every.ts[n:])).all()
    given = c.model.solve_diffrax(
        c.state, 0.0, 86400.0, saveat=diffrax.SaveAt(steps=True), max_steps=200
    )
    assert given.ts.shape == (200,) and float(given.ts[n - 1]) == 86400.0
    # the limit stays 100 000 otherwise
    assert c.model.solve_diffrax(c.state, 0.0, 600.0).stats["max_steps"] == 100_000
    assert every.stats["max_steps"] == 4096 and given.stats["max_steps"] == 200


def test_solve_diffrax_dense_output_keeps_diffrax_step_limit(adjust):
    """Dense output is stored per step in buffers of max_steps entries: at physjax's limit of
    100 000 a 16² float64 solve took 5.6 GB (17–24 GB on a 2×2 mesh, killing the process)."""
    m, s, dt = adjust
    dense = m.solve_diffrax(s, 0.0, 4 * dt, saveat=diffrax.SaveAt(dense=True))
    assert dense.stats["max_steps"] == 4096 and dense.interpolation.ts.shape == (4097,)
    given = m.solve_diffrax(s, 0.0, 4 * dt, saveat=diffrax.SaveAt(dense=True), max_steps=30)
    assert given.interpolation.ts.shape == (31,)
    for sol in (dense, given):
        assert _max_diff(sol.evaluate(4 * dt), m.solve_diffrax(s, 0.0, 4 * dt).ys) <= 1e-12


# ----------------------------------------------------------------------- 14. the docstring
def test_strip_rows_docstring_describes_the_cache_rule():
    doc = " ".join(ShallowWater.__doc__.split())
    assert "no longer fits in the last-level cache" in doc
    assert "for fields of 4 MiB or more (725² float64, 1024² float32)" in doc
    assert "(with 32 MiB of L3, from 569² float64 or 804² float32 up)" in doc
    assert "(e.g. 1024² float32 or float64)" not in doc


def test_advance_cfl_check_must_be_a_bool(adjust):
    """``advance(..., cfl_check="no")`` checked the limit (and refused a dt above it) and
    ``cfl_check=None`` skipped it, each by its truth value; both are now refused by name."""
    model, state, dt = adjust
    for value in ("no", None, 1):
        with pytest.raises(TypeError, match=r"^cfl_check must be True or False, got "):
            model.advance(state, t0=0.0, dt=100 * dt, n_steps=1, cfl_check=value)
    with pytest.raises(ValueError, match=r"breaks the CFL stability limit"):
        model.advance(state, t0=0.0, dt=100 * dt, n_steps=1, cfl_check=np.bool_(True))
    out = model.advance(state, t0=0.0, dt=dt, n_steps=1, cfl_check=False)
    assert _max_diff(out, model.step(state, dt)) <= 1e-12


def test_advance_lets_a_drying_layer_through_for_the_blow_up_driver(adjust):
    m, s, dt = adjust
    dry = ShallowWaterState(h=s.h.at[0, 0].set(-1.0), u=s.u, v=s.v)
    with pytest.raises(ValueError, match=r"state\.h \(layer thickness\) must be > 0"):
        m.run(dry, dt=dt, n_steps=1)
    out = m.advance(dry, t0=0.0, dt=dt, n_steps=1)  # finite, so the driver can locate a blow-up
    assert _max_diff(out, m.step(dry, dt)) <= 1e-12
    assert float(out.h[0, 0]) != float(dry.h[0, 0])


# ------------------------------------------------------------------ the step contract
def test_step_takes_state_and_dt_as_the_design_says(gyre):
    """``step(state, dt)`` (DESIGN.md), the time a keyword: one step equals a one-step
    ``advance``; the old positional ``step(state, t, dt)`` is a TypeError, not a silent swap."""
    m, s, dt = gyre
    one = jax.jit(lambda st: m.step(st, dt))(s)
    ref = m.advance(s, t0=0.0, dt=dt, n_steps=1)
    assert _max_diff(one, ref) <= 1e-15 * float(jnp.max(s.h))
    assert _max_diff(one, s) > 1e-6  # it did step
    assert _max_diff(jax.jit(lambda st: m.step(st, dt, t=3600.0))(s), one) == 0.0
    with pytest.raises(TypeError, match=r"step\(\) takes 3 positional arguments but 4"):
        m.step(s, 0.0, dt)


def test_zonal_jet_end_time_follows_the_coriolis_parameter():
    # 10 inertial periods of the f actually given, not of the default f
    slow = make_case("zonal-jet", nx=8, ny=8, coriolis=5e-5)
    assert slow.t_end == pytest.approx(20 * np.pi / 5e-5, rel=1e-15)
    assert slow.parameters["t_end"] == slow.t_end
    south = make_case("zonal-jet", nx=8, ny=8, coriolis=-2e-4)
    assert south.t_end == pytest.approx(20 * np.pi / 2e-4, rel=1e-15)
    # an explicit end time is kept as given
    assert make_case("zonal-jet", nx=8, ny=8, coriolis=5e-5, t_end=3600.0).t_end == 3600.0
    # no rotation, no inertial period: the nominal default
    still = make_case("zonal-jet", nx=8, ny=8, coriolis=0.0)
    assert still.t_end == pytest.approx(20 * np.pi / 1e-4)
    # an f so near 0 that 20π/|f| overflows is as f = 0: it was refused, 'parameter t_end must
    # be a finite number, got inf', naming a t_end never given (the command line's --t-end
    # too: make_case builds its default all the same)
    tiny = make_case("zonal-jet", nx=8, ny=8, coriolis=1e-310)
    assert tiny.t_end == pytest.approx(20 * np.pi / 1e-4)
    # other cases keep their fixed default
    assert make_case("gravity-wave", nx=8, ny=8, coriolis=5e-5).t_end == 86400.0


def test_an_integer_for_a_float_parameter_is_kept_as_a_float():
    """Written to the file as the float it stands for (a config's ``mean_depth = 50``)."""
    case = make_case("gravity-wave", nx=8, ny=8, mean_depth=50, mode_x=2)
    assert type(case.parameters["mean_depth"]) is float and case.parameters["mean_depth"] == 50.0
    assert type(case.parameters["mode_x"]) is int  # an integer parameter stays one


def test_solve_diffrax_refuses_tolerances_its_controller_would_ignore():
    """rtol=1e-12 beside a PIDController(rtol=1e-3) took the controller's steps without a
    word (7 over an hour here, against 27 at rtol=1e-9), and a misspelt keyword was
    reported against an internal function's name."""
    case = make_case("gravity-wave", nx=16, ny=16, precision="float64")
    own = diffrax.PIDController(rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError, match=r"rtol set the tolerances of the default step-size"):
        case.model.solve_diffrax(case.state, 0.0, 100.0, rtol=1e-12, stepsize_controller=own)
    with pytest.raises(ValueError, match=r"rtol, atol set the tolerances"):
        case.model.solve_diffrax(
            case.state, 0.0, 100.0, rtol=1e-9, atol=1e-9, stepsize_controller=own
        )
    with pytest.raises(TypeError, match=r"solve_diffrax\(\) got unexpected keyword .*\['tol'\]"):
        case.model.solve_diffrax(case.state, 0.0, 100.0, tol=1e-6)
    # the controller's own tolerances act: tighter ones take more steps
    loose = case.model.solve_diffrax(case.state, 0.0, 3600.0, stepsize_controller=own)
    tight = case.model.solve_diffrax(
        case.state, 0.0, 3600.0, stepsize_controller=diffrax.PIDController(rtol=1e-9, atol=1e-12)
    )
    assert int(tight.stats["num_steps"]) > int(loose.stats["num_steps"])


def test_parameters_set_with_tree_at_are_checked_again_by_every_method():
    """``eqx.tree_at`` skips the constructor: what it refuses is refused by the methods
    (negative gravity was a bare 'math domain error', negative drag silent NaN, and one
    field as wind_stress ran with its rows 0 and 1 as tau_x and tau_y)."""
    g = Grid((8, 12), (1e6, 1e6), periodic=(False, True), dtype="float64")
    m = ShallowWater(g, drag=1e-6)
    s = m.initial_state(np.full(g.shape, 100.0))

    def edit(name, value):
        return eqx.tree_at(lambda q: getattr(q, name), m, value, is_leaf=lambda x: x is None)

    for name, value, match in (
        ("gravity", -9.81, r"^gravity must be > 0, got -9.81"),
        ("drag", -1.0, r"^drag must be >= 0, got -1.0"),
        ("density", jnp.asarray(np.nan), r"^density must be a finite number"),
        ("viscosity", np.ones(3), r"^viscosity must be a scalar"),
        ("wind_stress", np.ones(g.shape), r"^wind_stress must be a pair \(tau_x, tau_y\)"),
        ("bottom", np.ones((12, 8)), r"^bottom must have the grid shape \(ny, nx\)=\(8, 12\)"),
    ):
        bad = edit(name, value)
        for call in (
            lambda bad=bad: bad.run(s, dt=100.0, n_steps=2),
            lambda bad=bad: bad.advance(s, t0=0.0, dt=100.0, n_steps=2),
            lambda bad=bad: bad.step(s, 100.0),
            lambda bad=bad: bad.rhs(s),
            lambda bad=bad: bad.max_stable_dt(s),
            lambda bad=bad: bad.solve_diffrax(s, 0.0, 100.0),
        ):
            with pytest.raises(ValueError, match=match):
                call()


def test_a_parameter_of_another_float_dtype_is_taken_in_the_model_dtype():
    """With x64 on, a float64 drag set on a float32 model (vmap over a float64 array,
    grad at a NumPy float64) runs in float32 instead of failing in lax.scan."""
    case = make_case("gravity-wave", nx=16, ny=16)  # float32
    model = eqx.tree_at(lambda m: m.drag, case.model, 0.0, is_leaf=lambda x: x is None)

    def final_u(r):
        m = eqx.tree_at(lambda m: m.drag, model, r)
        return m.run(case.state, dt=100.0, n_steps=2).states.u[-1].sum()

    single = jax.vmap(final_u)(jnp.array([0.0, 1e-6], jnp.float32))
    double = jax.vmap(final_u)(jnp.array([0.0, 1e-6], jnp.float64))
    assert double.dtype == jnp.float32 and np.array_equal(single, double)
    assert single[0] != single[1]
    g64 = jax.grad(final_u)(np.float64(1e-6))
    g32 = jax.grad(final_u)(np.float32(1e-6))
    assert float(g64) == float(g32) and float(g32) != 0
    bottom = np.zeros(case.model.grid.shape)  # float64 NumPy field
    m = eqx.tree_at(lambda q: q.bottom, case.model, bottom, is_leaf=lambda x: x is None)
    out = m.step(case.state, 100.0)
    assert out.h.dtype == jnp.float32
    assert np.array_equal(out.h, case.model.step(case.state, 100.0).h)


def test_max_stable_dt_has_a_finite_gradient_without_rotation():
    """At f = 0 the rotation limit is inactive: its division must not turn the gradient of a
    run whose dt follows the model into NaN."""
    case = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64", coriolis=0.0)
    m, s = case.model, case.state

    def with_f(f):
        return eqx.tree_at(lambda q: q.coriolis, m, f)

    assert float(jax.grad(lambda f: with_f(f).max_stable_dt(s))(0.0)) == 0.0

    def loss(f):
        mm = with_f(f)
        dt = mm.max_stable_dt(s, 0.5)
        return jnp.sum(mm.run(s, dt=dt, n_steps=3).states.u[-1] ** 2)

    grad = float(jax.grad(loss)(0.0))
    fd = float((loss(1e-7) - loss(-1e-7)) / 2e-7)  # 0: the run is even in f
    scale = abs(float(jax.grad(loss)(1e-4)))  # ~2e3
    assert np.isfinite(grad) and abs(grad - fd) <= 1e-9 * scale, (grad, fd, scale)


def test_traced_counts_and_case_parameters_are_named_as_fixed_settings(adjust):
    model, state, dt = adjust
    with pytest.raises(
        ValueError, match=r"^n_steps must be a fixed positive integer, not a traced"
    ):
        jax.jit(lambda n: model.run(state, dt=dt, n_steps=n))(4)
    with pytest.raises(ValueError, match=r"^save_every must be a fixed positive integer"):
        jax.jit(lambda n: model.run(state, dt=dt, n_steps=4, save_every=n))(2)
    with pytest.raises(TypeError, match=r"^parameter amplitude must be a fixed number, not a"):
        jax.jit(lambda a: make_case("gravity-wave", nx=16, ny=16, amplitude=a))(0.02)


def test_a_traced_case_parameter_is_told_a_way_to_set_it_that_works(adjust):
    """The message for a traced ``make_case`` parameter advised
    ``eqx.tree_at(lambda m: m.drag, case.model, r)``, which fails for the very ``drag`` it
    names on a case built with the default drag of 0 (left out of the model, ``None``):
    equinox's "`where` does not uniquely identify a single element". It now gives
    ``is_leaf``; the advice, followed as written, differentiates."""
    _, state, dt = adjust
    case = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64")
    with pytest.raises(TypeError) as info:
        jax.grad(lambda r: make_case("geostrophic-adjustment", nx=16, ny=16, drag=r).t_end)(0.0)
    advice = str(info.value).split("e.g. ")[1].split(" (is_leaf")[0]
    assert advice.endswith("is_leaf=lambda x: x is None)")

    def loss(r):
        m = eval(advice, {"eqx": eqx, "case": case, "r": r})
        return (m.run(state, dt=dt, n_steps=2).states.u ** 2).sum()

    assert float(jax.grad(loss)(1e-6)) != 0


def test_step_keeps_a_float32_model_in_float32_with_a_numpy_float64_dt():
    """With x64 on, ``step(state, np.float64(dt))`` returned a float64 state from a float32
    model (``run`` and ``advance`` convert ``dt``; ``step`` promoted the update)."""
    case = make_case("gravity-wave", nx=8, ny=8)  # float32
    m, s = case.model, case.state
    ref = m.step(s, 100.0)
    for dt in (np.float64(100.0), jnp.asarray(100.0, jnp.float64)):
        out = m.step(s, dt, t=np.float64(50.0))
        assert {a.dtype for a in jax.tree.leaves(out)} == {jnp.dtype("float32")}
        assert _max_diff(out, ref) == 0.0


def test_diagnostics_take_parameters_set_with_tree_at_in_the_model_dtype():
    """With x64 on, a float64 gravity or coriolis set on a float32 model made ``energy``
    and ``potential_vorticity`` float64, and an energy unlike the same model built anew."""
    g = Grid((8, 12), (8e5, 1.2e6), periodic=(False, True), dtype="float32")
    h = 100.0 + np.linspace(0.0, 1.0, 96).reshape(g.shape)
    edits = {"gravity": np.float64(9.0), "coriolis": np.array(2e-4), "beta": np.float64(2e-11)}
    base = ShallowWater(g)
    s = base.initial_state(h, np.full(g.shape, 0.1))
    for name, value in edits.items():
        edited = eqx.tree_at(lambda m, name=name: getattr(m, name), base, value)
        built = ShallowWater(g, **{name: value})
        for diagnostic in ("energy", "potential_vorticity"):
            got = getattr(edited, diagnostic)(s)
            assert got.dtype == jnp.float32, (name, diagnostic)
            assert np.array_equal(got, getattr(built, diagnostic)(s)), (name, diagnostic)
    bottom = np.linspace(0.0, 5.0, 96).reshape(g.shape)  # a float64 NumPy field
    edited = eqx.tree_at(lambda m: m.bottom, base, bottom, is_leaf=lambda x: x is None)
    got = edited.energy(s)
    assert got.dtype == jnp.float32 and got == ShallowWater(g, bottom=bottom).energy(s)


def test_physical_constants_are_checked_in_the_model_dtype():
    """A constant finite in float64 but not in the grid's float32 was accepted by the
    constructor (held as inf, or 0 under a '> 0' bound) and refused only by the methods, as
    'must be a finite number, got inf' or 'must be > 0, got 0.0' — not what was given."""
    g = Grid((8, 12), (1e6, 1e6), periodic=(False, True), dtype="float32")
    for name, value, match in (
        ("gravity", 1e39, r"^gravity must be finite in the grid's dtype float32, got 1e\+39"),
        ("viscosity", 1e39, r"^viscosity must be finite in the grid's dtype float32"),
        ("density", 1e-46, r"^density must be > 0 in the grid's dtype float32, got 1e-46"),
    ):
        with pytest.raises(ValueError, match=match):
            ShallowWater(g, **{name: value})
        base = ShallowWater(g, viscosity=1.0)
        m = eqx.tree_at(lambda q, name=name: getattr(q, name), base, value)
        with pytest.raises(ValueError, match=match):
            m.rhs(m.initial_state(np.full(g.shape, 100.0)))
    # small but representable, or 0 where 0 is allowed: accepted
    assert float(ShallowWater(g, drag=1e-46).drag) == 0.0
    assert float(ShallowWater(g, density=1e-40).density) > 0


def test_a_grid_set_with_tree_at_is_checked_again_by_every_method():
    """``eqx.tree_at`` skips the constructor's checks of the grid too: a halo=2 grid failed
    in the tendency with a broadcasting error, a 3-D one with 'too many values to unpack',
    and a walled axis of one cell ran, with its wall halo mirroring the wall face itself."""
    g = Grid((8, 8), (8e5, 8e5), dtype="float64")
    m = ShallowWater(g)
    walled = Grid((8, 8), (8e5, 8e5), periodic=(False, True), dtype="float64")
    channel = ShallowWater(walled, boundary="no-slip")
    for grid, error, match in (
        (Grid((8, 8), (8e5, 8e5), dtype="float64", halo=2), ValueError, r"must have halo=1"),
        (Grid((4, 8, 8), (1.0, 8e5, 8e5), dtype="float64"), TypeError, r"^grid must be a 2-D"),
        (
            Grid((8, 1), (8e5, 8e5), periodic=(True, False), dtype="float64"),
            ValueError,
            r"^grid size nx=1 is too small: a walled x axis",
        ),
    ):
        bad = eqx.tree_at(lambda q: q.grid, m, grid)
        s = ShallowWaterState(*(jnp.full(grid.shape, x) for x in (100.0, 0.0, 0.0)))
        for call in (
            lambda bad=bad, s=s: bad.run(s, dt=10.0, n_steps=1),
            lambda bad=bad, s=s: bad.step(s, 10.0),
            lambda bad=bad, s=s: bad.rhs(s),
            lambda bad=bad, s=s: bad.energy(s),
        ):
            with pytest.raises(error, match=match):
                call()
    periodic = eqx.tree_at(lambda q: q.grid, channel, g)  # no-slip with no wall left
    s = periodic.initial_state(np.full(g.shape, 100.0))
    with pytest.raises(ValueError, match=r"^boundary='no-slip' sets the condition at walls"):
        periodic.run(s, dt=10.0, n_steps=1)


def test_the_stability_limit_in_the_model_dtype_is_not_refused():
    """``run(state, dt=jnp.asarray(model.max_stable_dt(state)))`` on a float32 model was
    refused as 'CFL number 1.00 > 1' when float32 rounded the limit up (5 of 15 small cases),
    and so was the limit computed under jit (float32 arithmetic)."""
    case = make_case("geostrophic-adjustment", nx=8, ny=8)  # float32
    m, s = case.model, case.state
    limit = m.max_stable_dt(s)
    dts = (jnp.float32(limit), np.float32(limit), eqx.filter_jit(m.max_stable_dt)(s))
    assert float(dts[0]) > limit  # rounded up: the case this test is about
    for dt in dts:
        m.check_dt(s, dt)
        assert m.run(s, dt=dt, n_steps=1).states.h.dtype == jnp.float32
    with pytest.raises(ValueError, match=r"breaks the CFL stability limit"):
        m.check_dt(s, limit * (1 + 1e-5))


def test_traced_max_stable_dt_keeps_a_float32_model_in_float32():
    """Inside jit/vmap, ``max_stable_dt(state, np.float64(0.5))`` of a float32 model was
    float64 (the NumPy cfl promoted the traced limit)."""
    case = make_case("gravity-wave", nx=8, ny=8)  # float32
    m, s = case.model, case.state
    for cfl in (0.5, np.float64(0.5), jnp.asarray(0.5, jnp.float64)):
        dt = jax.jit(lambda st, cfl=cfl: m.max_stable_dt(st, cfl))(s)
        assert dt.dtype == jnp.float32
        assert float(dt) == pytest.approx(m.max_stable_dt(s, 0.5), rel=1e-6)


def test_shared_advance_and_integrate_name_a_traced_or_fractional_count():
    """``physjax.solvers.advance``/``integrate`` (public, for your own ``step``) failed with
    JAX's TracerBoolConversionError or ConcretizationTypeError when a count was traced, ran
    3 steps for ``n_steps=2.5`` and none for ``-1``, and stacked copies of ``y0`` for
    ``save_every=0``."""
    from physjax.solvers import advance, integrate, ssprk3_step

    def step(y, t, dt):
        return ssprk3_step(lambda y, t: -y, y, t, dt)

    y0 = jnp.ones(3)
    for name, call in (
        ("n_steps", lambda n: advance(step, y0, 0.0, 0.1, n)),
        ("n_frames", lambda n: integrate(step, y0, 0.0, 0.1, n, 2)),
        ("save_every", lambda n: integrate(step, y0, 0.0, 0.1, 2, n)),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be a fixed integer, not a traced"):
            jax.jit(call)(4)
    with pytest.raises(ValueError, match=r"^n_steps must be an integer >= 0, got 2\.5$"):
        advance(step, y0, 0.0, 0.1, 2.5)
    with pytest.raises(ValueError, match=r"^n_steps must be an integer >= 0, got -1$"):
        advance(step, y0, 0.0, 0.1, -1)
    with pytest.raises(ValueError, match=r"^save_every must be a positive integer, got 0$"):
        integrate(step, y0, 0.0, 0.1, 2, 0)
    # fixed counts (NumPy integers too) work, inside jit as well, and 0 steps return y
    three = advance(step, y0, 0.0, 0.1, np.int32(3))
    assert float(three[0]) == pytest.approx(float(jnp.exp(-0.3)), rel=1e-4)
    assert float(jax.jit(lambda y: advance(step, y, 0.0, 0.1, 3))(y0)[0]) == float(three[0])
    assert float(advance(step, y0, 0.0, 0.1, 0)[0]) == 1.0
    frames = integrate(step, y0, 0.0, 0.1, np.int64(2), 3)
    assert frames.shape == (2, 3) and float(frames[0, 0]) == float(three[0])


def test_coriolis_at_is_in_the_model_dtype():
    """With x64 on, ``coriolis_at(y)`` of a float32 model returned float64 for float64 ``y``
    (grid coordinates from NumPy, say) or a float64 ``beta`` set with ``eqx.tree_at``."""
    case = make_case("barotropic-instability", nx=16, ny=8)  # float32, beta-plane
    m = case.model
    y = np.asarray(m.grid.coordinates("y", "centre"), np.float64)
    y_mid = m.grid.origin[0] + 0.5 * m.grid.extent[0]
    exact = float(m.coriolis) + float(m.beta) * (y - y_mid)
    edited = eqx.tree_at(lambda q: q.beta, m, np.float64(m.beta))
    for model, ys in ((m, y), (m, jnp.asarray(y)), (edited, y), (m, y.astype(np.float32))):
        f = model.coriolis_at(ys)
        assert f.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(f), exact, rtol=1e-6, atol=1e-6 * abs(exact).max())
    assert jax.jit(lambda y: m.coriolis_at(y))(y).dtype == jnp.float32
    f64 = make_case("barotropic-instability", nx=16, ny=8, precision="float64").model
    assert f64.coriolis_at(y).dtype == jnp.float64
    exact64 = float(f64.coriolis) + float(f64.beta) * (y - y_mid)
    assert float(jnp.max(jnp.abs(f64.coriolis_at(y) - exact64))) <= 1e-18


def test_coriolis_at_refuses_coordinates_that_are_not_real_numbers():
    """``coriolis_at(1j)`` dropped the imaginary part and returned f at y = 0 without a word,
    ``coriolis_at("a")`` failed with JAX's 'Value 'a' with dtype <U1 is not a valid JAX array
    type' and ``coriolis_at(None)`` with 'None is not a valid value for jnp.array'."""
    m = make_case("barotropic-instability", nx=16, ny=8).model
    for y, what in (
        (1j, "complex values"),
        (np.array([0.0, 1e6]) + 0j, "complex values"),
        (np.array([True, False]), "boolean values"),
        ("a", "'a'"),
        (None, "None"),
    ):
        with pytest.raises(
            TypeError, match=rf"^y must be coordinates \[m\], real numbers, got {what}"
        ):
            m.coriolis_at(y)
    # real numbers of every kind pass, also traced
    assert m.coriolis_at([0.0, 1.5e6]).shape == (2,)
    assert float(m.coriolis_at(np.int64(1_500_000))) == pytest.approx(float(m.coriolis))
    assert jax.vmap(m.coriolis_at)(jnp.zeros(3)).shape == (3,)


def test_non_finite_fields_set_with_tree_at_are_refused_by_run():
    """A NaN bottom or an Inf wind stress set with ``eqx.tree_at`` (which skips the
    constructor's check) ran: ``run`` returned NaN in 52 of the 96 cells of h after 2 steps
    and ``solve_diffrax`` stopped with diffrax's EquinoxRuntimeError. The methods that check
    the state's values check these fields' values too."""
    g = Grid((8, 12), (1e6, 1e6), periodic=(False, True), dtype="float64")
    zero = np.zeros(g.shape)
    m = ShallowWater(g, bottom=zero, wind_stress=(zero, zero))
    s = m.initial_state(np.full(g.shape, 100.0))
    for where, value, match in (
        (lambda q: q.bottom, jnp.asarray(zero).at[2, 3].set(NAN), r"^bottom must be finite"),
        (
            lambda q: q.wind_stress,
            (jnp.asarray(zero).at[1, 1].set(INF), jnp.asarray(zero)),
            r"^wind_stress\[0\] \(tau_x\) must be finite everywhere, got 1 NaN/Inf",
        ),
    ):
        bad = eqx.tree_at(where, m, value)
        for call in (
            lambda bad=bad: bad.run(s, dt=100.0, n_steps=2),
            lambda bad=bad: bad.advance(s, t0=0.0, dt=100.0, n_steps=2),
            lambda bad=bad: bad.solve_diffrax(s, 0.0, 100.0),
            lambda bad=bad: bad.max_stable_dt(s),
        ):
            with pytest.raises(ValueError, match=match):
                call()
    # traced fields (a gradient with respect to the bottom) have no values to check
    grad = jax.grad(
        lambda b: jnp.sum(
            eqx.tree_at(lambda q: q.bottom, m, b).run(s, dt=100.0, n_steps=2).states.h
        )
    )(jnp.asarray(zero))
    assert grad.shape == g.shape and bool(jnp.all(jnp.isfinite(grad)))


def test_vmap_of_solve_diffrax_on_a_mesh_equals_a_loop(gyre):
    """``jax.vmap`` over states of ``solve_diffrax(..., mesh=mesh)`` failed with JAX's
    IndivisibleError: ``physjax.parallel.shard`` placed a traced array with
    ``jax.device_put``, whose spec under ``vmap`` falls on the batch axis (a batch of 2
    frames of (16, 16) was split along the frames); inside ``jit`` it left the result
    replicated. Traced arrays are now constrained with ``with_sharding_constraint``."""
    m, s, dt = gyre
    mesh = make_mesh((2, 2))
    noise = np.random.default_rng(0).normal(size=(3, *m.grid.shape))
    batch = ShallowWaterState(
        h=s.h + jnp.asarray(noise), u=jnp.stack([s.u] * 3), v=jnp.stack([s.v] * 3)
    )

    def solve(st):
        return m.solve_diffrax(st, 0.0, 4 * dt, mesh=mesh).ys

    out = jax.vmap(solve)(batch)
    loop = [
        m.solve_diffrax(jax.tree.map(lambda a, i=i: a[i], batch), 0.0, 4 * dt).ys for i in range(3)
    ]
    assert _max_diff(out, jax.tree.map(lambda *a: jnp.stack(a), *loop)) <= 1e-12
    # run and advance on the mesh under vmap (these worked before): each member its own run
    ran = jax.vmap(lambda st: m.run(st, dt=dt, n_steps=4, mesh=mesh).states)(batch)
    adv = jax.vmap(lambda st: m.advance(st, t0=0.0, dt=dt, n_steps=4, mesh=mesh))(batch)
    one = [m.run(jax.tree.map(lambda a, i=i: a[i], batch), dt=dt, n_steps=4) for i in range(3)]
    one = jax.tree.map(lambda *a: jnp.stack(a), *[o.states for o in one])
    assert _max_diff(ran, one) <= 1e-12
    assert _max_diff(adv, jax.tree.map(lambda a: a[:, -1], one)) <= 1e-12
    # and each batch is split over the mesh like the grid, the batch axis whole (equal
    # values alone are what one device gives too)
    for h in (out.h, ran.h, adv.h):
        assert h.sharding.shard_shape(h.shape) == (*h.shape[:-2], 8, 8), (h.shape, h.sharding)
        assert len(h.sharding.device_set) == 4
    # shard itself under vmap and jit: the batch axis stays whole, the grid axes split
    x = jnp.ones((3, 2, *m.grid.shape))
    for placed in (
        jax.vmap(lambda a: shard(a, m.grid, mesh))(x),
        jax.jit(lambda a: shard(a, m.grid, mesh))(x),
    ):
        assert placed.sharding.shard_shape(x.shape) == (3, 2, 8, 8)


def test_solve_diffrax_max_steps_is_checked_and_reaching_it_is_an_error(adjust):
    """``max_steps=-1`` failed with a bare 'math domain error', 0 with diffrax's 'Must have
    at least one checkpoint', and a NumPy integer (accepted for every other count) with
    JAX's TracerBoolConversionError; a solve that reaches the limit must raise, never return
    a partial solution."""
    m, s, dt = adjust
    for bad in (-1, 0, True, 2.5):
        with pytest.raises(
            ValueError, match=r"^max_steps must be a positive integer or None \(no limit\), got"
        ):
            m.solve_diffrax(s, 0.0, 4 * dt, max_steps=bad)
    ok = m.solve_diffrax(s, 0.0, 4 * dt, max_steps=np.int64(50))
    assert int(ok.stats["max_steps"]) == 50 and int(ok.stats["num_steps"]) < 50
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        m.solve_diffrax(s, 0.0, 4 * dt, max_steps=2)
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        jax.block_until_ready(
            eqx.filter_jit(lambda st: m.solve_diffrax(st, 0.0, 4 * dt, max_steps=2).ys)(s)
        )


def test_solve_diffrax_throw_false_returns_a_failed_solve_with_its_result(adjust):
    """A solve that reaches max_steps could only raise: a batch under vmap lost every
    member for one that failed. ``throw=False`` (diffrax's) returns, ``sol.result`` naming
    the failure and the frames not reached ``inf``; the members that succeed are whole."""
    m, s, dt = adjust
    T = 4 * dt
    saveat = diffrax.SaveAt(ts=[0.0, T / 2, T])
    failed = m.solve_diffrax(s, 0.0, T, saveat=saveat, max_steps=2, throw=False)
    assert failed.result != diffrax.RESULTS.successful
    assert np.isfinite(np.asarray(failed.ys.h[0])).all()
    assert np.isinf(np.asarray(failed.ys.h[-1])).all()
    ok = m.solve_diffrax(s, 0.0, T, saveat=saveat, throw=False)
    assert ok.result == diffrax.RESULTS.successful
    ref = m.solve_diffrax(s, 0.0, T, saveat=saveat)
    assert _max_diff(ok.ys.h, ref.ys.h) == 0
    # a batch whose second member asks for a span 100 times longer: only it fails
    spans = jnp.asarray([T, 100 * T], s.h.dtype)
    batch = jax.vmap(lambda t1: m.solve_diffrax(s, 0.0, t1, max_steps=50, throw=False))(spans)
    assert np.asarray(batch.result == diffrax.RESULTS.successful).tolist() == [True, False]
    assert _max_diff(batch.ys.h[0, -1], ref.ys.h[-1]) <= 1e-12 * float(np.abs(ref.ys.h).max())
    with pytest.raises(TypeError, match=r"^throw must be True or False, got 'no'"):
        m.solve_diffrax(s, 0.0, T, throw="no")


def test_solve_diffrax_with_constant_steps_that_blow_up_raises(adjust):
    """With ``diffrax.ConstantStepSize()`` and a ``dt0`` far above the stable step, the state
    overflowed to NaN and came back as a successful solution (``run`` refuses such a
    ``dt``); it now raises, naming the time of the first bad frame and the stable step.
    Stable constant steps, and frames saved at every step (padded with ``inf``), pass."""
    m, s, dt = adjust
    const = diffrax.ConstantStepSize()
    T = 600 * dt
    with pytest.raises(RuntimeError, match=r"^solve_diffrax blew up: the state saved at t = "):
        m.solve_diffrax(s, 0.0, T, stepsize_controller=const, dt0=6 * dt)
    with pytest.raises(RuntimeError, match=r"max_stable_dt\(state\), is "):
        m.solve_diffrax(
            s, 0.0, T, stepsize_controller=const, dt0=6 * dt, saveat=diffrax.SaveAt(ts=[T / 2, T])
        )
    with pytest.raises(RuntimeError, match=r"^solve_diffrax blew up"):  # saving fn(y) only
        m.solve_diffrax(
            s,
            0.0,
            T,
            stepsize_controller=const,
            dt0=6 * dt,
            saveat=diffrax.SaveAt(
                subs=[
                    diffrax.SubSaveAt(ts=[T / 2], fn=lambda t, y, a: y.h.max()),
                    diffrax.SubSaveAt(t1=True),
                ]
            ),
        )
    kept = m.solve_diffrax(s, 0.0, T, stepsize_controller=const, dt0=6 * dt, throw=False)
    assert not np.isfinite(np.asarray(kept.ys.h)).all()
    ok = m.solve_diffrax(
        s, 0.0, 20 * dt, stepsize_controller=const, dt0=dt, saveat=diffrax.SaveAt(steps=True)
    )
    assert ok.ys.h.shape[0] == 4096 and np.isinf(np.asarray(ok.ys.h[-1])).all()
    assert np.isfinite(np.asarray(ok.ys.h[:20])).all()


def test_solve_diffrax_refuses_save_times_outside_the_span_before_compiling(adjust):
    """``SaveAt(ts=...)`` outside ``[t0, t1]`` or out of order was refused by diffrax only
    once the solve ran (an EquinoxRuntimeError after compiling, not naming the times); it is
    now a ValueError naming them, checked in the model's dtype (times that round onto t1
    there are fine)."""
    m, s, dt = adjust
    T = 4 * dt
    for t0, t1, ts, match in (
        (0.0, T, [0.0, 2 * T], r"^saveat\.ts must lie between t0=0\.0 s and t1=.* 1 time"),
        (0.0, T, [0.0, NAN], r"^saveat\.ts must lie between .* e\.g\. nan"),
        (0.0, T, [T / 2, T / 4], r"^saveat\.ts must be increasing, got"),
        (T, 0.0, [T / 4, T / 2], r"^saveat\.ts must be decreasing \(t1 < t0\), got"),
    ):
        with pytest.raises(ValueError, match=match):
            m.solve_diffrax(s, t0, t1, saveat=diffrax.SaveAt(ts=ts))
    back = m.solve_diffrax(s, T, 0.0, saveat=diffrax.SaveAt(ts=[T / 2, T / 4]))
    assert back.ts.tolist() == [T / 2, T / 4]
    case = make_case("gravity-wave", nx=16, ny=16)  # float32: T (1 + 1e-12) is T
    T32 = float(np.float32(2 * case.model.max_stable_dt(case.state, 0.5)))
    sol = case.model.solve_diffrax(
        case.state, 0.0, T32, saveat=diffrax.SaveAt(ts=[T32 * (1 + 1e-12)])
    )
    assert sol.ts.dtype == jnp.float32 and float(sol.ts[0]) == T32


def test_shared_time_stepping_keeps_a_float32_state_in_float32():
    """With x64 on, the shared ``advance``/``integrate`` failed on a float32 state with a
    NumPy float64 ``dt`` (lax.scan: 'carry input ... float32[3] ... output ... float64[3]'),
    and ``integrate_diffrax`` returned float64 ``ys`` and ``ts`` for a float32 ``y0`` with
    Python-float times or ``SaveAt(ts=[...])`` (``model.solve_diffrax`` casts them itself).
    Times are taken in the state's dtype, as the model takes them in its grid's."""
    from physjax.solvers import advance, integrate, integrate_diffrax, ssprk3_step

    def rhs(y, t):
        return {"a": -y["a"], "b": -2 * y["b"]}

    def step(y, t, dt):
        return ssprk3_step(rhs, y, t, dt)

    y0 = {"a": jnp.ones(3, jnp.float32), "b": jnp.ones((), jnp.float32)}
    ref = advance(step, y0, jnp.float32(0), jnp.float32(0.1), 4)
    out = advance(step, y0, np.float64(0), np.float64(0.1), 4)
    frames = integrate(step, y0, 0.0, np.float64(0.1), 2, 2)
    for tree in (out, frames):
        assert {a.dtype for a in jax.tree.leaves(tree)} == {jnp.dtype("float32")}
    assert _max_diff(out, ref) == 0 and _max_diff(jax.tree.map(lambda a: a[-1], frames), ref) == 0
    saveat = diffrax.SaveAt(ts=[0.0, 0.5, 1.0])
    for t0, t1 in ((0.0, 1.0), (np.float64(0), np.float64(1))):
        sol = integrate_diffrax(rhs, y0, t0, t1, saveat=saveat, dt0=np.float64(0.1))
        assert sol.ts.dtype == jnp.float32 and sol.ys["a"].dtype == jnp.float32
        assert float(sol.ys["b"][-1]) == pytest.approx(np.exp(-2.0), rel=1e-5)
    y64 = jax.tree.map(lambda a: a.astype(jnp.float64), y0)
    sol = integrate_diffrax(rhs, y64, 0.0, 1.0, saveat=saveat)
    assert sol.ys["a"].dtype == jnp.float64 and float(sol.ys["b"][-1]) == pytest.approx(
        np.exp(-2.0), rel=1e-6
    )


def test_shared_integrate_diffrax_checks_its_tolerances():
    """``integrate_diffrax(..., rtol=-1.0)`` ran without a word and returned e^-1 9e-5 off
    (3 steps); NaN or zero tolerances failed inside diffrax after compiling.
    ``model.solve_diffrax`` checked them already; the shared function now does too."""
    from physjax.solvers import integrate_diffrax

    def rhs(y, t):
        return -y

    for kw, bad in (({"rtol": -1.0}, "rtol"), ({"atol": NAN}, "atol"), ({"rtol": 0.0}, "rtol")):
        with pytest.raises(
            ValueError, match=rf"^{bad} must be a finite number > 0 \(a tolerance\)"
        ):
            integrate_diffrax(rhs, jnp.ones(3), 0.0, 1.0, **kw)
    sol = integrate_diffrax(rhs, jnp.ones(3), 0.0, 1.0, rtol=np.float32(1e-8), atol=1e-10)
    assert abs(float(sol.ys[-1, 0]) - np.exp(-1.0)) <= 1e-8


def test_shared_integrate_diffrax_checks_its_times():
    """``integrate_diffrax(rhs, y0, 0.0, nan)`` returned ``y0`` unchanged without a word,
    and ``t1=inf``, a float64 ``t1`` beyond float32's range for a float32 state, ``dt0=0``
    or a ``dt0`` pointing away from ``t1`` stopped with diffrax's ``EquinoxRuntimeError``
    after compiling. ``model.solve_diffrax`` checked them already; the shared function now
    does too, naming the argument."""
    from physjax.solvers import integrate_diffrax

    def rhs(y, t):
        return -y

    y0 = jnp.ones(3, jnp.float32)
    for args, kw, match in (
        ((0.0, NAN), {}, r"^t1 must be a finite number, got nan"),
        ((-INF, 1.0), {}, r"^t0 must be a finite number, got -inf"),
        ((0.0, "1"), {}, r"^t1 must be a finite number, got '1'"),
        ((0.0, np.ones(2)), {}, r"^t1 must be a finite number"),
        ((0.0, 1e39), {}, r"^t1 must be finite in the state's dtype float32, got 1e\+39"),
        ((0.0, 1.0), {"dt0": 0.0}, r"^dt0 must be a nonzero number with the sign of t1 - t0"),
        ((0.0, 1.0), {"dt0": -0.1}, r"^dt0 must be a nonzero number with the sign of t1 - t0"),
        ((1.0, 0.0), {"dt0": 0.1}, r"^dt0 must be a nonzero number with the sign of t1 - t0"),
    ):
        with pytest.raises(ValueError, match=match):
            integrate_diffrax(rhs, y0, *args, **kw)
    # backwards in time with a negative dt0, and traced times, still run
    sol = integrate_diffrax(rhs, y0, 1.0, 0.0, dt0=-0.1)
    assert float(sol.ys[-1, 0]) == pytest.approx(np.e, rel=1e-5)
    sol = jax.jit(lambda t1: integrate_diffrax(rhs, y0, 0.0, t1).ys)(1.0)
    assert float(sol[-1, 0]) == pytest.approx(np.exp(-1.0), rel=1e-5)


def test_diffrax_options_of_the_wrong_type_are_refused_by_name(adjust):
    """``solve_diffrax(..., solver="tsit5")`` failed inside diffrax with ``'str' object has
    no attribute 'term_structure'``, ``saveat=[0.0, 1.0]`` with ``'list' object has no
    attribute 'subs'`` and ``adjoint="backsolve"`` with ``... no attribute 'loop'``; the
    shared ``integrate_diffrax`` likewise. Each is now a ``TypeError`` naming the argument
    and the diffrax type it takes, raised before anything compiles."""
    from physjax.solvers import integrate_diffrax

    model, state, _ = adjust
    for name, value, kind in (
        ("solver", "tsit5", "AbstractSolver"),
        ("saveat", [0.0, 60.0], "SaveAt"),
        ("stepsize_controller", 1e-6, "AbstractStepSizeController"),
        ("adjoint", "backsolve", "AbstractAdjoint"),
    ):
        match = rf"^{name} must be None or a diffrax\.{kind} such as diffrax\."
        with pytest.raises(TypeError, match=match):
            model.solve_diffrax(state, 0.0, 60.0, **{name: value})
        with pytest.raises(TypeError, match=match):
            integrate_diffrax(lambda y, t: -y, jnp.ones(3), 0.0, 1.0, **{name: value})
    # None is each argument's default, and diffrax objects pass
    sol = integrate_diffrax(
        lambda y, t: -y,
        jnp.ones(3),
        0.0,
        1.0,
        solver=diffrax.Dopri5(),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=None,
        adjoint=diffrax.RecursiveCheckpointAdjoint(),
    )
    assert float(sol.ys[-1, 0]) == pytest.approx(np.exp(-1.0), rel=1e-5)


def test_time_spans_the_model_dtype_cannot_hold_are_refused(adjust):
    """Times are held in the model's dtype, and float32 times 1e9 s from the origin are
    64 s apart: ``solve_diffrax(state, 1e9, 1e9 + 30)`` of a float32 model took no step
    and returned the initial state as the state at t1, and ``integrate_diffrax`` from 1e9
    to 1e9 + 100 integrated over 128. A span moved by more than 0.1% is now refused."""
    from physjax.solvers import integrate_diffrax

    c = make_case("geostrophic-adjustment", nx=16, ny=16)  # float32
    with pytest.raises(
        ValueError,
        match=r"^t0=1000000000.0 and t1=1000000030.0 are 1000000000.0 and 1000000000.0 in "
        r"the state's dtype float32, a span t1 - t0 of 0.0 s instead of 30.0 s: count",
    ):
        c.model.solve_diffrax(c.state, 1e9, 1e9 + 30.0)
    with pytest.raises(ValueError, match=r"a span t1 - t0 of 128.0 instead of 100.0: count"):
        integrate_diffrax(lambda y, t: -y, jnp.ones(3, jnp.float32), 1e9, 1e9 + 100.0)
    # spans float32 holds still run, and float64 holds these times: the same solve as from 0
    sol = c.model.solve_diffrax(c.state, 1e3, 1e3 + 30.0)
    assert float(jnp.max(jnp.abs(sol.ys.h[-1] - c.state.h))) > 0
    model, state, _ = adjust
    late, early = (model.solve_diffrax(state, t, t + 600.0) for t in (1e9, 0.0))
    assert _max_diff(late.ys, early.ys) <= 1e-9, _max_diff(late.ys, early.ys)


@pytest.mark.multidevice
def test_solve_diffrax_on_a_mesh_that_reaches_max_steps_raises_without_gathering(adjust):
    """diffrax's own check of a failed solve (``throw=True``: ``eqx.error_if`` on the whole
    solution) ran its callback on device 0 alone (XLA moving the sharded frames there), and
    a solve on a mesh that reached ``max_steps`` left the other devices waiting at the
    next collective until XLA aborted the process (after 40 s). The error is now raised
    inside ``shard_map`` on every device's block, as ``physjax.parallel.error_if`` does."""
    m, s, dt = adjust
    mesh = make_mesh((2, 2))

    def solve(st, max_steps):
        return m.solve_diffrax(st, 0.0, 4 * dt, mesh=mesh, max_steps=max_steps).ys

    # checked first, without running it: the old callback was pinned to one device
    # ("{maximal device=0}"), and running it aborted the process
    assert "maximal" not in jax.jit(solve, static_argnums=1).lower(s, 2).as_text()
    ok = m.solve_diffrax(s, 0.0, 4 * dt, mesh=mesh, max_steps=50)
    assert _max_diff(ok.ys, m.solve_diffrax(s, 0.0, 4 * dt).ys) <= 1e-12
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        jax.block_until_ready(solve(s, 2))
    batch = jax.tree.map(lambda a: jnp.stack([a, a]), s)  # under vmap too
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        jax.block_until_ready(jax.vmap(lambda st: solve(st, 2))(batch))
    failed = m.solve_diffrax(s, 0.0, 4 * dt, mesh=mesh, max_steps=2, throw=False)
    assert failed.result != diffrax.RESULTS.successful
    with pytest.raises(RuntimeError, match=r"^solve_diffrax failed before t1 = [\d.]+ s after 2 "):
        m.solve_diffrax(s, 0.0, 4 * dt, mesh=mesh, max_steps=2)  # eagerly: raised in Python
    dense = m.solve_diffrax(s, 0.0, 4 * dt, mesh=mesh, saveat=diffrax.SaveAt(dense=True))
    assert dense.ys is None and dense.evaluate(dt).h.shape == m.grid.shape


@pytest.mark.multidevice
def test_backsolve_gradient_on_a_mesh_raises_when_its_backward_solve_fails():
    """A solve on a mesh runs diffrax with ``throw=False`` (its error raised on every
    device's block instead), and ``diffrax.BacksolveAdjoint``'s backward solves took that
    ``throw=False``: a backward solve that reached ``max_steps`` gave a gradient 4.8% off
    (-2.384e5 against -2.503e5 at 16², 6 steps of 0.5 CFL) without a word, where one device
    raises. They now raise on
    the mesh as well; the gradient of a solve that succeeds is unchanged."""
    c = make_case("geostrophic-adjustment", nx=8, ny=8, precision="float64", drag=1e-5)
    m, s = c.model, c.state
    t1 = 3 * m.max_stable_dt(s, 0.5)
    mesh = make_mesh((2, 2))
    n = int(m.solve_diffrax(s, 0.0, t1).stats["num_steps"])  # the backward solve needs more

    def loss(r, mesh, max_steps="default"):
        model = eqx.tree_at(lambda q: q.drag, m, r)
        adjoint = diffrax.BacksolveAdjoint()
        sol = model.solve_diffrax(s, 0.0, t1, mesh=mesh, adjoint=adjoint, max_steps=max_steps)
        return jnp.sum(sol.ys.u[-1] ** 2)

    r0 = jnp.asarray(1e-5)
    one = float(jax.grad(loss)(r0, None))
    assert abs(float(jax.grad(loss)(r0, mesh)) - one) <= 1e-6 * abs(one)
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        jax.block_until_ready(jax.grad(loss)(r0, mesh, n))


_TRACED_SAVE_TIMES_SCRIPT = """
import jax
jax.config.update("jax_enable_x64", True)
import diffrax, jax.numpy as jnp
from physjax.parallel import make_mesh
from physjax.solvers.shallow_water import make_case

c = make_case("geostrophic-adjustment", nx=8, ny=8, precision="float64")
m, s, mesh = c.model, c.state, make_mesh((2, 2))
t1 = 3 * m.max_stable_dt(s, 0.5)


@jax.jit
def solve(t1, ts):
    return m.solve_diffrax(s, 0.0, t1, saveat=diffrax.SaveAt(ts=ts), mesh=mesh).ys.h


ts = jnp.array([0.0, t1])
ref = m.solve_diffrax(s, 0.0, t1, saveat=diffrax.SaveAt(ts=ts)).ys.h
ok = float(jnp.max(jnp.abs(solve(t1, ts) - ref)))
print("equal to one device:", ok <= 1e-12)
for bad in ([0.0, 2 * t1], [t1, 0.0]):
    try:
        jax.block_until_ready(solve(t1, jnp.array(bad)))
    except Exception as e:
        print("raised:", "saveat.ts must lie between t0 and t1" in str(e))
try:
    jax.block_until_ready(jax.jit(lambda d: m.solve_diffrax(s, 0.0, t1, dt0=d, mesh=mesh).ys)(-t1))
except Exception as e:
    print("dt0 raised:", "dt0 must have the sign of t1 - t0" in str(e))
"""


@pytest.mark.multidevice
def test_traced_times_diffrax_refuses_on_a_mesh_raise_rather_than_abort():
    """With ``t1`` or ``SaveAt(ts=...)`` traced (inside ``jit``) they cannot be checked
    before the solve, and diffrax's own check (``eqx.error_if`` on ``ts``) ran its callback
    on device 0 alone: a time outside the span, or out of order, left the other devices
    waiting at the next collective until XLA aborted the process (after 40 s). They are now
    checked on every device's block; run in a child process, which the old code killed."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TRACED_SAVE_TIMES_SCRIPT)],
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:3] == ["equal to one device: True"] + ["raised: True"] * 2
    # a traced dt0 of the wrong sign fell to diffrax's check on device 0 alone in the same way
    assert done.stdout.split("\n")[3] == "dt0 raised: True"


@pytest.mark.multidevice
def test_solve_diffrax_on_a_mesh_compiles_once(adjust, compilations):
    """The error check of a solve on a mesh (``throw=True``, the default) ran an eager
    ``jax.shard_map`` of a new function, which compiled its body again at every call: 23
    programs and 0.7 s for a 16² solve that itself takes 0.03 s, at every call of a loop.
    A second call now compiles nothing, and still raises when the solve fails."""
    m, s, dt = adjust
    mesh = make_mesh((2, 2))
    first = m.solve_diffrax(s, 0.0, 2 * dt, mesh=mesh)
    with compilations() as seen:
        again = m.solve_diffrax(s, 0.0, 2 * dt, mesh=mesh)
        jax.block_until_ready(again.ys)
    assert seen == []
    assert _max_diff(again.ys, first.ys) == 0
    with pytest.raises(Exception, match=r"maximum number of solver steps was reached"):
        jax.block_until_ready(m.solve_diffrax(s, 0.0, 2 * dt, mesh=mesh, max_steps=1).ys)


def test_a_python_number_set_with_tree_at_is_no_static_value_of_a_float64_run(adjust, compilations):
    """A parameter set with eqx.tree_at as a Python number is taken as an array of the model's
    dtype by every method; in a float64 model it was not (np.dtype("float64") == None is
    True, so the number passed for float64), entered the compiled run as a static value,
    and every new value (a sweep over gravity) compiled the run again, as no float32 model
    did. A new value now compiles nothing and runs as the same value given as an array."""
    m, s, dt = adjust

    def final(g):
        return _last(eqx.tree_at(lambda mm: mm.gravity, m, g).run(s, dt=dt, n_steps=2))

    final(9.0)
    with compilations() as seen:
        got = final(9.5)
        jax.block_until_ready(got)
    assert seen == []
    assert _max_diff(got, final(jnp.asarray(9.5, jnp.float64))) == 0


@pytest.mark.multidevice
def test_runs_where_numpy_dtype_promotion_is_strict(adjust):
    """Code that sets jax_numpy_dtype_promotion="strict" (JAX's setting that refuses
    implicit promotions) could not run the model: every fixed-step run stopped with
    TypePromotionError on the times t0 + k dt (an integer step count times a float), and
    every run on a mesh on the global row index (int32 block offset + int64 index). The
    conversions are now written out; the results are those of standard promotion."""
    m, s, dt = adjust
    strips = ShallowWater(m.grid, gravity=m.gravity, coriolis=m.coriolis, strip_rows=6)
    mesh = make_mesh((2, 2))

    def runs():
        return (
            _last(m.run(s, dt=dt, n_steps=4, save_every=2)),
            strips.advance(s, t0=0.0, dt=dt, n_steps=5),
            m.run(s, dt=dt, n_steps=2, mesh=mesh).states,
            m.solve_diffrax(s, 0.0, 2 * dt, mesh=mesh).ys,
        )

    standard = runs()
    with jax.numpy_dtype_promotion("strict"):
        strict = runs()
    assert _max_diff(strict, standard) == 0


@pytest.mark.slow
@pytest.mark.multidevice
def test_solve_diffrax_on_a_mesh_gathers_no_field(adjust):
    """diffrax's default error norm (``optimistix.rms_norm``) flattens each field, and on a
    mesh that splits x XLA did that by gathering every field of the state whole onto every
    device at every step (three all-gathers of f64[16,16] per step on a 1×4 mesh: the full
    16² field, N² memory on each device). The controller of a solve on a mesh now takes
    the same norm reduced in place: each device sums its block and only scalars travel."""
    m, s, dt = adjust
    mesh = make_mesh((1, 4))
    solve = jax.jit(lambda st: m.solve_diffrax(st, 0.0, 4 * dt, mesh=mesh, max_steps=8).ys)
    text = solve.lower(s).compile().as_text()
    assert not re.findall(r"\S+ all-gather\(", text)
    # the norms: scalar all-reduces, no field-sized one
    assert not re.findall(r"f64\[\d+,\d+\]\S* all-reduce\(", text)


def test_a_pid_controller_on_a_mesh_keeps_its_settings_and_reduces_in_place():
    """A controller of the user's gets the in-place norm on a mesh (alone or inside a
    ``ClipStepSizeController``) and keeps everything else; a norm of the user's is kept.
    The in-place norm is diffrax's default norm's value, and its derivative at 0 is 0."""
    from physjax.solvers._time_stepping import blockwise_rms_norm, controller_for_sharded_fields

    pid = diffrax.PIDController(rtol=1e-5, atol=1e-7, pcoeff=0.3)
    new = controller_for_sharded_fields(pid)
    assert new.norm is blockwise_rms_norm and (new.rtol, new.atol, new.pcoeff) == (1e-5, 1e-7, 0.3)
    clip = controller_for_sharded_fields(diffrax.ClipStepSizeController(pid))
    assert clip.controller.norm is blockwise_rms_norm
    own = diffrax.PIDController(rtol=1e-5, atol=1e-7, norm=jnp.linalg.norm)
    assert controller_for_sharded_fields(own) is own
    tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.array([[1.5, -2.0]])}
    np.testing.assert_allclose(blockwise_rms_norm(tree), pid.norm(tree), rtol=1e-6)
    zero = jax.tree.map(jnp.zeros_like, tree)
    assert all(
        float(jnp.sum(jnp.abs(g))) == 0 for g in jax.tree.leaves(jax.grad(blockwise_rms_norm)(zero))
    )


@pytest.mark.multidevice
def test_solve_diffrax_on_a_mesh_does_not_compile_again_for_new_tolerances(compilations):
    """On a mesh the solve builds its own controller (with the in-place norm); its
    tolerances must be arrays like those of one device's, or every new rtol of a tolerance
    study compiles the whole solve again (16² float32 on 2×2: 4 s and 7 compilations a
    call, 0.05 s once compiled)."""
    from physjax.solvers._time_stepping import blockwise_rms_norm, default_controller

    pid = default_controller(1e-3, 1e-6, norm=blockwise_rms_norm, dtype=jnp.float32)
    assert isinstance(pid.rtol, jax.Array) and pid.rtol.dtype == jnp.float32
    c = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float32")
    m, s = c.model, c.state
    mesh, t1 = make_mesh((2, 2)), 4 * float(m.max_stable_dt(c.state, 0.5))
    steps = [int(m.solve_diffrax(s, 0.0, t1, mesh=mesh, rtol=1e-3, atol=1e-6).stats["num_steps"])]
    with compilations() as seen:
        for rtol in (2e-3, 1e-5):
            sol = m.solve_diffrax(s, 0.0, t1, mesh=mesh, rtol=rtol, atol=1e-6)
            steps.append(int(sol.stats["num_steps"]))
    assert seen == [], seen
    assert steps[2] > steps[0], steps  # the tolerance acts


@pytest.mark.multidevice
def test_checking_the_frames_of_a_solve_on_a_mesh_gathers_no_frame():
    """After an eager ``solve_diffrax`` the saved frames are checked for NaN/Inf and a dry
    layer; each frame was flattened first (``reshape(n, -1)``), which on a mesh splitting
    x gathered every saved frame whole onto every device (pred[10,32,32] per field for ten
    32² frames on 1×4). Each frame is now reduced over its own axes, and the flags are
    those of the old check."""
    from physjax.solvers.shallow_water._model import _bad_saved_frames

    mesh = make_mesh((1, 4))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, None, "x"))
    h = np.full((5, 8, 8), 10.0)
    h[1, 3, 5], h[3, 0, 0], h[4] = NAN, -1.0, NAN  # frame 4 not reached (t = inf): sound
    frames = ShallowWaterState(*(jax.device_put(a, split) for a in (h, h * 0, h * 0)))
    ts = jnp.array([1.0, 2.0, 3.0, 4.0, INF])
    text = _bad_saved_frames.lower(ts, frames).compile().as_text()
    assert not re.findall(r"\S+ all-gather\(", text)
    bad, dry = _bad_saved_frames(ts, frames)
    assert bad.tolist() == [False, True, False, False, False]
    assert dry.tolist() == [False, False, False, True, False]


class _RecordingNumpy:
    """numpy, with ``asarray``/``array`` recording the arrays they are given (by id)."""

    def __init__(self, watched):
        self.watched = {id(a): name for name, a in watched.items()}
        self.read = []

    def __getattr__(self, name):
        return getattr(np, name)

    def asarray(self, a, *args, **kwargs):
        if id(a) in self.watched:
            self.read.append(self.watched[id(a)])
        return np.asarray(a, *args, **kwargs)

    array = asarray


def test_state_checks_read_scalars_not_fields(monkeypatch):
    # run, advance, max_stable_dt and check_dt checked the state by copying h, u and v
    # whole to the host (3 × 64 MB at 4096² float32, and impossible for arrays spread
    # over the processes of a multi-host run); they now bring back a few scalars
    from physjax.solvers.shallow_water import _model

    c = make_case("wind-gyre", nx=16, ny=16, precision="float32")
    m, s = c.model, c.state
    rec = _RecordingNumpy({"h": s.h, "u": s.u, "v": s.v})
    monkeypatch.setattr(_model, "np", rec)
    dt = m.max_stable_dt(s, 0.5)
    m.check_dt(s, dt)
    m.advance(s, t0=0.0, dt=dt, n_steps=1)
    m.run(s, dt=dt, n_steps=1)
    assert rec.read == []
    monkeypatch.undo()
    # and the messages keep their counts and values
    bad = ShallowWaterState(h=s.h.at[1:3, 2].set(jnp.inf), u=s.u.at[0, 0].set(jnp.nan), v=s.v)
    with pytest.raises(ValueError, match=r"^state\.h must be finite everywhere, got 2 NaN/Inf"):
        m.check_dt(bad, dt)
    dry = ShallowWaterState(h=s.h.at[3, 3].set(-0.25), u=s.u, v=s.v)
    with pytest.raises(ValueError, match=r"got a minimum of -0\.25 m$"):
        m.run(dry, dt=dt, n_steps=1)
    leak = ShallowWaterState(h=s.h, u=s.u.at[5, 0].set(-0.125), v=s.v)
    with pytest.raises(ValueError, match=r"got max \|u\[:, 0\]\| = 0\.125 m/s"):
        m.run(leak, dt=dt, n_steps=1)


def test_state_check_reduction_on_a_mesh_all_reduces_scalars_only():
    # on a 2×2 mesh the check's reduction must not gather a field, nor a wall row
    from physjax.solvers.shallow_water import _model

    c = make_case("wind-gyre", nx=16, ny=16, precision="float32")
    s = shard(c.state, c.model.grid, make_mesh((2, 2)))
    for f in (_model._state_extremes, _model._nonfinite_counts):
        hlo = f.lower(s.h, s.u, s.v).compile().as_text()
        assert "all-gather" not in hlo and "all-to-all" not in hlo
        reduced = re.findall(r"= (\S+(?: \S+)*?) all-reduce\(", hlo)
        assert reduced
        assert all(re.search(r"\[\d", r) is None for r in reduced), reduced
    c.model.check_dt(s, c.model.max_stable_dt(s, 0.5))
    before = _model._state_extremes._cache_size()
    c.model.check_dt(s, c.model.max_stable_dt(s, 0.5))
    assert _model._state_extremes._cache_size() == before  # compiled once per shape/sharding


def test_parameter_field_checks_read_scalars_not_fields(monkeypatch):
    # every run, advance, max_stable_dt and check_dt checked bottom and wind_stress by
    # copying them whole to the host (np.asarray), three times per run call
    from physjax.solvers.shallow_water import _model

    c = make_case("wind-gyre", nx=16, ny=16, precision="float32")
    m, s = c.model, c.state
    m = eqx.tree_at(
        lambda m: m.bottom,
        m,
        jnp.full(m.grid.shape, 0.5, m.grid.dtype),
        is_leaf=lambda x: x is None,
    )
    tx, ty = m.wind_stress
    rec = _RecordingNumpy({"bottom": m.bottom, "tau_x": tx, "tau_y": ty})
    monkeypatch.setattr(_model, "np", rec)
    dt = m.max_stable_dt(s, 0.5)
    m.check_dt(s, dt)
    m.run(s, dt=dt, n_steps=1)
    assert rec.read == []
    monkeypatch.undo()
    bad = eqx.tree_at(lambda m: m.bottom, m, m.bottom.at[2:5, 1].set(jnp.nan))
    with pytest.raises(ValueError, match=r"^bottom must be finite everywhere, got 3 NaN/Inf"):
        bad.run(s, dt=dt, n_steps=1)
    # on a 2×2 mesh the reduction all-reduces scalars only
    tau = shard(tx, m.grid, make_mesh((2, 2)))
    hlo = _model._field_value_stats.lower(tau, dtype=np.dtype("float32")).compile().as_text()
    reduced = re.findall(r"= (\S+(?: \S+)*?) all-reduce\(", hlo)
    assert "all-gather" not in hlo and reduced
    assert all(re.search(r"\[\d", r) is None for r in reduced), reduced


def test_check_dt_and_run_reduce_the_state_once(monkeypatch):
    # check_dt reduced the state twice (its own check, then max_stable_dt's) and run three
    # times (run, check_dt, max_stable_dt): each a pass over h, u and v
    from physjax.solvers.shallow_water import _model

    c = make_case("wind-gyre", nx=16, ny=16, precision="float32")
    m, s = c.model, c.state
    dt = m.max_stable_dt(s, 0.5)
    calls = []
    reduce = _model._state_stats
    monkeypatch.setattr(_model, "_state_stats", lambda *a: calls.append(1) or reduce(*a))
    m.check_dt(s, dt)
    assert len(calls) == 1
    m.run(s, dt=dt, n_steps=1)
    assert len(calls) == 2
    # the limit is the same as max_stable_dt's
    limit = m.max_stable_dt(s)
    m.check_dt(s, limit)
    with pytest.raises(ValueError, match=r"breaks the CFL stability limit"):
        m.run(s, dt=limit * 1.01, n_steps=1)


def test_failed_solve_reads_the_dry_frame_s_least_h_not_the_frame(monkeypatch):
    # after an eager solve_diffrax failed, the message's "min ... m" of the dry frame was
    # np.nanmin of the frame copied whole to the host (np.asarray of ys.h[k]); it is now
    # reduced where the frames live, with the same value in the same message
    from physjax.solvers.shallow_water import _model

    g = Grid((16, 24), (1.6e6, 3.0e6), periodic=(False, True))
    _, x = g.mesh_coordinates(("centre", "centre"))
    m = ShallowWater(g, coriolis=0.0)
    s = m.initial_state(h=np.where(np.abs(x - 1.5e6) < 3e5, 100.0, 0.5))
    dt = float(m.max_stable_dt(s, 0.9))
    kept = m.solve_diffrax(s, 0.0, 400 * dt, max_steps=300, throw=False)
    least = float(np.nanmin(np.asarray(kept.ys.h[0])))
    assert least < 0

    class Recording:
        def __init__(self):
            self.read = []

        def __getattr__(self, name):
            return getattr(np, name)

        def asarray(self, a, *args, **kwargs):
            if isinstance(a, jax.Array) and a.ndim >= 2:
                self.read.append(a.shape)
            return np.asarray(a, *args, **kwargs)

        array = asarray

    rec = Recording()
    monkeypatch.setattr(_model, "np", rec)
    with pytest.raises(RuntimeError) as info:
        m.solve_diffrax(s, 0.0, 400 * dt, max_steps=300)
    monkeypatch.undo()
    assert rec.read == []
    assert re.match(
        rf"^solve_diffrax failed before t1 = 7\d+ s after 300 steps \(\d+ of them rejected\): "
        rf"the state saved at t = \d+ s \(frame 0 of 1\) holds a layer thickness h <= 0 "
        rf"\(min {re.escape(f'{least:g}')} m\): the layer ran dry",
        str(info.value),
    ), str(info.value)
    # on a 2×2 mesh only the scalar is all-reduced, no frame gathered
    h = shard(kept.ys, g, make_mesh((2, 2))).h
    assert float(_model._frame_least_h(h, 0)) == least
    hlo = _model._frame_least_h.lower(h, 0).compile().as_text()
    reduced = re.findall(r"= (\S+(?: \S+)*?) all-reduce\(", hlo)
    assert "all-gather" not in hlo and "all-to-all" not in hlo and reduced
    assert all(re.search(r"\[\d", r) is None for r in reduced), reduced


def _assimilation_problem(gyre):
    """The 16² wind-gyre with a bottom, and a loss of every frame of a 30-step run (a frame
    every 10 steps) of the kind 4D-Var minimises: weighted misfits of h, u and v."""
    m, s, dt = gyre
    g = m.grid
    y, x = g.mesh_coordinates(("centre", "centre"))
    bump = 20.0 * np.exp(-((x - x.mean()) ** 2 + (y - y.mean()) ** 2) / (0.2 * x.max()) ** 2)
    m = eqx.tree_at(lambda q: q.bottom, m, jnp.asarray(bump), is_leaf=lambda v: v is None)
    rng = np.random.default_rng(3)
    s = eqx.tree_at(lambda q: q.h, s, s.h + 0.1 * rng.standard_normal(s.h.shape))
    w = [jnp.asarray(rng.standard_normal((3,) + s.h.shape)) for _ in range(3)]

    def loss(state, model, mesh=None):
        st = model.run(state, dt=dt, n_steps=30, save_every=10, mesh=mesh).states
        mean = jnp.mean(state.h)
        return jnp.sum(w[0] * (st.h - mean)) + jnp.sum(w[1] * st.u) + jnp.sum(w[2] * st.v)

    return m, s, loss


def test_run_gradients_wrt_state_bottom_and_wind_match_finite_differences(gyre):
    """What 4D-Var and parameter estimation differentiate: the (checkpointed) gradient of
    a run with frames with respect to the initial h, u, v, the bottom and both components
    of the wind stress; each directional derivative equals a central finite difference."""
    m, s, loss = _assimilation_problem(gyre)
    gs, gm = jax.jit(jax.grad(loss, argnums=(0, 1)))(s, m)
    f = jax.jit(loss)
    rng = np.random.default_rng(4)
    fields = {
        "h": (lambda q: q.h, gs.h, True),
        "u": (lambda q: q.u, gs.u, True),
        "v": (lambda q: q.v, gs.v, True),
        "bottom": (lambda q: q.bottom, gm.bottom, False),
        "tau_x": (lambda q: q.wind_stress[0], gm.wind_stress[0], False),
        "tau_y": (lambda q: q.wind_stress[1], gm.wind_stress[1], False),
    }
    for name, (get, grad, of_state) in fields.items():
        d = rng.standard_normal(grad.shape)
        d[:, 0] *= name != "u"  # no flow through the walls
        d[0, :] *= name != "v"
        eps = 1e-4 * float(jnp.max(jnp.abs(get(s if of_state else m)))) or 1e-4

        def at(e, get=get, of_state=of_state, d=d):
            x = get(s if of_state else m) + e * d
            return f(eqx.tree_at(get, s, x), m) if of_state else f(s, eqx.tree_at(get, m, x))

        fd = (float(at(eps)) - float(at(-eps))) / (2 * eps)
        ana = float(jnp.sum(grad * d))
        assert ana != 0 and abs(ana - fd) <= 1e-6 * abs(fd), (name, ana, fd)


@pytest.mark.slow  # four gradients compiled: 15 s
@pytest.mark.multidevice
def test_run_gradients_on_a_mesh_and_under_vmap_equal_one_device(gyre):
    """The same gradients with the run split over a 2×2 mesh, and for an ensemble of two
    initial states under ``vmap``, equal the one-device gradients."""
    m, s, loss = _assimilation_problem(gyre)
    grad = jax.grad(loss, argnums=(0, 1))
    ref = grad(s, m)
    scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(ref))
    assert _max_diff(grad(s, m, make_mesh((2, 2))), ref) <= 1e-12 * scale
    other = eqx.tree_at(lambda q: q.h, s, s.h + 0.05)
    pair = jax.tree.map(lambda a, b: jnp.stack([a, b]), s, other)
    batched = jax.vmap(lambda st: grad(st, m)[0])(pair)
    for i, one in enumerate((ref[0], grad(other, m)[0])):
        assert _max_diff(jax.tree.map(lambda a, i=i: a[i], batched), one) <= 1e-12 * scale


@pytest.mark.slow  # four gradients of the model compiled: ~10 s
def test_run_and_advance_gradients_store_sqrt_n_states(gyre):
    """The temporary memory of the gradient of a 16² float64 run with respect to its initial
    state grew linearly with the steps: 2.9 MB for 25 steps, 42 MB for 400 (14.4×; 8.1 GB
    for 6400 steps at 64²). Checkpointed in blocks of ceil(√n) steps: ~√16 = 4×."""
    m, s, dt = gyre

    def temp(n, run):
        def loss(h):
            st = eqx.tree_at(lambda q: q.h, s, h)
            if run:
                return jnp.sum(m.run(st, dt=dt, n_steps=n).states.h ** 2)
            return jnp.sum(m.advance(st, t0=0.0, dt=dt, n_steps=n).h ** 2)

        compiled = jax.jit(jax.grad(loss)).lower(s.h).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    for run in (True, False):
        small, large = temp(25, run), temp(400, run)
        assert large < 4 * small, (run, small, large)


def test_max_stable_dt_counts_beta_in_the_rotation_limit():
    """On a beta-plane |f| reaches |f0| + |beta| Ly/2 at the walls: the rotation limit
    sqrt(3)/max|f| of SSP-RK3 (waves made slow by a tiny gravity), concrete and traced."""
    g = Grid((8, 8), (1e7, 1e7), periodic=(False, True), dtype="float64")
    f0, beta = 1e-4, 2e-11  # max |f| = 1e-4 + 2e-11 * 5e6 = 2e-4
    m = ShallowWater(g, gravity=1e-6, coriolis=f0, beta=beta)
    s = m.initial_state(np.full(g.shape, 100.0))
    expected = 3**0.5 / (f0 + beta * 1e7 / 2)
    assert m.max_stable_dt(s) == pytest.approx(expected, rel=1e-12)
    traced = jax.jit(lambda b: ShallowWater(g, gravity=1e-6, coriolis=f0, beta=b).max_stable_dt(s))(
        beta
    )
    assert float(traced) == pytest.approx(expected, rel=1e-12)


def test_geostrophic_adjustment_step_is_centred_in_a_non_square_domain():
    """The height step sits at the centre of a domain with Lx ≠ Ly."""
    case = make_case(
        "geostrophic-adjustment", nx=40, ny=20, precision="float64", Lx=2000e3, Ly=1000e3
    )
    grid = case.model.grid
    y, x = grid.mesh_coordinates(CENTRE)
    eta = np.asarray(case.state.h) - case.parameters["mean_depth"]
    assert eta.min() >= 0 and eta.max() > 5.0  # a 10 m step, sampled
    xc, yc = np.sum(x * eta) / eta.sum(), np.sum(y * eta) / eta.sum()
    # pristine: exactly the domain's centre; C3: a step centred at (500 km, 1000 km)
    assert abs(xc - 1000e3) <= 1.0 and abs(yc - 500e3) <= 1.0, (xc, yc)


def test_barotropic_instability_perturbation_lies_on_the_jet_axis():
    """The perturbation of the unstable jet lies on its axis, nothing at the walls."""
    c = make_case("barotropic-instability", nx=32, ny=32, precision="float64")
    h = np.asarray(c.state.h)
    bump = np.abs(h - h.mean(axis=1, keepdims=True)).max(axis=1)  # per row
    ny = h.shape[0]
    assert int(np.argmax(bump)) in (ny // 2 - 1, ny // 2), bump
    # at the walls, 1500 km = 6 jet widths from the axis, nothing (exp(-36) ~ 2e-16)
    assert bump[0] <= 1e-9 * bump.max() and bump[-1] <= 1e-9 * bump.max(), bump


def test_default_grid_of_the_channel_cases_is_nx_by_ny_as_documented():
    """The channel cases' default grids are nx × ny as documented."""
    # docs/shallow_water.md: zonal-jet 128x64, barotropic-instability 256x128 (nx x ny)
    for name, (ny, nx) in (("zonal-jet", (64, 128)), ("barotropic-instability", (128, 256))):
        case = make_case(name)
        assert case.state.h.shape == (ny, nx), (name, case.state.h.shape)
        assert (case.parameters["nx"], case.parameters["ny"]) == (nx, ny)


def test_a_gravity_wave_along_one_axis_is_built():
    """A gravity wave with one wavenumber zero is built, constant along that axis."""
    for mx, my in ((2, 0), (0, 3)):
        case = make_case("gravity-wave", nx=16, ny=16, precision="float64", mode_x=mx, mode_y=my)
        eta = np.asarray(case.state.h) - 100.0
        assert np.ptp(eta) > 0.015  # the 0.01 m wave (peak to peak 0.0185 at 16 cells)
        # constant along the axis with no wavenumber
        along = 0 if my == 0 else 1
        assert np.ptp(eta, axis=along).max() <= 1e-15


def test_wind_gyre_takes_its_boundary_parameter():
    """wind-gyre's `boundary` reaches the model; free-slip by default."""
    case = make_case("wind-gyre", nx=8, ny=8, boundary="no-slip")
    assert case.model.boundary == "no-slip" and case.parameters["boundary"] == "no-slip"
    assert make_case("wind-gyre", nx=8, ny=8).model.boundary == "free-slip"


def test_max_stable_dt_counts_the_flow_along_either_axis():
    """The CFL limit counts a flow along y as along x, eager and traced alike."""
    g = Grid((8, 8), (1.0e5, 1.0e5), periodic=(True, True), dtype="float64")
    m = ShallowWater(g, coriolis=0.0)
    h = np.full(g.shape, 10.0)
    fast = np.full(g.shape, 20.0)
    inv = math.sqrt(1 / g.dx**2 + 1 / g.dy**2)
    expected = math.sqrt(3) / (2 * (math.sqrt(9.81 * 10.0) + 20.0) * inv)  # SSP-RK3: L = √3
    along_x = m.max_stable_dt(m.initial_state(h, u=fast))
    along_y = m.max_stable_dt(m.initial_state(h, v=fast))
    assert along_x == pytest.approx(expected, rel=1e-12)
    assert along_y == pytest.approx(expected, rel=1e-12)
    # the eager (Python) limit equals the traced one
    traced = jax.jit(lambda s: m.max_stable_dt(s))(m.initial_state(h, v=fast))
    assert float(traced) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="breaks the CFL stability limit"):
        m.check_dt(m.initial_state(h, v=fast), 1.01 * expected)


def test_potential_vorticity_takes_f_at_the_corners_of_a_beta_plane():
    """PV at rest on a beta-plane is f at the corners' y over the depth."""
    ny, nx, ly = 8, 4, 8.0e5
    g = Grid((ny, nx), (ly, 4.0e5), periodic=(False, True), dtype="float64")
    f0, beta, depth = 1e-4, 2e-11, 50.0
    m = ShallowWater(g, coriolis=f0, beta=beta)
    q = np.asarray(m.potential_vorticity(m.initial_state(np.full(g.shape, depth))))
    y_corner = np.arange(ny) * (ly / ny)  # corner row j at y = j Δy (the south-west corners)
    expected = (f0 + beta * (y_corner - ly / 2)) / depth
    np.testing.assert_allclose(q, np.broadcast_to(expected[:, None], (ny, nx)), rtol=1e-12)


def test_solve_diffrax_uses_the_solver_given():
    """Three constant Euler steps of solve_diffrax are three forward-Euler steps of the
    model's right-hand side."""
    c = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64")
    m, s = c.model, c.state
    dt = float(m.max_stable_dt(s, 0.5))
    sol = m.solve_diffrax(
        s,
        0.0,
        3 * dt,
        solver=diffrax.Euler(),
        stepsize_controller=diffrax.ConstantStepSize(),
        dt0=dt,
    )
    y = s
    for k in range(3):
        y = jax.tree.map(lambda a, b: a + dt * b, y, m.rhs(y, k * dt))
    last = jax.tree.map(lambda a: a[-1], sol.ys)
    assert _max_diff(last, y) <= 1e-12 * max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(y))
    tsit5 = m.solve_diffrax(s, 0.0, 3 * dt, stepsize_controller=diffrax.ConstantStepSize(), dt0=dt)
    assert _max_diff(jax.tree.map(lambda a: a[-1], tsit5.ys), y) > 1e3 * _max_diff(last, y)


@pytest.mark.multidevice
def test_solve_diffrax_on_a_mesh_takes_the_tolerances_given():
    """On a mesh, solve_diffrax takes rtol and atol as given: the one-device steps and states."""
    c = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64")
    m, s = c.model, c.state
    t1 = 4 * float(m.max_stable_dt(s, 0.5))
    mesh = make_mesh((2, 2))
    for tol in (dict(rtol=1e-3, atol=1e-9), dict(rtol=1e-9, atol=1e-3)):
        ref = m.solve_diffrax(s, 0.0, t1, **tol)
        out = m.solve_diffrax(shard(s, m.grid, mesh), 0.0, t1, mesh=mesh, **tol)
        assert int(out.stats["num_steps"]) == int(ref.stats["num_steps"]), tol
        assert _max_diff(out.ys, ref.ys) <= 1e-10, tol
