"""Second-order jets of a whole batch of points, with a batch-level ``jax.custom_vjp``.

For an MLP-like chain ``x -> W_1 x + b_1 -> s -> W_2 . + b_2 -> ... -> W_L . + b_L`` the
forward Laplacian of all ``N`` points is carried as one array of *rows* per layer, shape
``(R, N, w)`` with ``R = 1 + k + s``: the value, the ``k`` directional derivatives and the
``s`` second-order rows (``s = 1`` for the trace and the mixed form, ``k`` for the diagonal).
Each dense layer is ONE matmul ``(R N, w) @ W^T``; each activation is elementwise on the rows.
The first layer's Jacobian ``D W_1^T`` is the same for every point and its second-order part
is zero, so it is one ``(k, w)`` array, never stored or multiplied per point.

The custom VJP of the chain saves the first layer's pre-activation ``(N, w)`` and the
pre-activation rows of every later layer ``(R, N, w)``, nothing else (no activation
derivatives, no post-activation rows). The backward pass walks the layers from the top,
recomputes one layer's activation rows at a time and forms each weight cotangent as ONE
matmul contracting over points and rows, so no per-point weight cotangent ever exists.

The elementwise rules work on Python lists of ``(N, w)`` rows, never reducing over the
short row axis: XLA:CPU compiles a sum over a leading axis of length 2 into a loop about
30x slower than the equivalent ``a[0] * a[0] + a[1] * a[1]`` (measured 58 ms vs 1.9 ms).
"""

import functools
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ._jet import Form, elementwise_derivatives, generic_jet
from ._models import MLP, FourierMLP, has_own_jet
from ._remat import closure_convert, recompute_block

Activation = Callable[[Array], Array]


def second_rows(second: Array, form: Form) -> Array:
    """Per-point second-order part as ``(s, m)`` rows (``(m,)`` for trace/mixed forms)."""
    return second if form == "diag" else second[None]


# ----------------------------------------------------------------------------- row rules


def _bilinear(form: Form, jac: Sequence[Array]) -> list[Array]:
    """``B(J, J)`` as a list of ``s`` second-order rows from the ``k`` Jacobian rows."""
    if form == "trace":
        return [functools.reduce(jnp.add, [j * j for j in jac])]
    if form == "diag":
        return [j * j for j in jac]
    return [jac[0] * jac[1]]


def _bilinear_pullback(form: Form, jac: Sequence[Array], g: Sequence[Array]) -> list[Array]:
    """Cotangents of the Jacobian rows from ``B(J, J)`` with cotangent rows ``g``."""
    if form == "trace":
        return [2.0 * j * g[0] for j in jac]
    if form == "diag":
        return [2.0 * j * gp for j, gp in zip(jac, g, strict=True)]
    return [jac[1] * g[0], jac[0] * g[0]]


def _derivatives3(fn: Activation, z: Array) -> tuple[Array, Array, Array, Array]:
    """``fn`` and its first three derivatives at ``z``, by nested forward mode."""
    ones = jnp.ones_like(z)
    (value, d1, d2), (_, _, d3) = jax.jvp(lambda y: elementwise_derivatives(fn, y), (z,), (ones,))
    return value, d1, d2, d3


def _split(rows: Array, k: int) -> tuple[Array, list[Array], list[Array]]:
    return rows[0], [rows[1 + p] for p in range(k)], [rows[i] for i in range(1 + k, len(rows))]


def activation_rows(fn: Activation, rows: Array, k: int, form: Form) -> Array:
    """Rows ``(R, N, w)`` of ``s(h)`` from rows of ``h``: the forward-Laplacian rule.

    ``s(z)``, ``s'(z) J_p`` and ``s'(z) S + s''(z) B(J, J)``.
    """
    z, jac, second = _split(rows, k)
    value, d1, d2 = elementwise_derivatives(fn, z)
    out = [d1 * sr + d2 * b for sr, b in zip(second, _bilinear(form, jac), strict=True)]
    return jnp.stack([value] + [d1 * j for j in jac] + out)


def first_activation_rows(fn: Activation, z: Array, jac: Array, form: Form) -> Array:
    """Rows of ``s(z)`` for ``z = W x + b`` ``(N, w)``: Jacobian ``jac`` ``(k, w)`` shared."""
    value, d1, d2 = elementwise_derivatives(fn, z)
    jac = list(jac)
    return jnp.stack([value] + [d1 * j for j in jac] + [d2 * b for b in _bilinear(form, jac)])


