"""The fixed-step schemes of physjax.solvers at their order, stage times included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from scipy.integrate import solve_ivp

from physjax.solvers import SCHEMES, advance, integrate, integrate_diffrax

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


def test_integrate_diffrax_names_a_right_hand_side_of_the_wrong_dtype_or_shape():
    """A float64 parameter in ``args`` for a float32 state (x64 on) made diffrax fail deep in
    its stage loop ('`value` must have a dtype that can be promoted to the same dtype as
    `buffer`'); the leaf and both dtypes are now named before anything compiles."""
    assert jax.config.jax_enable_x64  # tests/conftest.py
    y0 = {"a": jnp.ones(3, jnp.float32)}

    def rhs(y, t, p):
        return {"a": -p * y["a"]}

    with pytest.raises(TypeError, match=r"returned dtype float64 at y0\['a'\], whose dtype"):
        integrate_diffrax(rhs, y0, 0.0, 1.0, args=jnp.float64(0.5))
    with pytest.raises(TypeError, match=r"returned shape \(2,\) at y0\['a'\]"):
        integrate_diffrax(lambda y, t: {"a": y["a"][:2]}, y0, 0.0, 1.0)
    with pytest.raises(TypeError, match=r"must return a tree of y0's structure"):
        integrate_diffrax(lambda y, t: y["a"], y0, 0.0, 1.0)
    sol = integrate_diffrax(rhs, y0, 0.0, 1.0, args=jnp.float32(0.5))
    assert sol.ys["a"].dtype == jnp.float32
    np.testing.assert_allclose(sol.ys["a"][-1], np.exp(-0.5), rtol=1e-5)


def test_advance_and_integrate_refuse_a_block_that_is_not_a_count_and_a_function():
    """``block=(2.5, step_S)`` failed inside the scan with "'float' object cannot be
    interpreted as an integer" and ``("2", step_S)`` with a str/int comparison, naming
    neither ``block``; a valid block still takes the same steps as one at a time."""
    step = SCHEMES["rk4"][0]

    def one(y, t, dt):
        return step(lambda y, t: -y + jnp.sin(t), y, t, dt)

    def three(y, ts, dt):
        for t in ts:
            y = one(y, t, dt)
        return y

    for bad in ((2.5, three), ("2", three), (True, three), (0, three), (3, None), [3, three]):
        with pytest.raises(TypeError, match=r"^block must be None or a pair \(S, step_S\)"):
            advance(one, jnp.array(1.0), 0.3, 0.1, 7, block=bad)
        with pytest.raises(TypeError, match=r"^block must be None or a pair \(S, step_S\)"):
            integrate(one, jnp.array(1.0), 0.3, 0.1, 2, 7, block=bad)
    ref = advance(one, jnp.array(1.0), 0.3, 0.1, 7)
    for S in (1, np.int64(3), 8):
        assert float(advance(one, jnp.array(1.0), 0.3, 0.1, 7, block=(S, three))) == float(ref)


@pytest.mark.parametrize("name", ["euler", "ssprk3", "rk4"])
def test_a_state_with_float32_and_float64_leaves_takes_a_float64_dt(name):
    """A state with float32 and float64 leaves (x64 on) stepped with a NumPy or JAX float64
    ``dt`` failed in ``lax.scan`` ('carry input ... float32 ... output ... float64'), while
    a Python float ran; each leaf now keeps its dtype and all three give the same numbers."""
    step = SCHEMES[name][0]

    def rhs(y, t):
        return {"a": -y["a"], "b": -2 * y["b"]}

    y0 = {"a": jnp.float32(1.0), "b": jnp.float64(1.0)}
    runs = [
        advance(lambda y, t, dt: step(rhs, y, t, dt), y0, 0.0, dt, 100)
        for dt in (0.01, np.float64(0.01), jnp.float64(0.01))
    ]
    for y in runs:
        assert (y["a"].dtype, y["b"].dtype) == (jnp.float32, jnp.float64)
        assert (float(y["a"]), float(y["b"])) == (float(runs[0]["a"]), float(runs[0]["b"]))
    if name != "euler":
        assert abs(float(runs[0]["b"]) - np.exp(-2.0)) < 1e-6
        assert abs(float(runs[0]["a"]) - np.exp(-1.0)) < 1e-6
    frames = integrate(lambda y, t, dt: step(rhs, y, t, dt), y0, 0.0, np.float64(0.01), 4, 25)
    assert float(frames["b"][-1]) == float(runs[0]["b"])


@pytest.mark.parametrize("name", ["euler", "ssprk3", "rk4"])
def test_a_time_dependent_rhs_on_a_mixed_precision_state_keeps_each_leafs_dtype(name):
    """A right-hand side that multiplies the float32 leaf by the time (taken in float64
    when the state's leaves differ) made that leaf float64, and ``lax.scan`` refused the
    carry; each leaf now keeps its dtype and follows y = exp(-t²/2)."""
    step = SCHEMES[name][0]

    def rhs(y, t):
        return {"a": -y["a"] * t, "b": -y["b"] * t}

    y0 = {"a": jnp.ones(3, jnp.float32), "b": jnp.ones(3, jnp.float64)}
    y = advance(lambda y, t, dt: step(rhs, y, t, dt), y0, 0.0, 0.01, 100)
    assert (y["a"].dtype, y["b"].dtype) == (jnp.float32, jnp.float64)
    tol = 5e-3 if name == "euler" else 1e-6
    assert np.max(np.abs(np.asarray(y["a"]) - np.exp(-0.5))) < tol
    assert np.max(np.abs(np.asarray(y["b"]) - np.exp(-0.5))) < tol


def test_a_solve_stopped_by_max_steps_returns_what_the_docs_say():
    """With throw=False a solve that reaches max_steps returns: frames of SaveAt(ts=...) it
    did not reach are inf, and the default SaveAt(t1=True) holds the state where it stopped
    at that time (the docs once said every unreached frame was inf)."""
    import diffrax

    y0 = jnp.ones(3, jnp.float32)
    tight = dict(max_steps=3, throw=False, rtol=1e-7, atol=1e-7)
    last = integrate_diffrax(lambda y, t: -y, y0, 0.0, 2.0, **tight)
    assert not diffrax.is_okay(last.result)
    t = float(last.ts[0])
    assert 0.0 < t < 2.0
    np.testing.assert_allclose(last.ys[0], np.exp(-t) * np.ones(3), rtol=1e-5)
    ts = jnp.linspace(0.0, 2.0, 5)
    frames = integrate_diffrax(lambda y, t: -y, y0, 0.0, 2.0, saveat=diffrax.SaveAt(ts=ts), **tight)
    reached = np.isfinite(np.asarray(frames.ts))
    assert reached[0] and not reached[1:].any()
    assert np.isinf(np.asarray(frames.ys[1:])).all()


def test_eager_advance_and_integrate_trace_their_step_once():
    """Called eagerly (a loop over chunks of a run), advance and integrate traced and
    compiled the step at every call (75 ms for 100 steps of a 1000-element state); they are
    compiled once per step function, shapes and step count now, with the same numbers, and
    a new t0 or dt does not compile again."""
    from physjax.solvers import ssprk3_step

    traced = []

    def step(y, t, dt):
        traced.append(1)
        return ssprk3_step(lambda y, t: -y + jnp.sin(t), y, t, dt)

    y = jnp.linspace(0.0, 1.0, 7)
    a = advance(step, y, 0.0, 0.01, 50)
    b = advance(step, a, 0.5, 0.01, 50)
    c = advance(step, y, 0.0, 0.01, 100)  # another step count: compiled again
    assert len(traced) == 2, len(traced)
    np.testing.assert_allclose(b, c, rtol=1e-6, atol=1e-7)
    traced.clear()
    f1 = integrate(step, y, 0.0, 0.01, 4, 25)
    f2 = integrate(step, y, 0.0, 0.02, 4, 25)
    assert len(traced) == 1, len(traced)
    np.testing.assert_allclose(f1[-1], c, rtol=1e-6, atol=1e-7)
    assert not np.allclose(f1, f2)


def test_a_repeated_diffrax_solve_does_not_trace_its_right_hand_side_again():
    """The check of the right-hand side's output (a trace for shapes) ran at every call,
    about half of a repeated small eager solve_diffrax (~8 ms of ~15 ms at 64²); a call with
    the structure, shapes and dtypes already checked now skips it (and diffrax's compiled
    solve is reused, so the right-hand side is not traced at all), while new shapes or a
    wrong dtype are still checked."""
    traced = []

    def rhs(y, t, k):
        traced.append(1)
        return -k * y

    y0 = jnp.ones(5, jnp.float32)
    a = integrate_diffrax(rhs, y0, 0.0, 1.0, args=jnp.float32(2.0))
    first = len(traced)
    assert first >= 2  # the check's trace and diffrax's
    b = integrate_diffrax(rhs, y0 * 3, 0.0, 1.0, args=jnp.float32(2.0))
    assert len(traced) == first, len(traced) - first
    np.testing.assert_allclose(b.ys, 3 * a.ys, rtol=1e-6)
    np.testing.assert_allclose(a.ys[-1], np.exp(-2.0) * np.ones(5), rtol=1e-5)
    integrate_diffrax(rhs, jnp.ones(6, jnp.float32), 0.0, 1.0, args=jnp.float32(2.0))
    assert len(traced) > first  # new shapes: checked (and compiled) again
    if jax.config.jax_enable_x64:
        with pytest.raises(TypeError, match="returned dtype float64"):
            integrate_diffrax(rhs, y0, 0.0, 1.0, args=jnp.float64(2.0))


def test_a_mixed_precision_state_does_not_compile_again_for_a_new_time():
    """A state whose floating leaves differ (float32 and float64) kept ``t0``, ``t1`` and
    ``dt`` as Python numbers, which the compiled loops take as static: every chunk of a
    chunked run (a new ``t0``) traced and compiled the whole loop again (0.3 s a chunk for
    100 steps of 2×1000 values), every diffrax solve to a new ``t1`` too (2.8 s a call); they
    are traced once now, with the same numbers."""
    assert jax.config.jax_enable_x64  # tests/conftest.py
    from physjax.solvers import ssprk3_step

    traced = []

    def rhs(y, t):
        traced.append(1)
        return {"a": -y["a"] + jnp.sin(t).astype(jnp.float32), "b": -y["b"]}

    def step(y, t, dt):
        return ssprk3_step(rhs, y, t, dt)

    y0 = {"a": jnp.ones(3, jnp.float32), "b": jnp.ones(3, jnp.float64)}
    y = advance(step, y0, 0.0, 0.01, 50)
    first = len(traced)
    y = advance(step, y, 0.5, 0.01, 50)
    assert len(traced) == first, len(traced) - first
    whole = advance(step, y0, 0.0, 0.01, 100)
    assert (y["a"].dtype, y["b"].dtype) == (jnp.float32, jnp.float64)
    np.testing.assert_allclose(y["a"], whole["a"], rtol=1e-6)
    np.testing.assert_allclose(y["b"], np.exp(-1.0), rtol=1e-6)
    traced.clear()
    integrate(step, y0, 0.0, 0.01, 2, 25)
    first = len(traced)
    integrate(step, y0, 0.3, 0.01, 2, 25)
    assert len(traced) == first, len(traced) - first
    traced.clear()
    integrate_diffrax(rhs, y0, 0.0, 1.0)
    first = len(traced)
    sol = integrate_diffrax(rhs, y0, 0.0, 2.0)
    assert len(traced) == first, len(traced) - first
    np.testing.assert_allclose(sol.ys["b"][-1], np.exp(-2.0), rtol=1e-5)


def test_advance_and_integrate_refuse_a_time_or_step_that_is_not_one_finite_number():
    """``advance`` and ``integrate`` took any ``t0`` and ``dt``: ``dt=nan`` returned NaN,
    ``dt=0`` (or 1e-50, 0 in float32) the state unchanged, ``dt="0.1"`` ran, and a ``t0`` of
    two values made the time a vector, each without a word. They are refused by name before
    anything compiles; a negative ``dt`` steps back in time, and traced scalars still run."""
    step = SCHEMES["rk4"][0]

    def one(y, t, dt):
        return step(lambda y, t: -y + t, y, t, dt)

    y0 = jnp.ones(3, jnp.float32)
    bad = [
        ("t0", dict(t0=float("nan"))),
        ("t0", dict(t0=jnp.array([0.0, 1.0]))),
        ("t0", dict(t0=None)),
        ("dt", dict(dt="0.1")),
        ("dt", dict(dt=float("inf"))),
        ("dt", dict(dt=1e39)),  # inf in float32
        ("dt", dict(dt=True)),
    ]
    for name, kw in bad:
        times = {"t0": 0.0, "dt": 0.1, **kw}
        with pytest.raises(ValueError, match=rf"^{name} must be (a |one )?finite"):
            advance(one, y0, times["t0"], times["dt"], 3)
        with pytest.raises(ValueError, match=rf"^{name} must be (a |one )?finite"):
            integrate(one, y0, times["t0"], times["dt"], 2, 3)
    for dt in (0.0, 1e-50):
        with pytest.raises(ValueError, match=r"^dt must be a nonzero number"):
            advance(one, y0, 0.0, dt, 3)
    with pytest.raises(ValueError, match=r"^t0 must be one finite number, got a traced"):
        jax.jit(lambda t: advance(one, y0, t, 0.1, 3))(jnp.arange(2.0))
    back = advance(one, advance(one, y0, 0.0, 0.1, 10), 1.0, -0.1, 10)
    np.testing.assert_allclose(back, y0, rtol=1e-5)
    traced = jax.jit(lambda t, d: advance(one, y0, t, d, 10))(0.0, 0.1)
    np.testing.assert_allclose(traced, advance(one, y0, 0.0, 0.1, 10), rtol=1e-6)


def test_step_times_a_float32_state_cannot_hold_are_refused():
    """A float32 ``advance`` from ``t0=1e9`` with ``dt=30`` held its step times 64 s apart
    and integrated a forcing 19% wrong without a word; a float32 ``integrate_diffrax`` from
    1e6 to 1e6 + 1 (times 0.0625 apart there) took steps that rounded back to their start
    until it reached ``max_steps``. Both are refused, naming the times; the same runs counted
    from ``t0=0``, or in float64, still run and agree with the exact integral."""
    step = SCHEMES["rk4"][0]
    t0 = 1e9

    def forced(y, t):
        return jnp.cos(2 * jnp.pi * (t - t0) / 600.0) * jnp.ones_like(y)

    def one(y, t, dt):
        return step(forced, y, t, dt)

    y32 = jnp.zeros(1, jnp.float32)
    held = r"the state's dtype float32 holds step 1's time 1000000030.0 as 1000000000.0"
    with pytest.raises(ValueError, match=rf"^t0=1000000000.0 with dt=30.0: {held}, 30 off"):
        advance(one, y32, t0, 30.0, 5)
    with pytest.raises(ValueError, match=r"more than 1% of dt: count the times from"):
        integrate(one, y32, t0, 30.0, 5, 1)
    exact = 600 / (2 * np.pi) * np.sin(2 * np.pi * 150 / 600)
    y64 = advance(one, jnp.zeros(1, jnp.float64), t0, 30.0, 5)
    np.testing.assert_allclose(y64, [exact], rtol=1e-4)
    # a long float32 run from 0 holds its times well enough: 1e5 steps of 30 s
    far = advance(lambda y, t, dt: y + dt * jnp.cos(t * 0.0), y32, 0.0, 30.0, 100_000)
    np.testing.assert_allclose(far, [3e6], rtol=1e-3)

    apart = r"holds times near 1000001.0 only 0.0625 apart, 6.25% of the span"
    with pytest.raises(ValueError, match=rf"^t0=1000000.0 and t1=1000001.0: .*{apart}"):
        integrate_diffrax(lambda y, t: -y, jnp.ones(1, jnp.float32), 1e6, 1e6 + 1.0)
    sol = integrate_diffrax(lambda y, t: -y, jnp.ones(1, jnp.float32), 0.0, 1.0)
    np.testing.assert_allclose(sol.ys[-1], [np.exp(-1.0)], rtol=1e-5)


def test_integrate_diffrax_does_not_compile_again_for_new_tolerances():
    """The default step-size controller held ``rtol`` and ``atol`` as Python numbers, which
    diffrax's compiled solve takes as static: every new tolerance of a tolerance study
    traced and compiled the whole solve again (2-3.5 s a call for a 3-value state or an 8²
    shallow-water solve), and a NumPy float64 tolerance (x64 on) made a float32 solve fail.
    They are arrays in the state's dtype now: compiled once, the same steps."""
    traced = []

    def rhs(y, t):
        traced.append(1)
        return -y + jnp.cos(3 * t)

    y0 = jnp.ones(3, jnp.float32)
    loose = integrate_diffrax(rhs, y0, 0.0, 2.0, rtol=1e-3, atol=1e-5)
    first = len(traced)
    tight = integrate_diffrax(rhs, y0, 0.0, 2.0, rtol=1e-5, atol=1e-7)
    assert len(traced) == first, len(traced) - first
    # NumPy float64 tolerances (x64 on) are held in float32 too: they stopped diffrax with
    # "`body_fun` must have the same input and output structure" (its state promoted)
    numpy = integrate_diffrax(rhs, y0, 0.0, 2.0, rtol=np.float64(1e-5), atol=np.float64(1e-7))
    assert len(traced) == first, len(traced) - first
    assert numpy.ys.dtype == jnp.float32 and numpy.ts.dtype == jnp.float32
    np.testing.assert_array_equal(numpy.ys, tight.ys)
    # the tolerances act: more steps, a closer result
    assert int(tight.stats["num_steps"]) > int(loose.stats["num_steps"])
    exact = np.exp(-2.0) + (np.cos(6.0) + 3 * np.sin(6.0) - np.exp(-2.0)) / 10
    assert abs(float(tight.ys[-1, 0]) - exact) < abs(float(loose.ys[-1, 0]) - exact)
    assert abs(float(tight.ys[-1, 0]) - exact) < 1e-5


def _grad_step(y, t, dt):  # nonlinear, time-dependent, a few intermediates per step
    return y + dt * (jnp.sin(y) * jnp.roll(y, 1) - 0.1 * y + jnp.cos(t))


def _temp_bytes(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_gradient_through_advance_and_integrate_stores_sqrt_n_states():
    """Reverse mode through the fixed-step loops kept every intermediate of every step:
    the gradient through 400 steps of a 64×64 float64 state took 15.6× the temporary
    memory of 25 steps (39 MB against 2.5 MB; 8.1 GB after 6400 steps of a 64²
    shallow-water run). The loops are now checkpointed in blocks of ceil(√n) steps: 16×
    the steps take ~4× the memory (3.6×), with ``integrate`` too."""
    y0 = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)))

    def adv(n):
        return jax.grad(lambda y: jnp.sum(advance(_grad_step, y, 0.0, 0.01, n) ** 2))

    def frames(n, save_every):
        return jax.grad(
            lambda y: jnp.sum(integrate(_grad_step, y, 0.0, 0.01, n // save_every, save_every))
        )

    small, large = _temp_bytes(adv(25), y0), _temp_bytes(adv(400), y0)
    assert large < 4 * small, (small, large)
    small, large = _temp_bytes(frames(25, 25), y0), _temp_bytes(frames(400, 400), y0)
    assert large < 4 * small, (small, large)
    # a frame every 5 steps (13.2× before): the 80 frames and their cotangents, 5 MB of the
    # 6 MB, are kept whatever the checkpoints
    small, large = _temp_bytes(frames(25, 5), y0), _temp_bytes(frames(400, 5), y0)
    assert large < 8 * small, (small, large)


@pytest.mark.parametrize("n, S", [(23, None), (23, 3), (1, None), (100, 4)])
def test_checkpointed_loop_gives_the_plain_loops_values_and_gradient(n, S):
    """The checkpointed loops (blocks of several steps, and a remainder) give the values of
    the plain ``lax.scan`` of every step (``every=0``), to the bit, and its gradient."""
    from physjax.solvers._time_stepping import _advance

    y0 = jnp.asarray(np.random.default_rng(1).normal(size=(8, 8)))
    t0, dt = jnp.asarray(0.3), jnp.asarray(0.01)

    def three(y, ts, dt):
        for t in ts:
            y = _grad_step(y, t, dt)
        return y

    block = None if S is None else (S, three)

    def plain(y):
        return _advance(_grad_step, y, t0, dt, n, block, 0)

    np.testing.assert_array_equal(advance(_grad_step, y0, t0, dt, n, block=block), plain(y0))
    ref = jax.grad(lambda y: jnp.sum(plain(y) ** 3))(y0)
    got = jax.grad(lambda y: jnp.sum(advance(_grad_step, y, t0, dt, n, block=block) ** 3))(y0)
    tol = 1e-12 * float(jnp.max(jnp.abs(ref)))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=tol)
    frames = jax.grad(lambda y: jnp.sum(integrate(_grad_step, y, t0, dt, 1, n) ** 3))(y0)
    np.testing.assert_allclose(frames, ref, rtol=1e-12, atol=tol)


def test_integrate_with_no_frames_returns_an_empty_stack():
    """``integrate`` takes ``n_frames >= 0``; with the checkpointed loop, ``n_frames=0``
    raised a ``TypeError`` from ``jax.tree.map`` (no block to stack) instead of returning
    the empty stack of frames that the plain ``lax.scan`` gave."""
    y0 = {"x": jnp.ones(3), "k": jnp.asarray(0, jnp.int32)}

    def step(y, t, dt):
        return {"x": y["x"] + dt * jnp.sin(y["x"]), "k": y["k"] + 1}

    frames = integrate(step, y0, 0.0, 0.1, 0, 5)
    assert frames["x"].shape == (0, 3) and frames["k"].shape == (0,)
    assert frames["k"].dtype == jnp.int32
    obs = integrate(step, y0, 0.0, 0.1, 0, 1, observe=lambda y: jnp.sum(y["x"]))
    assert obs.shape == (0,)
    grad = jax.grad(
        lambda x: jnp.sum(x) + jnp.sum(integrate(step, {**y0, "x": x}, 0.0, 0.1, 0, 3)["x"])
    )
    np.testing.assert_array_equal(grad(y0["x"]), np.ones(3))


@pytest.mark.parametrize("n_frames, save_every", [(101, 1), (100, 1), (110, 10)])
def test_integrate_forward_does_not_copy_its_frames(n_frames, save_every):
    """The checkpointed loop stacked the frames of its blocks and concatenated the last
    shorter block's to them: a forward ``integrate`` of 101 frames of a 256² float64 state
    took 51 MB of temporary memory beside its 50.5 MB of frames (0.5 MB with the plain
    scan), 5.5 MB with 100 frames. The frames are now written in place into one buffer;
    what remains is one block's frames (~√n of them) before they are written."""
    y0 = jnp.ones((256, 256))

    def step(y, t, dt):
        return y + dt * jnp.sin(y)

    fn = jax.jit(lambda y: integrate(step, y, 0.0, 0.1, n_frames, save_every))
    memory = fn.lower(y0).compile().memory_analysis()
    assert memory.temp_size_in_bytes < 0.2 * memory.output_size_in_bytes, (
        memory.temp_size_in_bytes,
        memory.output_size_in_bytes,
    )
    plain = jax.jit(
        lambda y: lax.scan(
            lambda y, k: (lambda z: (z, z))(
                advance(step, y, k * save_every * 0.1, 0.1, save_every)
            ),
            y,
            jnp.arange(n_frames),
        )[1]
    )
    np.testing.assert_array_equal(fn(y0), plain(y0))


def test_step_times_a_float32_state_cannot_hold_are_refused_at_the_end_of_a_long_run():
    """The coarsest step times are at the end of a run: float32 holds times in
    [8192, 16384) 2**-10 apart (within 1% of dt = 0.09), from 16384 up 2**-9 apart (not).
    A 10 000-step run from 15664 crosses 16384 only in its last 2000 steps."""
    y0 = jnp.float32(0.0)

    def step(y, t, dt):
        return y + dt

    with pytest.raises(
        ValueError,
        match=r"^t0=15664\.0 with dt=0\.09: the state's dtype float32 holds step (\d+)'s time",
    ):
        advance(step, y0, 15664.0, 0.09, 10_000)
    advance(step, y0, 15664.0, 0.09, 4000)  # all below 16384: held within 1% of dt
