"""Shallow-water model: conservation, balance, dispersion, convergence, sharding, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from physjax.grids import CENTRE, CORNER, X_FACE, Y_FACE, Grid
from physjax.parallel import make_mesh
from physjax.solvers import ShallowWater
from physjax.solvers.shallow_water import make_case
from physjax.solvers.shallow_water._cases import gravity_wave_mode


def _last(sol):
    return jax.tree.map(lambda a: a[-1], sol.states)


def test_mass_conserved_barotropic_instability():
    case = make_case("barotropic-instability", nx=64, ny=32, precision="float64")
    m, s = case.model, case.state
    dt = m.max_stable_dt(s, 0.5)
    sol = m.run(s, dt=dt, n_steps=1000, save_every=500)
    m0 = m.mass(s)
    drift = [
        abs(float((m.mass(jax.tree.map(lambda a, k=k: a[k], sol.states)) - m0) / m0))
        for k in range(2)
    ]
    assert max(drift) <= 1e-12
    # the run did something: the jet is meandering
    assert float(jnp.max(jnp.abs(sol.states.v[-1]))) > 1e-3


def test_mass_conserved_float32():
    case = make_case("geostrophic-adjustment", nx=32, ny=32, precision="float32")
    m, s = case.model, case.state
    sol = m.run(s, dt=m.max_stable_dt(s, 0.5), n_steps=400)
    assert sol.states.h.dtype == jnp.float32
    assert abs(float(m.mass(_last(sol)) / m.mass(s)) - 1) <= 2e-7


def test_float32_energy_is_summed_to_float32_round_off():
    # The same float32 values, summed by the float32 model and by a float64 one: a plain
    # float32 sum of ½ g h² over 32² cells was off by 1.3e-5 (geostrophic adjustment),
    # more than a step changes the energy; now a few units of float32 round-off.
    for name in ("geostrophic-adjustment", "barotropic-instability", "wind-gyre"):
        single = make_case(name, nx=32, ny=32, precision="float32")
        double = make_case(name, nx=32, ny=32, precision="float64")
        state = single.state
        wide = jax.tree.map(lambda a: jnp.asarray(np.asarray(a), jnp.float64), state)
        exact = float(double.model.energy(wide))
        assert single.model.energy(state).dtype == jnp.float32
        assert abs(float(single.model.energy(state)) / exact - 1) <= 4e-7


@pytest.mark.parametrize("scheme, order", [("ssprk3", 3.0), ("rk4", 5.0)])
def test_energy_drift_falls_at_scheme_order(scheme, order):
    """Measured 2.86 for SSP-RK3 (third order) and 4.96 for RK4: a fourth-order scheme's
    leading error is in the phase, so its energy error per step is of order dt⁶, not dt⁵."""
    case = make_case("geostrophic-adjustment", nx=32, ny=32, precision="float64")
    s = case.state
    m = ShallowWater(
        case.model.grid, gravity=case.model.gravity, coriolis=case.model.coriolis, scheme=scheme
    )
    e0 = float(m.energy(s))
    t_end = 6 * 3600.0
    dts, drifts = [], []
    for n in (40, 80, 160):
        dt = t_end / n
        sol = m.run(s, dt=dt, n_steps=n)
        drifts.append(abs(float(m.energy(_last(sol))) - e0) / e0)
        dts.append(dt)
    fitted = np.polyfit(np.log(dts), np.log(drifts), 1)[0]
    assert abs(fitted - order) <= 0.3, (fitted, drifts)


def _potential_enstrophy(model, state):
    """½ Σ h̄ q² ΔA at the corners, h̄ the four-cell mean there (doubly periodic grid)."""
    h = np.asarray(state.h)
    h_corner = 0.25 * (h + np.roll(h, 1, 0) + np.roll(h, 1, 1) + np.roll(h, (1, 1), (0, 1)))
    q = np.asarray(model.potential_vorticity(state))
    return 0.5 * np.sum(h_corner * q * q) * model.grid.cell_volume


def test_energy_is_lost_in_time_and_potential_enstrophy_is_not_conserved_in_space():
    """The scheme is Sadourny's energy-conserving one, not an enstrophy-conserving one
    (docs/shallow_water.md): after 20 000 s of a 30 m geostrophic adjustment at 16² the
    potential enstrophy is 1.6% of its initial excess over the resting layer's above where it
    began (0.62% at 32², not run here), the same to 1e-3 at half the step: a spatial error,
    not the time scheme's. The energy drifts down (SSP-RK3 damps), by less at half the step."""
    case = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64", step_height=30.0)
    m, s = case.model, case.state
    rest = m.initial_state(np.full(s.h.shape, float(s.h.mean())))
    z0, e0 = _potential_enstrophy(m, s), float(m.energy(s))
    anomaly = z0 - _potential_enstrophy(m, rest)
    t_end, gained, lost = 2.0e4, [], []
    for cfl in (0.2, 0.1):
        steps = int(np.ceil(t_end / m.max_stable_dt(s, cfl)))
        end = _last(m.run(s, dt=t_end / steps, n_steps=steps))
        gained.append((_potential_enstrophy(m, end) - z0) / anomaly)
        lost.append(e0 - float(m.energy(end)))
    assert 0.015 < gained[0] < 0.017 and abs(gained[1] / gained[0] - 1) < 1e-3, gained
    assert 0 < lost[1] < lost[0] / 4, lost


