"""Shallow-water physics in regimes the case tests leave out: Rossby waves on a beta-plane and
over a sloping bottom, Kelvin waves at a wall (both hemispheres), exact energy conservation
with topography, beta and walls, the forcing and damping terms against exact solutions, and
the sharpness of the stability limit."""

import jax
import numpy as np
import pytest

from physjax.grids import CENTRE, X_FACE, Y_FACE, Grid
from physjax.solvers import ShallowWater

GRAVITY, DEPTH, WIDTH = 9.81, 100.0, 2.0e6


def _channel_mode(k, f0, beta, slope, n=200):
    """The gravest Rossby mode of the continuous linear equations in a channel of width
    WIDTH, walls at y = 0 and WIDTH, f = f0 + β(y − y_mid), depth DEPTH − slope·(y − y_mid),
    for e^{ikx}: frequency ω (fields ∝ e^{i(kx − ωt)}) and the (u, η) profiles at n cell
    centres and v at the n + 1 faces, from a staggered finite-difference eigenproblem in y
    (second order: ω at n = 200 is 3e-5 from that at 800, its Richardson extrapolation from
    n = 100 and 200 returned here 2e-6)."""
    dy = WIDTH / n
    yc = (np.arange(n) + 0.5) * dy
    yf = np.arange(n + 1) * dy
    fc, ff = f0 + beta * (yc - WIDTH / 2), f0 + beta * (yf - WIDTH / 2)
    hc, hf = DEPTH - slope * (yc - WIDTH / 2), DEPTH - slope * (yf - WIDTH / 2)
    iu, ie, iv = np.arange(n), n + np.arange(n), 2 * n - 1 + np.arange(n + 1)  # iv: j = 1..n-1
    m = np.zeros((3 * n - 1, 3 * n - 1), complex)
    inner = np.arange(1, n)
    # du/dt = f v̄ − g ik η ; dη/dt = −(ik h u + δ_y(h v)) ; dv/dt = −f ū − g δ_y η
    m[iu[inner], iv[inner]] += 0.5 * fc[inner]
    m[iu[inner - 1], iv[inner]] += 0.5 * fc[inner - 1]
    m[iu, ie] = -GRAVITY * 1j * k
    m[ie, iu] = -hc * 1j * k
    m[ie[inner - 1], iv[inner]] += -hf[inner] / dy
    m[ie[inner], iv[inner]] += hf[inner] / dy
    m[iv[inner], iu[inner]] += -0.5 * ff[inner]
    m[iv[inner], iu[inner - 1]] += -0.5 * ff[inner]
    m[iv[inner], ie[inner]] += -GRAVITY / dy
    m[iv[inner], ie[inner - 1]] += GRAVITY / dy
    lam, vec = np.linalg.eig(m)
    omega = 1j * lam
    slow = np.flatnonzero(np.abs(omega) < 0.3 * abs(f0))
    i = slow[np.argmax(np.abs(omega[slow].real))]
    x = vec[:, i] / np.abs(vec[ie, i]).max()
    v = np.concatenate([[0], x[iv[inner]], [0]])
    if n > 100:  # Richardson extrapolation of the frequency
        omega_i = (4 * omega[i].real - _channel_mode(k, f0, beta, slope, n // 2)[0]) / 3
    else:
        omega_i = omega[i].real
    return omega_i, (yc, x[iu]), (yc, x[ie]), (yf, v)


def _amplitude(state, modes, coords, bottom, k):
    """Energy-weighted projection of the e^{ikx} part of ``state`` (h, u, v) on the mode."""
    h, u, v = (np.asarray(a) for a in state)
    num = den = 0.0
    for a, mo, (_, x), w in zip((h - DEPTH + bottom, u, v), modes, coords, (GRAVITY, DEPTH, DEPTH)):
        ak = 2 * (a * np.exp(-1j * k * x)).mean(axis=1, keepdims=True)
        num += w * np.sum(np.conj(mo) * ak)
        den += w * np.sum(np.abs(mo) ** 2)
    return num / den


def _interp(yq, profile):
    y, a = profile
    return np.interp(yq, y, a.real) + 1j * np.interp(yq, y, a.imag)


@pytest.mark.parametrize(
    "f0, beta, slope",
    [(1e-4, 2e-11, 0.0), (-1e-4, 0.0, 2e-5)],
    ids=["beta-plane", "sloping-bottom-south"],
)
def test_rossby_wave_frequency_converges_to_linear_theory(f0, beta, slope):
    """The gravest channel Rossby mode (zonal wavenumber 1, 2000 km square channel,
    L_d = 313 km): on a beta-plane (β = 2e-11) and, in the southern hemisphere, over a bottom
    rising northward (topographic β = f₀·slope/H = −2e-11: eastward). The frequency fitted
    over half a period lies below the continuous one by 1.8% / 0.46% at 16² / 32² (order 2)."""
    k = 2 * np.pi / WIDTH
    omega, pu, pe, pv = _channel_mode(k, f0, beta, slope)
    # westward where the effective β = β + f₀·slope/H is positive, eastward where negative
    assert np.sign(omega) == -np.sign(beta + f0 * slope / DEPTH)
    errors = []
    for n in (16, 32):
        g = Grid((n, n), (WIDTH, WIDTH), periodic=(False, True), dtype="float64")
        locs = (CENTRE, X_FACE, Y_FACE)
        coords = [g.mesh_coordinates(loc) for loc in locs]
        yc, xc = coords[0]
        bottom = slope * (yc - WIDTH / 2)
        modes = [0.01 * _interp(y[:, 0], p)[:, None] for (y, _), p in zip(coords, (pe, pu, pv))]
        fields = [np.real(mo * np.exp(1j * k * x)) for mo, (_, x) in zip(modes, coords)]
        model = ShallowWater(
            g, gravity=GRAVITY, coriolis=f0, beta=beta, bottom=bottom if slope else None
        )
        s = model.initial_state(h=DEPTH - bottom + fields[0], u=fields[1], v=fields[2])

        where = (modes, coords, bottom, k)
        t_end, frames = np.pi / abs(omega), 10
        steps = frames * int(np.ceil(t_end / model.max_stable_dt(s, 0.9) / frames))
        sol = model.run(s, dt=t_end / steps, n_steps=steps, save_every=steps // frames)
        a = np.array(
            [
                _amplitude((sol.states.h[i], sol.states.u[i], sol.states.v[i]), *where)
                for i in range(frames)
            ]
        )
        phase = np.unwrap(np.angle(a / _amplitude((s.h, s.u, s.v), *where)))
        numerical = -np.polyfit(np.asarray(sol.ts), phase, 1)[0]
        errors.append(numerical / omega - 1)
        assert abs(abs(a[-1]) - abs(a[0])) < 0.01 * abs(a[0])  # neither grows nor decays
    assert -2.2e-2 < errors[0] < -1.4e-2 and -5.5e-3 < errors[1] < -3.7e-3, errors
    assert abs(np.log2(errors[0] / errors[1]) - 2) < 0.15, errors


@pytest.mark.parametrize("f0", [1e-4, -1e-4], ids=["north", "south"])
def test_kelvin_wave_travels_at_the_gravity_wave_speed_trapped_at_its_wall(f0):
    """An eastward Kelvin wave, η = A e^{−d/L_d} cos(k(x − ct)), u = (g/c) η, v = 0, at the wall
    on its right in the northern hemisphere (the south wall) and on its left in the southern
    one (the north wall), L_d = 313 km, after one period at 32²: phase speed the C-grid's
    c·sin(kΔx/2)/(kΔx/2) to 1e-5; decay scale L_d to 0.41% (2.4% at 16², 0.10% at 64²);
    |v| under 3e-4 of u; complex amplitude per row within 0.92% of the continuous wave
    (3.3% at 16², 0.24% at 64²: order 1.9)."""
    n, amp = 32, 0.01
    c = np.sqrt(GRAVITY * DEPTH)
    ld, k = c / abs(f0), 2 * np.pi / WIDTH
    g = Grid((n, n), (WIDTH, WIDTH), periodic=(False, True), dtype="float64")
    yc, xc = g.mesh_coordinates(CENTRE)
    yu, xu = g.mesh_coordinates(X_FACE)

    def dist(y):  # distance from the wall the wave leans on
        return y if f0 > 0 else WIDTH - y

    model = ShallowWater(g, gravity=GRAVITY, coriolis=f0)
    s = model.initial_state(
        h=DEPTH + amp * np.exp(-dist(yc) / ld) * np.cos(k * xc),
        u=GRAVITY / c * amp * np.exp(-dist(yu) / ld) * np.cos(k * xu),
    )
    period = WIDTH / c
    steps = int(np.ceil(period / model.max_stable_dt(s, 0.5)))
    end = jax.tree.map(
        lambda a: np.asarray(a[-1]), model.run(s, dt=period / steps, n_steps=steps).states
    )
    rows = 2 * ((end.h - DEPTH) * np.exp(-1j * k * xc)).mean(axis=1)
    exact = amp * np.exp(-dist(yc[:, 0]) / ld)  # back where it started
    assert np.abs(rows - exact).max() < 0.0095 * amp, np.abs(rows - exact).max() / amp
    wall = 0 if f0 > 0 else -1
    speed = c - np.angle(rows[wall]) / (k * period)
    assert abs(speed / c - np.sin(k * g.dx / 2) / (k * g.dx / 2)) < 1e-5, speed / c
    big = np.abs(rows) > 0.01 * amp
    fitted = -1 / np.polyfit(dist(yc[:, 0])[big], np.log(np.abs(rows[big])), 1)[0]
    assert abs(fitted / ld - 1) < 0.006, fitted / ld
    assert np.abs(end.v).max() < 3e-4 * GRAVITY / c * amp, np.abs(end.v).max() / (GRAVITY / c * amp)


@pytest.mark.parametrize(
    "periodic, boundary",
    [((True, True), "free-slip"), ((False, True), "no-slip"), ((False, False), "free-slip")],
)
def test_energy_is_conserved_with_topography_beta_and_walls(periodic, boundary):
    """dE/dt = ⟨∂E/∂state, tendency⟩ of the semi-discrete energy Σ hK + ½gh² + ghb vanishes to
    round-off (≤ 3e-16 of its terms) for a random state over a random bottom on a southern
    beta-plane, periodic, in a channel and in a closed box."""
    rng = np.random.default_rng(3)
    shape = (12, 20)
    g = Grid(shape, (1.0e6, 1.5e6), periodic=periodic, dtype="float64")
    model = ShallowWater(
        g, coriolis=-1e-4, beta=2e-11, bottom=20 * rng.standard_normal(shape), boundary=boundary
    )
    s = model.initial_state(
        h=DEPTH + rng.standard_normal(shape),
        u=0.3 * rng.standard_normal(shape),
        v=0.3 * rng.standard_normal(shape),
    )
    tend = model.rhs(s)
    _, rate = jax.jvp(model.energy, (s,), (tend,))
    terms = (
        np.abs(s.h * s.u * tend.u).sum()
        + np.abs(s.h * s.v * tend.v).sum()
        + np.abs(model.gravity * s.h * tend.h).sum()
    ) * g.cell_volume
    assert abs(float(rate)) < 3e-15 * float(terms)


def test_forcing_and_damping_match_exact_solutions():
    """Uniform wind stress with drag on a periodic f-plane spins the layer up as
    d(u + iv)/dt = τ/(ρ₀h) − (r + if)(u + iv) (to the right of the wind in the north, left in
    the south; ρ₀ = 1025 by default); a wall-bounded shear flow decays at the discrete
    Laplacian's rate, cos modes with free slip and sin modes with no slip."""
    g = Grid((8, 8), (1e6, 1e6), periodic=(True, True), dtype="float64")
    tau, r, t_end = 0.1, 1e-5, 1e5
    for f in (1e-4, -1e-4):
        for k, stress in enumerate(((tau, 0.0), (0.0, tau))):
            wind = tuple(np.full(g.shape, t) for t in stress)
            m = ShallowWater(g, coriolis=f, drag=r, wind_stress=wind)
            end = m.run(m.initial_state(h=np.full(g.shape, DEPTH)), dt=t_end / 400, n_steps=400)
            w = complex(float(end.states.u.mean()), float(end.states.v.mean()))
            lam = r + 1j * f
            exact = 1j**k * tau / (1025.0 * DEPTH) / lam * (1 - np.exp(-lam * t_end))
            assert abs(w - exact) < 1e-5 * abs(exact), (f, k, w, exact)
    nu, n = 1e4, 16
    g = Grid((n, 8), (1e6, 3e6), periodic=(False, True), dtype="float64")
    y, _ = g.mesh_coordinates(X_FACE)
    for boundary, shape in (
        ("free-slip", np.cos(np.pi * y / 1e6)),
        ("no-slip", np.sin(np.pi * y / 1e6)),
    ):
        m = ShallowWater(g, coriolis=0.0, viscosity=nu, boundary=boundary)
        s = m.initial_state(h=np.full(g.shape, DEPTH), u=0.1 * shape)
        t_end = (1e6 / np.pi) ** 2 / nu  # one e-folding of the continuous mode
        steps = int(np.ceil(t_end / m.max_stable_dt(s, 0.9)))
        u = np.asarray(m.run(s, dt=t_end / steps, n_steps=steps).states.u[-1])
        discrete = np.exp(-nu * t_end * 4 * np.sin(np.pi * g.dy / 2e6) ** 2 / g.dy**2)
        assert np.abs(u - 0.1 * discrete * shape).max() < 1e-6 * 0.1, boundary
        assert abs(discrete / np.exp(-1) - 1) < 0.0035  # 0.32% from the continuous rate


def _norm(state, kw):
    """Square root of the linear energy of a state about rest."""
    terms = DEPTH * (state.u**2 + state.v**2) + kw.get("gravity", 9.81) * (state.h - DEPTH) ** 2
    return float(np.sqrt(np.sum(terms)))


@pytest.mark.parametrize("scheme", ["ssprk3", "rk4"])
def test_stability_limit_is_sharp_for_waves_and_rotation(scheme):
    """``max_stable_dt`` is the true limit where gravity waves (C-grid, Δx ≠ Δy) or inertial
    oscillations set it: over 2000 steps from noise the linear energy does not grow at 0.98 of
    it and grows by more than 1e6 at 1.04."""
    rng = np.random.default_rng(0)
    for shape, extent, kw in (
        ((12, 24), (1e6, 1e6), dict(coriolis=1e-4)),
        ((8, 8), (1e8, 1e8), dict(coriolis=1e-3, gravity=0.01)),
    ):
        g = Grid(shape, extent, periodic=(True, True), dtype="float64")
        m = ShallowWater(g, scheme=scheme, **kw)
        noise = [1e-6 * rng.standard_normal(shape) for _ in range(3)]
        s = m.initial_state(h=DEPTH + noise[0], u=noise[1], v=noise[2])
        limit = m.max_stable_dt(s)

        growth = []
        for cfl in (0.98, 1.04):
            end = m.advance(s, t0=0.0, dt=cfl * limit, n_steps=2000)
            growth.append(_norm(end, kw) / _norm(s, kw) if np.isfinite(end.h).all() else np.inf)
        assert growth[0] <= 1 and growth[1] > 1e6, (shape, growth)