def activation_rows_pullback(
    fn: Activation, rows: Array, cot: Array, k: int, form: Form
) -> tuple[Array, Array]:
    """``activation_rows(fn, rows)`` and its VJP applied to the cotangent rows ``cot``.

    ``g_S = s' g_{S'}``, ``g_J = s' g_{J'} + s'' (dB/dJ)^T g_{S'}`` and
    ``g_z = s' g_{h} + s'' (g_{J'} . J + g_{S'} . S) + s''' g_{S'} . B``.
    """
    z, jac, second = _split(rows, k)
    g_v, g_jac, g_second = _split(cot, k)
    value, d1, d2, d3 = _derivatives3(fn, z)
    b = _bilinear(form, jac)
    out = [value] + [d1 * j for j in jac]
    out += [d1 * sr + d2 * br for sr, br in zip(second, b, strict=True)]
    dots = [gj * j for gj, j in zip(g_jac, jac, strict=True)]
    dots += [gs * sr for gs, sr in zip(g_second, second, strict=True)]
    curv = [gs * br for gs, br in zip(g_second, b, strict=True)]
    g_z = d1 * g_v + d2 * functools.reduce(jnp.add, dots) + d3 * functools.reduce(jnp.add, curv)
    pulled = _bilinear_pullback(form, jac, g_second)
    g_rows = [g_z] + [d1 * gj + d2 * pj for gj, pj in zip(g_jac, pulled, strict=True)]
    g_rows += [d1 * gs for gs in g_second]
    return jnp.stack(out), jnp.stack(g_rows)


def first_activation_pullback(
    fn: Activation, z: Array, jac: Array, cot: Array, form: Form
) -> tuple[Array, Array, Array]:
    """``first_activation_rows`` and its VJP: cotangents of ``z`` ``(N, w)``, ``jac`` ``(k, w)``."""
    k = jac.shape[0]
    jac = list(jac)
    g_v, g_jac, g_second = _split(cot, k)
    value, d1, d2, d3 = _derivatives3(fn, z)
    b = _bilinear(form, jac)
    out = jnp.stack([value] + [d1 * j for j in jac] + [d2 * br for br in b])
    dots = [gj * j for gj, j in zip(g_jac, jac, strict=True)]
    curv = [gs * br for gs, br in zip(g_second, b, strict=True)]
    g_z = d1 * g_v + d2 * functools.reduce(jnp.add, dots) + d3 * functools.reduce(jnp.add, curv)
    summed = [jnp.sum(d2 * gs, axis=0) for gs in g_second]
    pulled = _bilinear_pullback(form, jac, summed)
    g_jac_in = jnp.stack(
        [jnp.sum(d1 * gj, axis=0) + pj for gj, pj in zip(g_jac, pulled, strict=True)]
    )
    return out, g_z, g_jac_in


def affine_rows(weight: Array, bias: Array | None, rows: Array) -> Array:
    """Rows of ``W h + b``: one matmul over all ``R N`` rows; the bias enters the value only."""
    r, n, w = rows.shape
    out = jnp.reshape(jnp.reshape(rows, (r * n, w)) @ weight.T, (r, n, weight.shape[0]))
    if bias is None:
        return out
    # A broadcast add (fused into its consumers), not an in-place update of row 0 (a copy).
    pad = jnp.zeros((r - 1, 1) + bias.shape, bias.dtype)
    return out + jnp.concatenate([bias[None, None], pad])


# ----------------------------------------------------------------------------- chains


def is_eqx_chain(fn) -> bool:
    """Whether ``fn`` is an ``equinox.nn.MLP`` that the layer rules reproduce exactly.

    Other ``equinox.nn.MLP``s take the generic path: ``in_size="scalar"``, ``depth=0`` (one
    linear layer, no final activation), ``scan=True`` (stacked hidden layers), activations
    holding arrays (one copy per layer and unit, e.g. ``equinox.nn.PReLU``) and subclasses
    that override ``__call__``.
    """
    return (
        isinstance(fn, eqx.nn.MLP)
        and type(fn).__call__ is eqx.nn.MLP.__call__
        and isinstance(fn.in_size, int)
        and fn.depth >= 1
        and not fn.scan
        and not any(eqx.is_array(a) for a in jax.tree.leaves((fn.activation, fn.final_activation)))
    )


def per_entry(fn: Activation) -> Activation:
    """``fn`` applied to each scalar entry separately, as ``equinox.nn.MLP`` applies it."""

    def apply(z: Array) -> Array:
        f = fn
        for _ in range(z.ndim):
            f = jax.vmap(f)
        return f(z)

    return apply


def is_chain(fn) -> bool:
    """Whether ``fn`` is an MLP-like chain with the hand-written batch VJP.

    The rule rebuilds the network from its layers, so it stands for ``MLP`` and
    ``FourierMLP`` themselves only: a subclass that overrides ``__call__`` or ``jet`` (its own
    hard boundary condition, a scaled output) takes the generic path, with its own ``jet``
    where it has one."""
    return any(
        isinstance(fn, cls) and type(fn).__call__ is cls.__call__ and type(fn).jet is cls.jet
        for cls in (MLP, FourierMLP)
    ) or is_eqx_chain(fn)