def test_zonal_jet_stays_steady():
    case = make_case("zonal-jet", nx=32, ny=32, precision="float64")
    m, s = case.model, case.state
    periods = 10
    t_end = periods * 2 * np.pi / 1e-4
    n = int(np.ceil(t_end / m.max_stable_dt(s, 0.8)))
    sol = m.run(s, dt=t_end / n, n_steps=n)
    h1 = _last(sol).h
    dh = float(jnp.max(s.h) - jnp.min(s.h))
    assert dh > 1.0  # a real jet, tens of metres of height difference
    assert float(jnp.max(jnp.abs(h1 - s.h))) / dh <= 1e-10
    # an unbalanced start (same jet, flat h) is far from steady
    s_bad = m.initial_state(jnp.full_like(s.h, 1000.0), s.u, s.v)
    h_bad = _last(m.run(s_bad, dt=t_end / n, n_steps=50)).h
    assert float(jnp.max(jnp.abs(h_bad - 1000.0))) / dh > 1e-3


def test_a_balanced_jet_has_the_mean_depth_asked_for_or_is_refused():
    # a strong jet: two passes of the mean shift left its mean at 1002.18 m, not 1000
    case = make_case("zonal-jet", nx=32, ny=16, precision="float64", jet_speed=100.0)
    assert abs(float(jnp.mean(case.state.h)) - 1000.0) <= 1e-9
    assert float(jnp.max(jnp.abs(case.model.rhs(case.state, 0.0).v))) <= 1e-15
    # a jet no thickness of that mean balances is refused: it was built with a row's
    # Newton solve unconverged, mean 875.7 m and max |dv/dt| 8.4e-3 m/s² (a third of f U)
    with pytest.raises(ValueError, match=r"jet_speed=250.0 gives no valid initial state: no "):
        make_case("zonal-jet", nx=32, ny=16, precision="float64", jet_speed=250.0)


WAVE_H, WAVE_G, WAVE_F = 100.0, 9.81, 1e-4


def _gravity_wave(grid_n):
    """The small (3, 2) gravity wave in float64: model, state, grid and its discrete mode."""
    case = make_case(
        "gravity-wave",
        nx=grid_n,
        ny=grid_n,
        precision="float64",
        mean_depth=WAVE_H,
        amplitude=1e-4,
        mode_x=3,
        mode_y=2,
    )
    m = case.model
    mode = gravity_wave_mode(
        m.grid, mean_depth=WAVE_H, gravity=WAVE_G, coriolis=WAVE_F, mode_x=3, mode_y=2
    )
    return m, case.state, m.grid, mode


def test_gravity_wave_frequency_matches_discrete_dispersion():
    H, g, f = WAVE_H, WAVE_G, WAVE_F
    m, s, grid, (k, l, omega_eig, _) = _gravity_wave(32)
    dx, dy = grid.dx, grid.dy
    omega_theory = np.sqrt(
        f**2 * np.cos(k * dx / 2) ** 2 * np.cos(l * dy / 2) ** 2
        + 4 * g * H * (np.sin(k * dx / 2) ** 2 / dx**2 + np.sin(l * dy / 2) ** 2 / dy**2)
    )
    assert abs(omega_eig - omega_theory) / omega_theory < 1e-12
    period = 2 * np.pi / omega_theory
    n_frames, per_frame = 40, 5
    dt = 2 * period / (n_frames * per_frame)
    sol = m.run(s, dt=dt, n_steps=n_frames * per_frame, save_every=per_frame)
    y, x = grid.mesh_coordinates(CENTRE)
    phase = np.exp(-1j * (k * x + l * y))
    c = np.array([np.mean((np.asarray(h) - H) * phase) for h in sol.states.h])
    angle = np.unwrap(np.angle(c))
    omega_measured = -np.polyfit(np.asarray(sol.ts), angle, 1)[0]
    assert abs(omega_measured - omega_theory) / omega_theory <= 1e-3
    # Sharper, and the amplitude too: the mode advances by SSP-RK3's amplification factor
    # R(-iω dt) per step, so frame j is c0 R^(5j) — to 3.5e-10 here. (1e-3 on the frequency
    # alone let a Coriolis term 4% off or gravity 0.15% off pass.)
    c0 = np.mean((np.asarray(s.h) - H) * phase)
    z = -1j * omega_theory * dt
    growth = (1 + z + z**2 / 2 + z**3 / 6) ** (per_frame * np.arange(1, n_frames + 1))
    assert np.max(np.abs(c - c0 * growth)) <= 1e-8 * abs(c0)


