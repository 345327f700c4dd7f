"""Shared time stepping: fixed-step Runge–Kutta schemes inside ``lax.scan``, and diffrax.

The fixed-step path is the fast one: many steps per compiled call, frames every
``save_every`` steps. The diffrax path integrates the same right-hand side with any diffrax
solver, adaptive steps (PID controller) and checkpointed adjoints for long gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

PyTree = Any
RHS = Callable[[PyTree, jax.Array], PyTree]

#: ``integrate_diffrax``'s step limit, and the one it takes when every step is saved
#: (diffrax's own default: its output is padded to ``max_steps`` frames).
DEFAULT_MAX_STEPS, STEPS_SAVED_MAX_STEPS = 100_000, 4096
#: ``(S, step_S)``: a function that takes ``S`` fixed steps at once (see ``advance``).
Block = tuple[int, Callable]


def _axpy(a, x, y):
    """a·x + y in the dtype of each leaf of ``y``, with ``a`` (a time step) taken in the
    leaf's real dtype: a float64 ``dt`` (NumPy or JAX), or a right-hand side that multiplies
    a float32 leaf by a float64 time, promoted the float32 leaves of a state that also has
    float64 ones, and ``lax.scan`` refused the carry ('carry input ... float32 ... output
    ... float64'). The state's dtypes are its precision; a no-op where they already match."""
    return jax.tree.map(lambda xi, yi: _as_leaf(_in_leaf_dtype(a, yi) * xi + yi, yi), x, y)


def _as_leaf(value, leaf):
    dtype = jnp.result_type(leaf)
    return value.astype(dtype) if jnp.issubdtype(dtype, jnp.inexact) else value


def _in_leaf_dtype(a, leaf):
    dtype = jnp.result_type(leaf)
    if not jnp.issubdtype(dtype, jnp.inexact):
        return a
    return jnp.asarray(a, jnp.finfo(dtype).dtype)


def _lincomb(*pairs):
    """Σ coefficient·tree."""
    out = None
    for c, tree in pairs:
        scaled = jax.tree.map(lambda x, c=c: c * x, tree)
        out = scaled if out is None else jax.tree.map(jnp.add, out, scaled)
    return out


def _identity(y):
    return y


def euler_step(rhs: RHS, y: PyTree, t, dt, apply_bc=_identity) -> PyTree:
    """Forward Euler (first order); for tests and debugging."""
    return apply_bc(_axpy(dt, rhs(y, t), y))


def ssprk3_step(rhs: RHS, y: PyTree, t, dt, apply_bc=_identity) -> PyTree:
    """Three-stage, third-order strong-stability-preserving Runge–Kutta.

    Shu & Osher (1988), DOI 10.1016/0021-9991(88)90177-5. Stable for oscillatory modes with
    ``|ω dt| ≤ √3``. ``apply_bc`` is applied to every stage's state (e.g. to refresh halos).
    """
    # Written as y + c (w - y): weights like 1/3 + 2/3 do not sum to exactly 1 in float32,
    # which would create or destroy mass at every step.
    y1 = apply_bc(_axpy(dt, rhs(y, t), y))
    y2 = apply_bc(_toward(y, _axpy(dt, rhs(y1, t + dt), y1), 0.25))
    return apply_bc(_toward(y, _axpy(dt, rhs(y2, t + 0.5 * dt), y2), 2 / 3))


def _toward(y, w, c):
    """y + c (w − y)."""
    return jax.tree.map(lambda yi, wi: yi + c * (wi - yi), y, w)


def rk4_step(rhs: RHS, y: PyTree, t, dt, apply_bc=_identity) -> PyTree:
    """Classical four-stage, fourth-order Runge–Kutta; stable for ``|ω dt| ≤ 2√2``."""
    k1 = rhs(y, t)
    k2 = rhs(apply_bc(_axpy(0.5 * dt, k1, y)), t + 0.5 * dt)
    k3 = rhs(apply_bc(_axpy(0.5 * dt, k2, y)), t + 0.5 * dt)
    k4 = rhs(apply_bc(_axpy(dt, k3, y)), t + dt)
    incr = _lincomb((1 / 6, k1), (1 / 3, k2), (1 / 3, k3), (1 / 6, k4))
    return apply_bc(_axpy(dt, incr, y))


#: Fixed-step schemes by name, with their order and their stability limit on the imaginary
#: axis (``max |ω dt|``).
SCHEMES: dict[str, tuple[Callable, int, float]] = {
    "euler": (euler_step, 1, 0.0),
    "ssprk3": (ssprk3_step, 3, 3**0.5),
    "rk4": (rk4_step, 4, 2 * 2**0.5),
}

#: For damping (a negative real eigenvalue, e.g. linear drag ``-r``) that acts together with
#: oscillations up to the imaginary-axis limit ``L`` of ``SCHEMES``: the largest ``X`` such that
#: the whole rectangle ``[-X, 0] × [-iL, iL]`` lies in the scheme's stability region, so that
#: ``r dt ≤ X`` is stable whatever the oscillation frequency within its own limit (computed
#: from the stability polynomials and rounded down; the real-axis limits alone are ≈ 2.51 for
#: SSP-RK3 and ≈ 2.79 for RK4, but not combined with a frequency at ``L``).
DAMPING_LIMITS: dict[str, float] = {"euler": 0.0, "ssprk3": 1.64, "rk4": 0.68}


def scheme(name: str) -> Callable:
    if name not in SCHEMES:
        raise ValueError(f"time scheme must be one of {sorted(SCHEMES)}, got {name!r}")
    return SCHEMES[name][0]


def _time_dtype(y: PyTree):
    """The real dtype of the floating leaves of ``y`` when they share one (times are taken
    in it, as a model takes them in its grid's dtype), else ``None``: with x64 on, a
    float64 ``dt`` would otherwise promote a float32 state (in ``lax.scan``, an error)."""
    dtypes = set()
    for leaf in jax.tree.leaves(y):
        dtype = jnp.result_type(leaf)
        if jnp.issubdtype(dtype, jnp.inexact):
            dtypes.add(np.dtype(jnp.finfo(dtype).dtype))
    return dtypes.pop() if len(dtypes) == 1 else None


def _in_dtype(dtype, *times):
    """``times`` as arrays of ``dtype`` (``None`` stays). With no ``dtype`` (a state whose
    floating leaves differ) as arrays still, a Python number weakly typed as before: the
    compiled loops take what is not an array as static, and each new ``t0`` of a chunked
    run (or ``t1`` of a diffrax solve) compiled the whole loop again."""
    return tuple(None if t is None else jnp.asarray(t, dtype) for t in times)


def _tolerances_in_dtype(dtype, *tols):
    """``tols`` (numbers or arrays) as arrays of ``dtype``; with no ``dtype`` (a state whose
    floating leaves differ), a concrete tolerance becomes a weakly typed array, as a Python
    float would act, so that a float64 NumPy tolerance cannot promote a float32 leaf."""
    if dtype is not None:
        return tuple(jnp.asarray(t, dtype) for t in tols)
    return tuple(
        t if isinstance(t, jax.core.Tracer) else jnp.asarray(float(np.asarray(t))) for t in tols
    )


def saveat_in_dtype(saveat: diffrax.SaveAt, dtype) -> diffrax.SaveAt:
    """``saveat`` with the ``ts`` of each of its ``SubSaveAt``s in ``dtype``: ``ts`` of
    Python floats (float64 with x64 on) would promote a whole float32 solve to float64."""

    def cast(sub):
        if not isinstance(sub, diffrax.SubSaveAt) or sub.ts is None:
            return sub
        return eqx.tree_at(lambda s: s.ts, sub, jnp.asarray(sub.ts, dtype))

    subs = jax.tree.map(cast, saveat.subs, is_leaf=lambda x: isinstance(x, diffrax.SubSaveAt))
    return eqx.tree_at(lambda s: s.subs, saveat, subs)


def _real_scalar(value) -> np.ndarray | None:
    """``value`` as a 0-d NumPy array of a real number (integer or float, not bool), or
    ``None`` when it is not one."""
    try:
        x = np.asarray(value)
    except Exception:
        return None
    if isinstance(value, (bool, np.bool_)) or x.shape != () or x.dtype.kind not in "iuf":
        return None
    return x


def _check_tolerance(name: str, tol) -> None:
    """Refuse a tolerance that is not one finite number > 0 (when it has a value): the PID
    controller ran with ``rtol=-1`` and returned a result 9e-5 off, without a word."""
    if tol is None or isinstance(tol, jax.core.Tracer):
        return
    x = _real_scalar(tol)
    if x is None:
        raise ValueError(f"{name} must be a finite number > 0 (a tolerance), got {tol!r}")
    if not (math.isfinite(float(x)) and float(x) > 0):
        raise ValueError(f"{name} must be a finite number > 0 (a tolerance), got {tol!r}")


#: The diffrax objects ``integrate_diffrax`` takes: argument, type, an example.
_DIFFRAX_TYPES = (
    ("solver", diffrax.AbstractSolver, "diffrax.Tsit5()"),
    ("saveat", diffrax.SaveAt, "diffrax.SaveAt(ts=[...])"),
    ("stepsize_controller", diffrax.AbstractStepSizeController, "diffrax.PIDController(...)"),
    ("adjoint", diffrax.AbstractAdjoint, "diffrax.RecursiveCheckpointAdjoint()"),
)


def check_diffrax_options(**options) -> None:
    """Refuse a ``solver``, ``saveat``, ``stepsize_controller`` or ``adjoint`` that is not
    ``None`` or a diffrax object of its kind, by name: ``solver="tsit5"`` failed with
    ``'str' object has no attribute 'term_structure'``, ``saveat=[0.0, 1.0]`` with ``'list'
    object has no attribute 'subs'``, from inside diffrax or the dtype cast."""
    for name, kind, example in _DIFFRAX_TYPES:
        value = options.get(name)
        if value is not None and not isinstance(value, kind):
            raise TypeError(
                f"{name} must be None or a diffrax.{kind.__name__} "
                f"such as {example}, got {value!r} ({type(value).__name__})"
            )


#: ``integrate_diffrax``'s tolerances when none are given.
DEFAULT_RTOL, DEFAULT_ATOL = 1e-6, 1e-8
#: diffrax's default error norm (``optimistix.rms_norm``), as its controller holds it.
_DIFFRAX_NORM = diffrax.PIDController(rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL).norm


@jax.custom_jvp
def _sum_of_squares_root(x: PyTree) -> jax.Array:
    leaves = [jnp.asarray(a) for a in jax.tree.leaves(x)]
    squares = [jnp.sum(jnp.real(jnp.conj(a) * a)) for a in leaves if a.size]
    return jnp.sqrt(sum(squares[1:], squares[0]))


@_sum_of_squares_root.defjvp
def _sum_of_squares_root_jvp(primals, tangents):
    (x,), (tx,) = primals, tangents
    out = _sum_of_squares_root(x)
    # zero rather than NaN where the norm is 0 or inf, as optimistix's norms do
    flat = (out == 0) | jnp.isinf(out)
    scale = jnp.where(flat, 1, out)
    dots = [
        jnp.sum(jnp.real(jnp.conj(a) * b)) / scale
        for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(tx))
        if jnp.size(a)
    ]
    return out, jnp.where(flat, 0, sum(dots[1:], dots[0]))


def blockwise_rms_norm(x: PyTree) -> jax.Array:
    """The root mean square of every element of every leaf of ``x``: ``optimistix.rms_norm``
    (diffrax's default error norm), each leaf reduced over its own axes rather than
    flattened first. On a field sharded over a mesh a flattened leaf is one vector that
    every device needs whole: XLA gathered each field of a shallow-water state onto every
    device at every step of an adaptive solve; reduced in place, each device sums its
    block and only the sums travel."""
    leaves = jax.tree.leaves(x)
    size = sum(int(np.size(a)) for a in leaves)
    if size == 0:
        dtype = jnp.result_type(*leaves) if leaves else jnp.result_type(float)
        return jnp.zeros((), jnp.finfo(dtype).dtype)
    return _sum_of_squares_root(x) / math.sqrt(size)


def default_controller(rtol=None, atol=None, norm=None, dtype=None) -> diffrax.PIDController:
    """``integrate_diffrax``'s step-size controller: PID at ``rtol``/``atol`` (default
    ``DEFAULT_RTOL``/``DEFAULT_ATOL``), with diffrax's own norm unless ``norm`` is given.
    The tolerances are arrays in ``dtype`` (the state's; weakly typed when ``None``), like the
    times: diffrax's compiled solve takes a Python number in the controller as static, and
    every new tolerance compiled the whole solve again."""
    rtol, atol = _tolerances_in_dtype(
        dtype, DEFAULT_RTOL if rtol is None else rtol, DEFAULT_ATOL if atol is None else atol
    )
    return diffrax.PIDController(rtol=rtol, atol=atol, **({} if norm is None else {"norm": norm}))


def controller_for_sharded_fields(controller):
    """``controller`` with diffrax's default error norm (``optimistix.rms_norm``, which flattens
    every field) replaced by [`blockwise_rms_norm`][], the same quantity reduced in place,
    for a solve whose state is split over a mesh; a ``PIDController`` inside a
    ``ClipStepSizeController`` too. Any other norm, or controller, is kept as given."""
    if isinstance(controller, diffrax.PIDController) and controller.norm is _DIFFRAX_NORM:
        return eqx.tree_at(lambda c: c.norm, controller, blockwise_rms_norm)
    if isinstance(controller, diffrax.ClipStepSizeController):
        inner = controller_for_sharded_fields(controller.controller)
        if inner is not controller.controller:
            return eqx.tree_at(lambda c: c.controller, controller, inner)
    return controller


#: How far (relative) the span ``t1 - t0`` may move when the times are held in the state's
#: dtype: float32 round-off of a span is ~6e-8; a span moved more is another span.
SPAN_RTOL = 1e-3


def check_time_span(t0: float, t1: float, dtype, unit: str = "") -> None:
    """Refuse times ``t0``, ``t1`` (numbers with values) whose span ``t1 - t0`` in ``dtype``,
    where the solve holds them, differs from the span given by more than ``SPAN_RTOL`` of
    it, or that ``dtype`` resolves, between them, more coarsely than ``SPAN_RTOL`` of the
    span (half the spacing of its numbers there): far from 0 a float32 time is coarse (64 s
    apart at 1e9 s), and a float32 solve from 1e9 to 1e9 + 30 took no step and returned the
    initial state as the state at ``t1``."""
    t0_held, t1_held = (float(np.asarray(t).astype(dtype)) for t in (t0, t1))
    span, held = float(t1) - float(t0), t1_held - t0_held
    if abs(held - span) > SPAN_RTOL * abs(span):
        raise ValueError(
            f"t0={t0!r} and t1={t1!r} are {t0_held!r} and {t1_held!r} in the state's dtype "
            f"{np.dtype(dtype)}, a span t1 - t0 of {held!r}{unit} instead of {span!r}{unit}: "
            f"count the times from a nearer origin (e.g. t0=0) or use float64"
        )
    # The solver's times between t0 and t1 are held in dtype too: a float32 solve from 1e6
    # to 1e6 + 1 (times 0.0625 apart there) took steps t + dt that rounded back to t until
    # it reached max_steps.
    far = max(abs(t0_held), abs(t1_held))
    apart = float(np.spacing(np.asarray(far, dtype)))
    if span != 0 and apart / 2 > SPAN_RTOL * abs(span):
        raise ValueError(
            f"t0={t0!r} and t1={t1!r}: the state's dtype {np.dtype(dtype)} holds times near "
            f"{far!r}{unit} only {apart!r}{unit} apart, {100 * apart / abs(span):.3g}% of the "
            f"span t1 - t0 = {span!r}{unit}, so the solver's steps would be rounded to that: "
            f"count the times from a nearer origin (e.g. t0=0) or use float64"
        )


def _time_value(name: str, t, dtype) -> float | None:
    """``t`` held in ``dtype`` (as given when ``None``) as a float, refusing anything but one
    finite real number that stays finite in ``dtype``; ``None`` for ``None`` and for a traced
    ``t`` (refused as well when it is not one number)."""
    if t is None:
        return None
    if isinstance(t, jax.core.Tracer):
        if t.shape != () or not jnp.issubdtype(t.dtype, jnp.number) or jnp.iscomplexobj(t):
            raise ValueError(f"{name} must be one finite number, got a traced {t.aval}")
        return None
    x = _real_scalar(t)
    if x is None or not math.isfinite(float(x)):
        raise ValueError(f"{name} must be a finite number, got {t!r}")
    with np.errstate(over="ignore"):
        held = float(x if dtype is None else x.astype(dtype))
    if not math.isfinite(held):
        raise ValueError(f"{name} must be finite in the state's dtype {np.dtype(dtype)}, got {t!r}")
    return held


def _check_step_times(t0, dt, dtype, n_steps: int = 0) -> None:
    """Refuse a ``t0`` or ``dt`` of the fixed-step loops that is not one finite real number
    (also in ``dtype``, the state's), and a ``dt`` that is zero there: ``dt=nan`` returned
    NaN, ``dt=0`` the state unchanged, ``dt="0.1"`` ran, and a ``t0`` of two values made
    the time a vector, each without a word. A negative ``dt`` steps back in time. With
    ``n_steps``, also refuse step times the dtype cannot hold (``_check_step_times_held``)."""
    for name, t in (("t0", t0), ("dt", dt)):
        if t is None:
            raise ValueError(f"{name} must be a finite number, got None")
    start = _time_value("t0", t0, dtype)
    step = _time_value("dt", dt, dtype)
    if step == 0:
        underflow = float(np.asarray(dt)) != 0
        raise ValueError(
            f"dt must be a nonzero number (negative to step back in time), got {dt!r}"
            + (f", which is 0 in the state's dtype {np.dtype(dtype)}" if underflow else "")
        )
    if dtype is not None and start is not None and step is not None and n_steps:
        _check_step_times_held(t0, dt, n_steps, dtype)


#: How far (relative to ``|dt|``) the fixed-step loops may hold a step's time ``t0 + k dt``
#: from its value, computing it in the state's dtype.
STEP_TIME_RTOL = 1e-2


def _check_step_times_held(t0, dt, n_steps: int, dtype) -> None:
    """Refuse ``t0``, ``dt`` whose step times ``t0 + k dt`` (k = 0 … ``n_steps``), computed in
    ``dtype`` as the loops compute them, are more than ``STEP_TIME_RTOL`` of ``|dt|`` off: a
    float32 run from ``t0=1e9`` with ``dt=30`` held its times 64 s apart and integrated a
    forcing 19% wrong without a word. Checked at the first and last 4096 steps (the
    coarsest times are at an end)."""
    n = int(n_steps)
    k = np.arange(n + 1)
    if n >= 8192:
        k = np.concatenate([k[:4096], k[-4096:]])
    exact = float(np.asarray(t0)) + k * float(np.asarray(dt))
    with np.errstate(over="ignore", invalid="ignore"):
        held = np.asarray(t0, dtype) + k.astype(dtype) * np.asarray(dt, dtype)
    error = np.abs(held.astype(np.float64) - exact)  # inf or nan where dtype overflows
    worst = int(np.argmax(np.where(np.isfinite(error), error, np.inf)))
    if not error[worst] <= STEP_TIME_RTOL * abs(float(np.asarray(dt))):
        raise ValueError(
            f"t0={t0!r} with dt={dt!r}: the state's dtype {np.dtype(dtype)} holds step "
            f"{int(k[worst])}'s time {float(exact[worst])!r} as {float(held[worst])!r}, "
            f"{error[worst]:.3g} off, more than {STEP_TIME_RTOL:.0%} of dt: count the times "
            f"from a nearer origin (e.g. t0=0) or use float64"
        )


def _check_times(t0, t1, dt0, dtype) -> None:
    """Refuse, when they have values, a ``t0``, ``t1`` or ``dt0`` that is not one finite real
    number (also in ``dtype``, the state's, when given) and a ``dt0`` that is zero or points
    away from ``t1``: diffrax returned ``y0`` unchanged for ``t1=nan`` without a word, and
    stopped with an ``EquinoxRuntimeError`` after compiling for ``t1=inf``, ``dt0=0`` or a
    ``dt0`` of the wrong sign."""
    values = {}
    for name, t in (("t0", t0), ("t1", t1), ("dt0", dt0)):
        held = _time_value(name, t, dtype)
        if held is not None:
            values[name] = held
    if dtype is not None and {"t0", "t1"} <= values.keys():
        check_time_span(t0, t1, dtype)
    d = values.get("dt0")
    if d is not None:
        span = values["t1"] - values["t0"] if {"t0", "t1"} <= values.keys() else None
        if d == 0 or (span is not None and span * d < 0):
            raise ValueError(
                f"dt0 must be a nonzero number with the sign of t1 - t0 = "
                f"{'t1 - t0' if span is None else span}, got {dt0!r}"
            )


def _count(name: str, n, minimum: int, also: str = "") -> int:
    """``n`` as an ``int``, refusing a traced value (it sets the length of a compiled loop)
    and anything but an integer (Python or NumPy) ``>= minimum``; ``also`` names what else
    the caller accepts (e.g. ``" or None (no limit)"``)."""
    if isinstance(n, jax.core.Tracer):
        raise ValueError(
            f"{name} must be a fixed integer, not a traced value: it sets the length of the "
            f"compiled loop; inside jax.jit pass it as a static argument "
            f"(static_argnums/static_argnames) or close over a Python int"
        )
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < minimum:
        need = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {need}{also}, got {n!r}")
    return int(n)


def _steps(k, dt):
    """A step count ``k`` (an integer array) in the dtype of ``dt``, as ``k * dt`` converts it:
    written out, so that it also runs where ``jax_numpy_dtype_promotion`` is ``"strict"``
    (which refused the implicit integer-to-float promotion)."""
    return jnp.asarray(k, jnp.result_type(dt))


def _check_block(block):
    """Refuse a ``block`` that is not ``None`` or a pair ``(S, step_S)`` of a positive
    integer and a callable: ``S=2.5`` failed in the scan with "'float' object cannot be
    interpreted as an integer", ``S="2"`` with "'>' not supported between ... 'str' and
    'int'", naming neither ``block``. Returns the pair with ``S`` a Python ``int``."""
    if block is None:
        return None
    ok = isinstance(block, tuple) and len(block) == 2
    if ok:
        S, step_S = block
        ok = (
            isinstance(S, (int, np.integer))
            and not isinstance(S, (bool, np.bool_))
            and S >= 1
            and callable(step_S)
        )
    if not ok:
        raise TypeError(
            f"block must be None or a pair (S, step_S) of a positive integer S and a "
            f"function step_S(y, ts, dt) that takes S steps, got {block!r}"
        )
    # a Python int: a NumPy one would be traced by the compiled loop, which needs S static
    return int(block[0]), block[1]


def advance(step: Callable, y: PyTree, t0, dt, n_steps: int, block: Block | None = None) -> PyTree:
    """Apply ``step(y, t, dt)`` ``n_steps`` times inside one ``lax.scan``.

    Time is ``t0 + k dt`` (not accumulated), so it carries no round-off drift. With
    ``block = (S, step_S)``, where ``step_S(y, ts, dt)`` applies ``S`` steps from the times
    ``ts`` (a tuple), the steps are taken ``S`` at a time and the last ``n_steps mod S`` one
    at a time; ``step_S`` must do what ``S`` calls of ``step`` do.

    ``n_steps`` is an integer ``>= 0`` (0 returns ``y``) known when tracing: under
    ``jax.jit`` a static argument, not a traced one. ``t0`` and ``dt`` are each one finite
    number (``dt`` nonzero, negative to step back in time; a ``ValueError`` otherwise), taken
    in the dtype of ``y``'s floating leaves when they share one; step times that dtype holds
    more than 1% of ``dt`` off (float32 far from ``t0=0``: its times are 64 s apart at
    1e9 s) are refused too. ``block`` is ``None`` or such a
    pair, ``S`` a positive integer (a ``TypeError`` otherwise).

    Under reverse-mode differentiation (``jax.grad``, ``jax.vjp``) the loop is checkpointed:
    the steps run in blocks of ``ceil(sqrt(n_steps))`` under ``jax.checkpoint``, so that the
    backward pass stores the state at the start of each block and one block's
    intermediates at a time, ``O(sqrt(n_steps))`` states rather than every intermediate of
    every step, for one more forward pass; results, and the forward run, are unchanged.
    """
    n_steps = _count("n_steps", n_steps, 0)
    block = _check_block(block)
    dtype = _time_dtype(y)
    _check_step_times(t0, dt, dtype, n_steps)
    t0, dt = _in_dtype(dtype, t0, dt)
    return _advance(step, y, t0, dt, n_steps, block)


def checkpoint_length(n: int) -> int:
    """Iterations per checkpointed block of a loop of ``n``: ``ceil(sqrt(n))`` (at least 1)."""
    return math.isqrt(n - 1) + 1 if n > 1 else 1


def _scan(body, y, start: int, n: int, every: int = 0):
    """``lax.scan(body, y, jnp.arange(start, start + n))`` for ``body(y, k) -> (y, out)``,
    with ``every >= 2``: in blocks of ``every`` iterations (the last one shorter when
    ``every`` does not divide ``n``), each under ``jax.checkpoint``.

    Reverse-mode differentiation through a plain ``lax.scan`` stores every intermediate of
    every iteration (a shallow-water step: ~40 field-sized buffers); through the blocks, it
    stores the carry at the start of each block and, while it runs back through one block,
    that block's intermediates, which it computes again from the block's start: memory
    ~ ``n / every`` carries + ``every`` iterations' intermediates, for one more evaluation
    of the loop. Outside differentiation ``jax.checkpoint`` does nothing: the same
    iterations run on the same values, giving the same results to the bit."""
    if every < 2 or n == 0:
        return lax.scan(body, y, jnp.arange(start, start + n))
    blocks, rest = divmod(n, every)

    def iterations(y, ks):
        return lax.scan(body, y, ks)

    # the last, shorter block checkpointed too: a frame of 100 steps in blocks of 40 would
    # otherwise keep every intermediate of its last 20 steps, in every frame
    iterations = jax.checkpoint(iterations, prevent_cse=False)
    # the outputs of no iteration: their types (and, inside shard_map, how they vary over
    # the mesh), with no computation
    _, empty = lax.scan(body, y, jnp.arange(start, start))
    if not jax.tree.leaves(empty):
        if blocks:

            def block(y, b):
                return iterations(y, start + b * every + jnp.arange(every))

            y, _ = lax.scan(block, y, jnp.arange(blocks))
        if rest:
            y, _ = iterations(y, jnp.arange(start + blocks * every, start + n))
        return y, empty  # no arrays: None (advance's loops) or an empty container
    if not rest:  # the blocks' outputs stacked by their scan, as one (n, ...) array

        def block_stacked(y, b):
            return iterations(y, start + b * every + jnp.arange(every))

        y, out = lax.scan(block_stacked, y, jnp.arange(blocks))
        return y, jax.tree.map(lambda a: a.reshape((n,) + a.shape[2:]), out)
    # With a last, shorter block, the outputs (integrate's frames) are written in place into
    # one buffer of n carried by the loop over blocks: stacked by the blocks' scan and then
    # concatenated with the last block's, all of them were copied once more, doubling the
    # peak memory of a forward run's frames. (Under differentiation this buffer and its
    # cotangent cost one more frames-sized buffer than the stacked outputs.)
    buf = jax.tree.map(
        lambda e: lax.pad(e, jnp.zeros((), e.dtype), [(0, n, 0)] + [(0, 0, 0)] * (e.ndim - 1)),
        empty,
    )

    def put(buf, out, offset):
        return jax.tree.map(lambda b, o: lax.dynamic_update_slice_in_dim(b, o, offset, 0), buf, out)

    if blocks:

        def block_out(carry, b):
            y, buf = carry
            y, out = iterations(y, start + b * every + jnp.arange(every))
            return (y, put(buf, out, b * every)), None

        (y, buf), _ = lax.scan(block_out, (y, buf), jnp.arange(blocks))
    if rest:
        y, out = iterations(y, jnp.arange(start + blocks * every, start + n))
        buf = put(buf, out, blocks * every)
    return y, buf


# Called eagerly (a user's loop over chunks of a run), a bare lax.scan traced and compiled
# the step at every call (75 ms for 100 steps of a 1000-element state); compiled once per
# step function, shapes and step count, and traced inline under an outer jit, grad or vmap.
@eqx.filter_jit
def _advance(step, y, t0, dt, n_steps, block, every=None):
    """``every``: steps per checkpointed block (``None``: ``checkpoint_length(n_steps)``,
    0: none); with a ``block`` of ``S`` steps, counted in units of ``S`` steps."""
    if every is None:
        every = checkpoint_length(n_steps)

    def body(y, k):
        return step(y, t0 + _steps(k, dt) * dt, dt), None

    done = 0
    if block is not None and block[0] > 1 and n_steps >= block[0]:
        S, step_S = block

        def body_S(y, k):
            return step_S(y, tuple(t0 + _steps(k * S + j, dt) * dt for j in range(S)), dt), None

        done = n_steps // S * S
        y, _ = _scan(body_S, y, 0, n_steps // S, -(-every // S))
    if done < n_steps:
        y, _ = _scan(body, y, done, n_steps - done, every)
    return y


def integrate(
    step: Callable,
    y0: PyTree,
    t0,
    dt,
    n_frames: int,
    save_every: int,
    observe: Callable = _identity,
    block: Block | None = None,
) -> PyTree:
    """Advance ``n_frames × save_every`` steps, returning ``observe(state)`` after every
    ``save_every`` steps stacked on a leading axis (``y0`` is not included). ``block``: as
    for ``advance``. ``n_frames`` (``>= 0``) and ``save_every`` (``>= 1``) are integers known
    when tracing (static under ``jax.jit``); times as for ``advance``.

    Under reverse-mode differentiation the run is checkpointed as in ``advance``: blocks of
    about ``sqrt(n_frames × save_every)`` steps (within a frame, or whole frames)."""
    n_frames = _count("n_frames", n_frames, 0)
    save_every = _count("save_every", save_every, 1)
    block = _check_block(block)
    dtype = _time_dtype(y0)
    _check_step_times(t0, dt, dtype, n_frames * save_every)
    t0, dt = _in_dtype(dtype, t0, dt)
    return _integrate(step, y0, t0, dt, n_frames, save_every, observe, block)


@eqx.filter_jit
def _integrate(step, y0, t0, dt, n_frames, save_every, observe, block):
    # Blocks of about sqrt(n) of the n steps: within each frame's steps when a frame is
    # that long, else of whole frames (one level of checkpoints, so one more evaluation of
    # the run in all, with a frame every step or one frame at the end).
    every = checkpoint_length(n_frames * save_every)
    inner = every if save_every >= every else 0
    frames_every = 0 if inner else -(-every // save_every)

    def body(y, frame):
        t_start = t0 + _steps(frame * save_every, dt) * dt
        y = _advance(step, y, t_start, dt, save_every, block, inner)
        return y, observe(y)

    _, frames = _scan(body, y0, 0, n_frames, frames_every)
    return frames


class _VectorField(eqx.Module):
    """diffrax's ``f(t, y, args)`` from ``rhs(y, t)`` (or ``rhs(y, t, args)``): a module, so
    that the same ``rhs`` compiles once, and differentiable values travel in ``args``."""

    rhs: Callable
    with_args: bool = eqx.field(static=True)

    def __call__(self, t, y, args):
        return self.rhs(y, t, args) if self.with_args else self.rhs(y, t)


# Inputs whose right-hand side was already checked, by structure, shapes and dtypes (what
# jax.eval_shape sees): tracing the shallow-water right-hand side for the check took ~8 ms,
# half of a repeated small eager solve_diffrax call.
_CHECKED_FIELDS: dict = {}


def _shape_key(tree: PyTree):
    """A hashable key of ``tree``'s structure and of its leaves' shapes and dtypes (other
    leaves by value), or ``None`` where some part is not hashable."""
    leaves, treedef = jax.tree.flatten(tree)
    parts = []
    for leaf in leaves:
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            weak = bool(getattr(leaf, "weak_type", False))
            parts.append((tuple(np.shape(leaf)), str(jnp.result_type(leaf)), weak))
        else:
            parts.append((type(leaf), leaf))
    key = (treedef, tuple(parts))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _check_vector_field(field: _VectorField, y0: PyTree, t0, args) -> None:
    key = None
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((field, y0, t0, args))):
        key = _shape_key((field, y0, t0, args))
        if key is not None and key in _CHECKED_FIELDS:
            return
    _check_vector_field_once(field, y0, t0, args)
    if key is not None:
        if len(_CHECKED_FIELDS) >= 256:
            _CHECKED_FIELDS.clear()
        _CHECKED_FIELDS[key] = True


def _check_vector_field_once(field: _VectorField, y0: PyTree, t0, args) -> None:
    """Refuse, by tracing ``rhs`` once for shapes (nothing runs or compiles), a right-hand
    side whose output is not a tree of ``y0``'s structure and shapes with dtypes that fit
    ``y0``'s: a float64 parameter in ``args`` with a float32 state (x64 on) made diffrax fail
    deep in its stage loop ('When doing `buffer.at[i].set(value)`, then `value` must have a
    dtype that can be promoted to the same dtype as `buffer`'), naming neither."""
    out = jax.eval_shape(field, t0, y0, args)
    ins, in_tree = jax.tree_util.tree_flatten_with_path(y0)
    outs, out_tree = jax.tree_util.tree_flatten_with_path(out)
    call = "rhs(y0, t0, args)" if field.with_args else "rhs(y0, t0)"
    if in_tree != out_tree:
        raise TypeError(f"{call} must return a tree of y0's structure, {in_tree}; got {out_tree}")
    for (path, y), (_, dy) in zip(ins, outs):
        where = jax.tree_util.keystr(path) or " (the array)"
        y_dtype, y_shape = jnp.result_type(y), jnp.shape(y)
        if dy.shape != y_shape:
            raise TypeError(
                f"{call} returned shape {dy.shape} at y0{where}, whose shape is {y_shape}"
            )
        if jnp.promote_types(dy.dtype, y_dtype) != y_dtype:
            raise TypeError(
                f"{call} returned dtype {dy.dtype} at y0{where}, whose dtype is {y_dtype}: "
                f"the solve holds the state in its own dtype; return that dtype (e.g. pass "
                f"args in it, or cast with .astype(y.dtype))"
            )


def integrate_diffrax(
    rhs: RHS,
    y0: PyTree,
    t0: float,
    t1: float,
    *,
    args: PyTree = None,
    solver: diffrax.AbstractSolver | None = None,
    dt0: float | None = None,
    saveat: diffrax.SaveAt | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
    max_steps: int | None | Literal["default"] = "default",
    throw: bool = True,
) -> diffrax.Solution:
    """Integrate ``dy/dt = rhs(y, t)`` with diffrax (``rhs(y, t, args)`` when ``args`` is
    given: pass what is differentiated, e.g. a model's parameters, through ``args`` rather than
    closing over it, as ``diffrax.BacksolveAdjoint`` needs).

    Defaults: ``Tsit5`` with a PID step-size controller at ``rtol``/``atol`` (default
    ``1e-6``/``1e-8``; with a ``stepsize_controller`` of your own the tolerances are its
    own, and ``rtol``/``atol`` given as well are refused rather than ignored); pass
    ``stepsize_controller=diffrax.ConstantStepSize()`` and ``dt0`` for fixed steps, and
    ``adjoint=diffrax.RecursiveCheckpointAdjoint()`` (the default) or
    ``diffrax.BacksolveAdjoint()`` for gradients through long runs.

    ``max_steps`` defaults to 100 000, or to diffrax's own 4096 when ``saveat`` asks for
    every step (``SubSaveAt(steps=True)``) or dense output (``SaveAt(dense=True)``): diffrax
    then pads its output to ``max_steps`` frames (the dense interpolation to ``max_steps``
    steps of solver stages), which at 100 000 would be 100 000 copies of the state (79 GB
    for a 256² float32 shallow-water state). Give ``max_steps`` to choose: a positive
    integer (Python or NumPy) or ``None`` (no limit: refused by diffrax with ``steps=True``
    or dense output, and under reverse-mode ``jax.grad`` with the default adjoint, which
    must know how many steps to store). A solve that reaches it (or fails otherwise)
    raises (diffrax's ``EquinoxRuntimeError``: 'The maximum number of solver steps was
    reached'); with ``throw=False`` it returns, and ``sol.result`` says how it ended
    (``diffrax.RESULTS.successful`` or why not; with ``SaveAt(ts=...)`` the frames it did
    not reach are ``inf``, with the default ``SaveAt(t1=True)`` the one frame is the state
    where it stopped, ``sol.ts`` that time rather than ``t1``) —
    what a batch under ``vmap`` needs to keep its members that succeeded.

    ``t0``, ``t1``, ``dt0``, the ``ts`` of ``saveat`` and ``rtol``/``atol`` are taken in the
    dtype of ``y0``'s floating leaves when they share one, so that a float32 state stays
    float32 (``sol.ts`` and ``sol.ys``) with x64 on (a state whose floating leaves differ
    is promoted whole: diffrax holds every leaf in at least its times' dtype, float64 with
    x64 on, so a float32 leaf beside a float64 one comes back float64); they are arrays, so a
    new time or tolerance does not compile the solve again (Python numbers in ``args`` or in
    a controller of your own are static to diffrax's compiled solve: pass arrays to sweep
    them). When they have values (not traced), ``t0``, ``t1`` and ``dt0`` must be finite
    numbers in that dtype and ``dt0`` nonzero with the sign of ``t1 - t0``, and the span
    ``t1 - t0`` in that dtype within 0.1% of the span given, and the times between them
    held to within 0.1% of the span (far from 0, float32 times are coarse: 0.0625 apart at
    1e6); a ``ValueError`` naming the argument says so before anything compiles.
    ``solver``, ``saveat``, ``stepsize_controller`` and ``adjoint`` are ``None`` or diffrax
    objects of their kind (a ``TypeError`` otherwise). ``rhs`` is traced once for shapes
    first: an output that is not a tree of ``y0``'s structure and shapes, or has a dtype
    that does not fit ``y0``'s (float64 from a float64 ``args`` for a float32 state), is a
    ``TypeError`` naming the leaf.
    """
    check_diffrax_options(
        solver=solver, saveat=saveat, stepsize_controller=stepsize_controller, adjoint=adjoint
    )
    dtype = _time_dtype(y0)
    _check_times(t0, t1, dt0, dtype)
    t0, t1, dt0 = _in_dtype(dtype, t0, t1, dt0)
    if saveat is not None and dtype is not None:
        saveat = saveat_in_dtype(saveat, dtype)
    field = _VectorField(rhs, args is not None)
    _check_vector_field(field, y0, t0, args)
    term = diffrax.ODETerm(field)
    solver = diffrax.Tsit5() if solver is None else solver
    for name, tol in (("rtol", rtol), ("atol", atol)):
        _check_tolerance(name, tol)
    if not isinstance(throw, (bool, np.bool_)):
        raise TypeError(f"throw must be True or False, got {throw!r}")
    if stepsize_controller is None:
        stepsize_controller = default_controller(rtol, atol, dtype=dtype)
    elif rtol is not None or atol is not None:
        given = ", ".join(n for n, v in (("rtol", rtol), ("atol", atol)) if v is not None)
        raise ValueError(
            f"{given} set the tolerances of the default step-size controller; with "
            f"stepsize_controller={type(stepsize_controller).__name__}(...) give them to it "
            "instead (they would be ignored)"
        )
    kwargs = {} if adjoint is None else {"adjoint": adjoint}
    saveat = saveat or diffrax.SaveAt(t1=True)
    if isinstance(max_steps, str) and max_steps == "default":
        subs = jax.tree.leaves(saveat.subs, is_leaf=lambda x: isinstance(x, diffrax.SubSaveAt))
        # dense output is stored per step as well, in buffers of max_steps entries: at
        # 100 000 a 16² float64 solve took 5.6 GB, 17–24 GB on a 2×2 mesh
        every_step = saveat.dense or any(getattr(sub, "steps", False) for sub in subs)
        max_steps = STEPS_SAVED_MAX_STEPS if every_step else DEFAULT_MAX_STEPS
    elif max_steps is not None:
        # diffrax said 'math domain error' for -1, 'Must have at least one checkpoint' for 0,
        # and a NumPy integer failed in its trace (TracerBoolConversionError)
        max_steps = _count("max_steps", max_steps, 1, " or None (no limit)")
    return diffrax.diffeqsolve(
        term,
        solver,
        t0=t0,
        t1=t1,
        dt0=dt0,
        y0=y0,
        args=args,
        saveat=saveat,
        stepsize_controller=stepsize_controller,
        max_steps=max_steps,
        throw=throw,
        **kwargs,
    )