def _chain_parts(fn):
    """``(W_1, b_1, [(s_i, W_{i+1}, b_{i+1})], final_activation)`` of a chain model."""
    if isinstance(fn, FourierMLP):
        weight, bias = fn._embedding()
        mlp = fn.mlp
        acts = [jnp.sin] + [mlp.activation] * (len(mlp.layers) - 1)
        return weight, bias, _steps(acts, mlp.layers), None
    first = fn.layers[0]
    if isinstance(fn, eqx.nn.MLP):
        acts = [per_entry(fn.activation)] * (len(fn.layers) - 1)
        final = per_entry(fn.final_activation)
    else:
        acts, final = [fn.activation] * (len(fn.layers) - 1), None
    return first.weight, first.bias, _steps(acts, fn.layers[1:]), final


def _steps(acts, layers):
    return [(a, lin.weight, lin.bias) for a, lin in zip(acts, layers, strict=True)]


def _chain_forward(parts, x: Array, directions: Array, form: Form):
    """Output rows ``(R, N, m)`` of a chain at the points ``x`` ``(N, d)``, and saved rows."""
    weight, bias, steps, _ = parts
    k = directions.shape[0]
    z = x @ weight.T if bias is None else x @ weight.T + bias
    jac = directions @ weight.T
    saved = [z]
    act, w, b = steps[0]
    rows = affine_rows(w, b, first_activation_rows(act, z, jac, form))
    for act, w, b in steps[1:]:
        saved.append(rows)
        rows = affine_rows(w, b, activation_rows(act, rows, k, form))
    saved.append(rows)
    return rows, saved


def _finish(final: Activation | None, rows: Array, k: int, form: Form) -> Array:
    """Second-order part ``(N, s, m)`` of the chain's output rows (after a final activation)."""
    if final is not None:
        rows = activation_rows(final, rows, k, form)
    return jnp.moveaxis(rows[1 + k :], 0, 1)


def _after(x: Array, dependency: Array) -> Array:
    """``x`` (unchanged) made to depend on ``dependency``, so that XLA recomputes from it.

    ``jax.lax.optimization_barrier`` is not enough on XLA:CPU: its common-subexpression
    elimination still merged the backward pass's recomputed activation derivatives with the
    forward pass's and kept every layer's alive (measured: 646 MB instead of 336 MB temp at
    depth 4, N = 16384). Adding a zero computed from the cotangent (``0 * g``, or 0 where
    ``g`` is not finite) is exact and cannot be folded away; it also keeps the recomputation
    from being scheduled before its layer's cotangent exists.
    """
    if dependency.size == 0:  # an empty batch: nothing to recompute
        return x
    s = jnp.ravel(dependency)[0]
    zero = jnp.where(jnp.isfinite(s), s * 0, 0).astype(x.dtype)
    return x + zero


def _varying_axes(x) -> frozenset:
    mat = getattr(jax.typeof(x), "mat", None)
    return frozenset(getattr(mat, "varying", ()))


def _parameter_cotangent(cotangent: Array, primal: Array) -> Array:
    """A parameter cotangent in the parameter's dtype, summed over ``shard_map`` axes.

    The rows are computed in the promoted dtype of points and parameters (e.g. float64
    points, float32 parameters), so the cotangent is cast back. Under ``shard_map`` each
    device's weight cotangent covers its own points; the cotangent of a replicated parameter
    is their sum over the axes it varies over and the primal not (what autodiff's transpose
    of the implicit broadcast does).
    """
    extra = _varying_axes(cotangent) - _varying_axes(primal)
    if extra:
        cotangent = jax.lax.psum(cotangent, tuple(sorted(extra)))
    return cotangent.astype(primal.dtype)