def _wave_error(grid_n, periods=2.0):
    """Relative error of the (3, 2) gravity-wave mode after ``periods`` periods against the
    continuous linear wave, with dt ∝ dx (a fixed CFL number); and the error predicted by
    the discrete dispersion relation with SSP-RK3's amplification factor."""
    H, g, f = WAVE_H, WAVE_G, WAVE_F
    m, s, grid, (k, l, omega_discrete, _) = _gravity_wave(grid_n)
    omega = np.sqrt(f**2 + g * H * (k**2 + l**2))  # the continuous equations
    t_end = periods * 2 * np.pi / omega
    n_steps = int(np.ceil(t_end / (0.2 * grid.dx / np.sqrt(g * H))))
    final = _last(m.run(s, dt=t_end / n_steps, n_steps=n_steps))
    y, x = grid.mesh_coordinates(CENTRE)
    phase = np.exp(-1j * (k * x + l * y))
    c0 = np.mean((np.asarray(s.h) - H) * phase)
    c1 = np.mean((np.asarray(final.h) - H) * phase)
    z = -1j * omega_discrete * t_end / n_steps
    predicted = abs((1 + z + z**2 / 2 + z**3 / 6) ** n_steps - np.exp(-1j * omega * t_end))
    return grid.dx, abs(c1 - c0 * np.exp(-1j * omega * t_end)) / abs(c0), predicted


def test_gravity_wave_run_converges_to_the_continuous_wave_second_order():
    """Time-integrated: the run's wave against the continuous solution converges at order 2
    in space (RK3's error, with dt ∝ dx, falls at order 3)."""
    results = [_wave_error(n) for n in (16, 32, 64)]
    dxs, errs, predicted = (np.array(v) for v in zip(*results))
    order = np.polyfit(np.log(dxs), np.log(errs), 1)[0]
    assert abs(order - 2.0) <= 0.15, (order, errs)
    # and each error is the one the C-grid dispersion relation predicts (the order alone
    # passed with gravity 0.15% off: errors 0.608 / 0.152 / 0.031 against 0.617 / 0.161 / 0.041)
    np.testing.assert_allclose(errs, predicted, rtol=1e-6)  # 1.7e-9 here


