"""The fixed-step schemes of physjax.solvers at their order, stage times included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from physjax.solvers import SCHEMES, advance, integrate

A = np.array([[-0.1, 2.0, 0.0], [-2.0, -0.1, 0.5], [0.0, -0.5, -0.3]])


def _rhs(y, t):  # linear, oscillating, damped and forced in time: stage times matter
    return {"a": jnp.asarray(A) @ y["a"] + jnp.cos(3 * t) * jnp.array([1.0, 0.0, 0.0])}


@pytest.mark.parametrize("name", ["ssprk3", "rk4"])
def test_fixed_step_schemes_converge_at_their_order(name):
    step, order, _ = SCHEMES[name]
    t0, span, y0 = 0.3, 2.0, np.array([1.0, 0.5, -0.2])
    exact = solve_ivp(
        lambda t, y: A @ y + np.cos(3 * t) * np.array([1.0, 0.0, 0.0]),
        (t0, t0 + span),
        y0,
        method="DOP853",
        rtol=1e-13,
        atol=1e-14,
    ).y[:, -1]
    run = jax.jit(
        lambda n: advance(lambda y, t, dt: step(_rhs, y, t, dt), {"a": y0}, t0, span / n, n),
        static_argnums=0,
    )
    ns = (20, 40, 80, 160)
    errs = [float(np.abs(run(n)["a"] - exact).max()) for n in ns]
    fitted = -np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert abs(fitted - order) <= 0.1, (fitted, errs)
    # frames every save_every steps are the states of the same steps taken in one go
    frames = integrate(lambda y, t, dt: step(_rhs, y, t, dt), {"a": y0}, t0, span / 40, 4, 10)
    np.testing.assert_allclose(frames["a"][-1], run(40)["a"], rtol=0, atol=1e-14)