def chain_second(fn, x: Array, directions: Array, form: Form, recompute: bool) -> Array:
    """Second-order part ``(N, s, m)`` of a chain model at the points ``x`` ``(N, d)``."""
    params, static = eqx.partition(fn, eqx.is_inexact_array)
    directions = directions.astype(x.dtype)
    k = directions.shape[0]
    _, _, steps0, final = _chain_parts(fn)
    acts = [a for a, _, _ in steps0]

    def arrays(p):
        weight, bias, steps, _ = _chain_parts(eqx.combine(p, static))
        return weight, bias, [(w, b) for _, w, b in steps]

    def parts(p):
        weight, bias, pairs = arrays(p)
        steps = [(a, w, b) for a, (w, b) in zip(acts, pairs, strict=True)]
        return weight, bias, steps, final

    if not recompute:
        return _finish(final, _chain_forward(parts(params), x, directions, form)[0], k, form)

    @jax.custom_vjp
    def second(p, x):
        return _finish(final, _chain_forward(parts(p), x, directions, form)[0], k, form)

    def fwd(p, x):
        rows, saved = _chain_forward(parts(p), x, directions, form)
        return _finish(final, rows, k, form), (p, x, saved)

    def bwd(res, g):
        p, x, saved = res
        (weight, bias, pairs), pull_arrays = jax.vjp(arrays, p)
        _, pull = jax.vjp(functools.partial(_finish, final, k=k, form=form), saved[-1])
        (g_rows,) = pull(g)
        z = saved[0]
        jac = directions @ weight.T
        grads = []
        for i in range(len(pairs) - 1, -1, -1):
            w, b = pairs[i]
            r, n, m = g_rows.shape
            flat_g = jnp.reshape(g_rows, (r * n, m))
            g_b = None if b is None else jnp.sum(g_rows[0], axis=0)
            g_h = jnp.reshape(flat_g @ w, (r, n, w.shape[1]))
            if i == 0:
                h, g_z, g_jac = first_activation_pullback(acts[0], _after(z, g_h), jac, g_h, form)
            else:
                rows = _after(saved[i], g_h)
                h, g_rows = activation_rows_pullback(acts[i], rows, g_h, k, form)
            grads.append((flat_g.T @ jnp.reshape(h, (r * n, h.shape[-1])), g_b))
        g_weight = g_z.T @ x.astype(g_z.dtype) + g_jac.T @ directions
        g_bias = None if bias is None else jnp.sum(g_z, axis=0)
        g_arrays = (g_weight, g_bias, grads[::-1])
        g_arrays = jax.tree.map(_parameter_cotangent, g_arrays, (weight, bias, pairs))
        (g_params,) = pull_arrays(g_arrays)
        return g_params, (g_z @ weight).astype(x.dtype)

    second.defvjp(fwd, bwd)
    return second(params, x)


# ----------------------------------------------------------------------------- dispatch


def batch_second(fn, x: Array, directions: Array, form: Form, recompute: bool) -> Array:
    """Second-order part ``(N, s, m)`` of ``fn`` at every point of ``x`` ``(N, d)``.

    Chains (physjax ``MLP``/``FourierMLP``, ``equinox.nn.MLP``) use the batch custom VJP
    above. Other physjax models vmap their per-point jet (``jax.checkpoint`` per layer block).
    Any other function is a batch-level custom VJP that keeps its inputs and re-runs the
    vmapped nested-``jvp`` operator under ``jax.vjp`` in the backward pass, so closed-over
    parameters get their cotangent from one contraction over points, not per point.
    """
    if is_chain(fn) and not (recompute and _activation_closes_over_tracers(fn)):
        return chain_second(fn, x, directions, form, recompute)
    if is_eqx_chain(fn) or not has_own_jet(fn):
        return _generic_second(fn, x, directions, form, recompute)

    def point(y):
        return second_rows(fn.jet(y, directions, form, recompute).second, form)

    return jax.vmap(point)(x)


def _activation_closes_over_tracers(fn) -> bool:
    """Whether an activation of the chain ``fn`` closes over a traced value.

    An activation such as ``lambda z: jnp.tanh(a * z)`` with a trainable slope ``a`` (an
    adaptive activation) made inside a ``jit`` or ``grad``: the chain's custom VJP cannot
    take a cotangent for a value its hand-written rules close over (JAX stopped with an
    ``UnexpectedTracerError``), so such a chain takes the per-point layer rule (physjax
    models) or the generic path (``equinox.nn.MLP``), which differentiate it.
    """
    weight, _, steps, final = _chain_parts(fn)
    acts = [a for a, _, _ in steps] + ([] if final is None else [final])
    example = jax.ShapeDtypeStruct((1,), weight.dtype)
    for act in acts:
        consts = jax.make_jaxpr(act)(example).consts
        if any(isinstance(c, jax.core.Tracer) for c in consts):
            return True
    return False


def _generic_second(fn, x: Array, directions: Array, form: Form, recompute: bool) -> Array:
    """Second-order part ``(N, s, m)`` of any function by vmapped nested ``jax.jvp``."""
    params, static = eqx.partition(fn, eqx.is_inexact_array)

    def pure(p, y):
        f = eqx.combine(p, static)
        jet = generic_jet(lambda z: jnp.reshape(f(z), (-1,)), y, directions, form)
        return second_rows(jet.second, form)

    if not recompute:
        return jax.vmap(pure, (None, 0))(params, x)
    # One point to trace at: the first, or zeros for an empty batch.
    example = x[0] if x.shape[0] else jnp.zeros(x.shape[1:], x.dtype)
    converted, consts = closure_convert(pure, params, example)

    def block(args, xs):
        p, c = args
        return jax.vmap(lambda y: converted(p, y, *c))(xs)

    return recompute_block(block, (params, consts), x)