def _manufactured(grid_n, walls, boundary):
    """Discrete tendencies of a smooth state vs the continuous ones. Velocities of 20 m/s and
    a viscosity of 5e6 m² s⁻¹ make the kinetic-energy, vorticity-flux and viscous terms each
    as large as the pressure gradient. With walls the state obeys the boundary condition
    (free slip: no normal flow, no vorticity; no slip: no flow) and the cells next to the
    walls are included; the wall faces themselves are held at zero and left out."""
    L, H, g, f0, nu = 1.0e6, 50.0, 9.81, 1e-4, 5e6
    grid = Grid((grid_n, grid_n), (L, L), periodic=not walls, dtype="float64")
    model = ShallowWater(grid, gravity=g, coriolis=f0, viscosity=nu, boundary=boundary)
    if not walls:
        k = 2 * np.pi / L

        def h(x, y):
            return H + 2.0 * jnp.sin(k * x) * jnp.cos(2 * k * y)

        def u(x, y):
            return 20.0 * jnp.cos(k * x + 0.3) * jnp.sin(k * y)

        def v(x, y):
            return -16.0 * jnp.sin(2 * k * x) * jnp.cos(k * y + 0.1)
    else:
        k = np.pi / L

        def h(x, y):
            return H + 2.0 * jnp.cos(k * x) * jnp.cos(2 * k * y)

        if boundary == "free-slip":

            def u(x, y):
                return 20.0 * jnp.sin(k * x) * jnp.cos(k * y)

            def v(x, y):
                return 16.0 * jnp.cos(k * x) * jnp.sin(k * y)
        else:

            def u(x, y):
                return 20.0 * jnp.sin(k * x) * jnp.sin(k * y)

            def v(x, y):
                return 16.0 * jnp.sin(k * x) * jnp.sin(2 * k * y)

    d = lambda fn, i: jax.grad(fn, argnums=i)

    def dh(x, y):
        return -(
            d(lambda a, b: h(a, b) * u(a, b), 0)(x, y) + d(lambda a, b: h(a, b) * v(a, b), 1)(x, y)
        )

    def bern(x, y):
        return g * h(x, y) + 0.5 * (u(x, y) ** 2 + v(x, y) ** 2)

    def zeta(x, y):
        return d(v, 0)(x, y) - d(u, 1)(x, y)

    def lap(fn, x, y):
        return d(d(fn, 0), 0)(x, y) + d(d(fn, 1), 1)(x, y)

    def du(x, y):
        return (f0 + zeta(x, y)) * v(x, y) - d(bern, 0)(x, y) + nu * lap(u, x, y)

    def dv(x, y):
        return -(f0 + zeta(x, y)) * u(x, y) - d(bern, 1)(x, y) + nu * lap(v, x, y)

    def at(fn, loc):  # compiled: op by op the nested derivatives took most of the test
        yy, xx = grid.mesh_coordinates(loc)
        values = jax.jit(jax.vmap(fn))(jnp.asarray(xx.ravel()), jnp.asarray(yy.ravel()))
        return values.reshape(yy.shape)

    state = model.initial_state(at(h, CENTRE), at(u, X_FACE), at(v, Y_FACE))
    tend = jax.jit(lambda s: model.rhs(s))(state)
    skip = (slice(None), slice(1 if walls else 0, None))  # the wall faces u[:, 0], v[0]
    errs = []
    for got, fn, loc, cut in (
        (tend.h, dh, CENTRE, (slice(None),) * 2),
        (tend.u, du, X_FACE, skip),
        (tend.v, dv, Y_FACE, skip[::-1]),
    ):
        ref = at(fn, loc)[cut]
        errs.append(float(jnp.max(jnp.abs(got[cut] - ref)) / jnp.max(jnp.abs(ref))))
    zeta_err = float(jnp.max(jnp.abs(model.relative_vorticity(state) - at(zeta, CORNER))))
    return grid.dx, errs, zeta_err


@pytest.mark.parametrize(
    "walls, boundary", [(False, "free-slip"), (True, "free-slip"), (True, "no-slip")]
)
def test_manufactured_solution_second_order(walls, boundary):
    """Measured orders (16-32-64), periodic / free slip / no slip: h 1.97 / 1.99 / 1.99,
    u 1.99 / 1.98 / 1.99, v 1.99 / 2.00 / 1.98, ζ 1.99 / 2.00 / 2.00. With a one-sided
    kinetic energy (first order) u and v fall to 1.04-1.50."""
    results = [_manufactured(n, walls, boundary) for n in (16, 32, 64)]
    dxs = np.array([r[0] for r in results])
    for var in range(3):
        errs = np.array([r[1][var] for r in results])
        order = np.polyfit(np.log(dxs), np.log(errs), 1)[0]
        assert abs(order - 2.0) <= 0.15, (var, order, errs)
    zerr = np.array([r[2] for r in results])
    assert abs(np.polyfit(np.log(dxs), np.log(zerr), 1)[0] - 2.0) <= 0.15, zerr


def test_no_slip_channel_flow_converges_second_order():
    """Plane Poiseuille flow between no-slip walls, driven by a uniform wind stress:
    u = F y (L - y) / (2 nu) with F = tau / (rho H). The model's steady state (its linear
    u-tendency solved for zero) converges to it at order 2, although the mirrored ghost row
    makes the viscous term of the row next to a wall inconsistent for a profile with
    curvature there (its tendency error stays 0.25 F at every ny): the usual supraconvergence
    of cell-centred wall conditions. Measured: errors 1.6e-2 / 4.0e-3 / 1.0e-3 at ny = 8 /
    16 / 32, order 2.00; the wall-row tendency of the exact profile 0.25 F at each ny."""
    length, nu, depth, rho, tau = 1.0e5, 1.0e3, 100.0, 1000.0, 0.1
    forcing = tau / (rho * depth)
    errs, wall_rows = [], []
    for ny in (8, 16, 32):
        grid = Grid((ny, 4), (length, 4 * length / ny), periodic=(False, True), dtype="float64")
        model = ShallowWater(
            grid,
            gravity=9.81,
            coriolis=0.0,
            viscosity=nu,
            boundary="no-slip",
            wind_stress=(np.full(grid.shape, tau), np.zeros(grid.shape)),
            density=rho,
        )
        h = jnp.full(grid.shape, depth)

        @jax.jit  # (op by op, the Jacobians of the three sizes took ~90 s)
        def tendency(u, model=model, h=h, shape=grid.shape):
            state = model.initial_state(h, jnp.broadcast_to(u[:, None], shape))
            return model.rhs(state).u[:, 0]

        zero = jnp.zeros(ny)
        matrix = jax.jit(jax.jacfwd(tendency))(zero)  # linear in u(y) with v = 0, h uniform
        u = np.linalg.solve(np.asarray(matrix), -np.asarray(tendency(zero)))
        y = grid.coordinates("y")
        exact = forcing / (2 * nu) * y * (length - y)
        errs.append(np.max(np.abs(u - exact)) / np.max(exact))
        wall_rows.append(float(tendency(jnp.asarray(exact))[0]) / forcing)
    order = np.polyfit(np.log([8, 16, 32]), -np.log(errs), 1)[0]
    assert abs(order - 2.0) <= 0.15, (order, errs)
    assert errs[-1] < 2e-3, errs
    np.testing.assert_allclose(wall_rows, 0.25, rtol=1e-6)  # documented, docs/shallow_water.md


def test_lake_at_rest_over_topography():
    grid = Grid((16, 24), (1e6, 1.5e6), periodic=(False, False), dtype="float64")
    yy, xx = grid.mesh_coordinates(CENTRE)
    bottom = 20.0 * np.exp(-((xx - 7e5) ** 2 + (yy - 5e5) ** 2) / (2e5) ** 2)
    model = ShallowWater(grid, coriolis=1e-4, beta=2e-11, bottom=bottom)
    s = model.initial_state(100.0 - bottom)
    sol = model.run(s, dt=200.0, n_steps=200)
    out = _last(sol)
    assert float(jnp.max(jnp.abs(out.u))) < 1e-12
    assert float(jnp.max(jnp.abs(out.v))) < 1e-12
    assert float(jnp.max(jnp.abs(out.h - s.h))) < 1e-10


@pytest.mark.multidevice
@pytest.mark.parametrize(
    "case_name, layout",
    [
        ("barotropic-instability", (4, 1)),
        ("barotropic-instability", (2, 2)),
        ("wind-gyre", (2, 2)),
        ("wind-gyre", (1, 4)),
        ("geostrophic-adjustment", (2, 2)),
    ],
)
def test_sharded_equals_single_device(case_name, layout):
    assert len(jax.devices()) >= 4
    case = make_case(case_name, nx=32, ny=32, precision="float64")
    m, s = case.model, case.state
    dt = m.max_stable_dt(s, 0.5)
    ref = m.run(s, dt=dt, n_steps=40, save_every=20)
    mesh = make_mesh(layout)
    out = m.run(s, dt=dt, n_steps=40, save_every=20, mesh=mesh)
    for a, b in zip(jax.tree.leaves(ref.states), jax.tree.leaves(out.states)):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-12 * max(1.0, float(jnp.max(jnp.abs(a))))
    h = out.states.h
    assert h.sharding.shard_shape(h.shape) == (2, 32 // layout[0], 32 // layout[1])
    assert len(h.sharding.device_set) == 4
    # chunked advance on the mesh matches too
    s1 = m.advance(s, t0=0.0, dt=dt, n_steps=40, mesh=mesh)
    assert float(jnp.max(jnp.abs(s1.h - ref.states.h[-1]))) <= 1e-12 * float(jnp.max(s.h))
    assert s1.h.sharding.shard_shape(s1.h.shape) == (32 // layout[0], 32 // layout[1])
    assert len(s1.h.sharding.device_set) == 4


def test_mesh_that_does_not_divide_grid_raises():
    case = make_case("geostrophic-adjustment", nx=30, ny=30, precision="float64")
    with pytest.raises(ValueError, match="mesh does not divide the grid: ny=30"):
        case.model.run(case.state, dt=10.0, n_steps=2, mesh=make_mesh((4, 1)))


def test_fixed_step_and_diffrax_agree():
    case = make_case("gravity-wave", nx=16, ny=16, precision="float64", amplitude=0.5)
    base = case.model
    m = ShallowWater(base.grid, gravity=base.gravity, coriolis=base.coriolis, scheme="rk4")
    s = case.state
    t1 = 3600.0
    n = 30
    fixed = _last(m.run(s, dt=t1 / n, n_steps=n))
    adaptive = m.solve_diffrax(s, 0.0, t1, rtol=1e-10, atol=1e-10, dt0=60.0)
    ad = jax.tree.map(lambda a: a[-1], adaptive.ys)
    scale = float(jnp.max(jnp.abs(s.u)))
    err = float(jnp.max(jnp.abs(fixed.u - ad.u))) / scale
    # RK4 at ω dt ≈ 0.9: global error 1.1e-7 relative; diffrax at rtol 1e-10 is far tighter
    assert err < 3e-7
    n2 = 60
    fixed2 = _last(m.run(s, dt=t1 / n2, n_steps=n2))
    err2 = float(jnp.max(jnp.abs(fixed2.u - ad.u))) / scale
    assert 13 < err / err2 < 19  # fourth order: half the dt, 16x smaller error (15.8)


def test_grad_wrt_drag_matches_finite_difference():
    case = make_case("geostrophic-adjustment", nx=16, ny=16, precision="float64")
    base = case.model
    s = case.state

    def loss(r):
        m = ShallowWater(base.grid, gravity=base.gravity, coriolis=base.coriolis, drag=r)
        out = _last(m.run(s, dt=300.0, n_steps=20))
        return jnp.sum(out.u**2 + out.v**2)

    r0 = 2e-5
    g = float(jax.grad(loss)(r0))
    eps = 1e-8
    fd = (float(loss(r0 + eps)) - float(loss(r0 - eps))) / (2 * eps)
    assert g < 0  # drag removes kinetic energy
    assert abs(g - fd) / abs(fd) < 1e-6


def test_vmap_over_ensemble_equals_loop():
    case = make_case("gravity-wave", nx=16, ny=16, precision="float64")
    m = case.model
    amps = jnp.array([0.5, 1.0, 2.0])
    h = 100.0 + amps[:, None, None] * (case.state.h - 100.0)
    states = type(case.state)(
        h=h, u=amps[:, None, None] * case.state.u, v=amps[:, None, None] * case.state.v
    )
    batched = jax.vmap(lambda st: m.advance(st, t0=0.0, dt=100.0, n_steps=10))(states)
    for i in range(3):
        one = m.advance(jax.tree.map(lambda a, i=i: a[i], states), t0=0.0, dt=100.0, n_steps=10)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(batched)):  # h, u and v
            assert float(jnp.max(jnp.abs(a - b[i]))) < 1e-12


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nx": 0}, "nx must be a positive integer"),
        ({"ny": -4}, "ny must be a positive integer"),
        ({"mean_depth": -10.0}, "mean_depth must be > 0"),
        ({"mean_depth": 0.0}, "mean_depth must be > 0"),
        (
            {"step_height": -200.0},
            r"^case 'geostrophic-adjustment' with step_height=-200\.0 gives no valid initial "
            r"state: layer thickness h must be > 0",
        ),
        ({"bogus": 1.0}, "unknown parameter"),
    ],
)
def test_bad_case_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_case("geostrophic-adjustment", precision="float64", **kwargs)


@pytest.mark.multidevice
def test_bad_input_is_refused_before_compiling(compilations):
    def _compilations(call, match=None):
        with compilations() as seen:
            if match is not None:
                with pytest.raises(ValueError, match=match):
                    call()
            else:
                call()
        return seen

    case = make_case("wind-gyre", nx=30, ny=16, precision="float64")
    m, s = case.model, case.state
    limit = m.max_stable_dt(s)  # compiled here, once
    calls = [  # each with the message that names its parameter
        (lambda: make_case("barotropic-instability", nx=0), r"nx must be a positive integer"),
        (lambda: make_case("barotropic-instability", ny=-3), r"ny must be a positive integer"),
        (lambda: make_case("wind-gyre", mean_depth=-5.0), r"mean_depth must be > 0 .* -5\.0"),
        (lambda: make_case("wind-gyre", mean_depth=0.0), r"mean_depth must be > 0 .* 0\.0"),
        (lambda: m.run(s, dt=1.5 * limit, n_steps=2), r"breaks the CFL stability limit"),
        (lambda: m.run(s, dt=-limit, n_steps=2), r"dt must be a finite number > 0"),
        (
            lambda: m.run(s, dt=0.5 * limit, n_steps=2, mesh=make_mesh((1, 4))),
            r"mesh does not divide the grid: nx=30 cannot be split into 4",
        ),
        (lambda: m.solve_diffrax(s, 0.0, float("nan")), r"t1 must be a finite number"),
    ]
    for k, (call, match) in enumerate(calls):
        assert _compilations(call, match) == [], k
    # the control: the same run with good input does compile
    assert _compilations(lambda: m.run(s, dt=0.5 * limit, n_steps=2))


def test_unknown_case_and_bad_dt():
    with pytest.raises(ValueError, match="unknown case 'nope'"):
        make_case("nope")
    case = make_case("gravity-wave", nx=16, ny=16, precision="float64")
    limit = case.model.max_stable_dt(case.state)
    with pytest.raises(ValueError, match="breaks the CFL stability limit"):
        case.model.run(case.state, dt=1.5 * limit, n_steps=2)
    with pytest.raises(ValueError, match="dt must be a finite number > 0"):
        case.model.run(case.state, dt=-1.0, n_steps=2)
    with pytest.raises(ValueError, match="n_steps=3 must be a multiple of save_every=2"):
        case.model.run(case.state, dt=1.0, n_steps=3, save_every=2)


@pytest.mark.multidevice
def test_mass_and_energy_of_a_sharded_state_gather_no_field():
    """``mass`` and ``energy`` sum about one reference depth, the first value of ``h``,
    taken as ``h.reshape(-1)[0]``: on a state split over a mesh that splits x, XLA
    flattened ``h`` by gathering it whole onto every device (an all-gather of f64[32,32]
    for a 32² state on 1×4, of [16,32] on 2×2) to read one number. It is now ``h[0, 0]``,
    the same value: one element travels, and the results are those of one device."""
    import re

    from physjax.parallel import shard

    c = make_case("geostrophic-adjustment", nx=32, ny=32, precision="float64")
    m, s = c.model, c.state
    split = shard(s, m.grid, make_mesh((1, 4)))
    for name in ("mass", "energy"):
        fn = jax.jit(lambda st, name=name: getattr(m, name)(st))
        assert not re.findall(r"\S+ all-gather\(", fn.lower(split).compile().as_text()), name
        assert float(fn(split)) == pytest.approx(float(getattr(m, name)(s)), rel=1e-14)


@pytest.mark.multidevice
@pytest.mark.parametrize("case", ["geostrophic-adjustment", "wind-gyre"])
def test_a_sharded_step_exchanges_one_ghost_layer_per_field_and_stage(case):
    """What docs/parallel.md says a sharded step sends: on a 2×2 mesh (periodic axes, or
    walls), each of the three SSP-RK3 stages exchanges h, u and v once per split axis and
    direction — at most 18 collective-permutes per axis, each one row or column of the
    local block with its corners — and nothing else: no gather, no all-reduce in the loop."""
    import re
    from collections import Counter

    c = make_case(case, nx=32, ny=32, precision="float64")
    m, s = c.model, c.state
    mesh = make_mesh((2, 2))
    dt = float(m.max_stable_dt(s, 0.5))
    advance = jax.jit(lambda st: m.advance(st, t0=0.0, dt=dt, n_steps=4, mesh=mesh))
    text = advance.lower(s).compile().as_text()
    sent = Counter(re.findall(r"= (\S+) collective-permute\(", text))
    rows = sum(n for shape, n in sent.items() if shape.startswith("f64[1,18]"))
    columns = sum(n for shape, n in sent.items() if shape.startswith("f64[16,1]"))
    assert 0 < rows <= 18 and 0 < columns <= 18 and rows + columns == sum(sent.values()), sent
    others = re.findall(r"\S+ (?:all-gather|all-reduce|all-to-all|reduce-scatter)\(", text)
    assert not others, others


def test_mass_and_energy_are_their_sums_over_cells_of_unequal_sides():
    """mass and energy had been tested as ratios, drifts and sharded against unsharded
    only, where a wrong constant factor cancels (a cell area dx² for dx dy went unseen):
    here they are checked against their definitions, summed by NumPy, on cells of
    8e4 × 1e5 m with a bottom."""
    from physjax.solvers import ShallowWaterState

    grid = Grid((8, 12), (8e5, 9.6e5), dtype="float64")
    rng = np.random.default_rng(3)
    h = 100 + rng.random(grid.shape)
    u, v, b = (rng.normal(size=grid.shape) for _ in range(3))
    g = 9.81
    model = ShallowWater(grid, gravity=g, coriolis=1e-4, bottom=jnp.asarray(b))
    state = ShallowWaterState(h=jnp.asarray(h), u=jnp.asarray(u), v=jnp.asarray(v))
    area = grid.dx * grid.dy
    assert grid.dx != grid.dy
    np.testing.assert_allclose(float(model.mass(state)), h.sum() * area, rtol=1e-14)
    # K at a centre: u² averaged over its two x faces (i and i+1), v² over its two y faces
    kinetic = 0.25 * (u**2 + np.roll(u, -1, 1) ** 2 + v**2 + np.roll(v, -1, 0) ** 2)
    energy = np.sum(h * kinetic + 0.5 * g * h**2 + g * h * b) * area
    np.testing.assert_allclose(float(model.energy(state)), energy, rtol=1e-13)


def test_wind_stress_is_divided_by_the_thickness_on_each_face():
    """du/dt gains τˣ/(ρ₀ h) with h the mean of the two cells the face separates (u on the
    west face, v on the south one). The tests with wind all had nearly uniform h, where a
    mutation taking h from the wrong neighbour went unseen; here h varies by 40%."""
    grid = Grid((8, 12), (8e5, 12e5), dtype="float64")
    yc, xc = (np.asarray(c) for c in grid.mesh_coordinates(("centre", "centre")))
    h = 100 + 40 * np.sin(2 * np.pi * xc / 12e5) + 10 * np.cos(2 * np.pi * yc / 8e5)
    rng = np.random.default_rng(3)
    tx, ty = 0.1 + 0.01 * rng.random(grid.shape), 0.05 + 0.01 * rng.random(grid.shape)
    rho = 1000.0
    windy = ShallowWater(grid, coriolis=1e-4, wind_stress=(tx, ty), density=rho)
    calm = ShallowWater(grid, coriolis=1e-4)
    u, v = 0.1 * rng.normal(size=grid.shape), 0.1 * rng.normal(size=grid.shape)
    s = windy.initial_state(h, u, v)
    d_w, d_c = windy.rhs(s), calm.rhs(s)
    h_u = 0.5 * (h + np.roll(h, 1, axis=1))  # the west face of cell (j, i)
    h_v = 0.5 * (h + np.roll(h, 1, axis=0))  # its south face
    np.testing.assert_allclose(d_w.u - d_c.u, tx / (rho * h_u), rtol=1e-10, atol=0)
    np.testing.assert_allclose(d_w.v - d_c.v, ty / (rho * h_v), rtol=1e-10, atol=0)
    np.testing.assert_array_equal(d_w.h, d_c.h)


def test_wind_gyre_density_divides_the_wind_stress():
    """The wind-gyre case's density (ρ₀, dividing the wind stress) reaches the model: a
    mutation that dropped it (the model then took the default 1025) passed every test, the
    one that set it giving the default. From rest on a flat layer the u tendency is the
    wind term alone: twice the density, half of it."""
    base = make_case("wind-gyre", nx=8, ny=8, precision="float64")
    heavy = make_case("wind-gyre", nx=8, ny=8, precision="float64", density=2050.0)
    assert float(heavy.model.density) == 2050.0
    du0, du1 = base.model.rhs(base.state).u, heavy.model.rhs(heavy.state).u
    assert float(jnp.abs(du0).max()) > 0
    np.testing.assert_allclose(du1, 0.5 * du0, rtol=1e-12, atol=0)


def test_a_jet_on_a_beta_plane_is_in_discrete_balance():
    """A jet on a beta-plane starts in discrete balance: dv/dt = 0 to round-off."""
    # every check so far used beta = 0 (zonal-jet's default) or a growth rate that a
    # wrong-signed beta in the balance passes; dv/dt = 0 exactly with beta too
    for name, extra in (
        ("zonal-jet", {"beta": 2e-11}),
        ("barotropic-instability", {"perturbation": 0.0}),  # beta 1.6e-11 by default
    ):
        case = make_case(name, nx=16, ny=32, precision="float64", **extra)
        assert float(case.model.beta) == case.parameters["beta"] > 0
        dv = float(jnp.max(jnp.abs(case.model.rhs(case.state, 0.0).v)))
        # measured 3.7e-17 / 2.2e-17 (pristine); C1 gives 2.7e-5 / 7.2e-5, C2 1.3e-5 (zonal-jet)
        assert dv <= 1e-14, (name, dv)
