"""Second-order forward-mode jets: (value, Jacobian, second-order quantity) per layer.

A jet of a quantity ``h(x)`` along ``k`` input directions ``v_1..v_k`` carries

- ``value``: ``h(x)``, shape ``(w,)``;
- ``jac``: ``D h(x) v_p`` for each direction, shape ``(k, w)``;
- ``second``: a second-order quantity selected by a *form*:

  - ``"trace"``: ``sum_p D^2 h(x)[v_p, v_p]``, shape ``(w,)`` (the forward Laplacian,
    Li et al. 2023, arXiv:2307.08214);
  - ``"diag"``: ``D^2 h(x)[v_p, v_p]`` for each ``p``, shape ``(k, w)``;
  - ``"mixed"``: ``D^2 h(x)[v_1, v_2]`` (``k == 2``), shape ``(w,)``.

Every form is ``B(J, J)`` for a symmetric bilinear map ``B`` of two Jacobians, which is all the
chain rule for a second derivative needs: for ``y = sigma(h)`` elementwise,
``second_y = sigma'(h) second_h + sigma''(h) B(J_h, J_h)``.
"""

from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array

Form = Literal["trace", "diag", "mixed"]


class Jet(NamedTuple):
    """Value, directional first derivatives and second-order quantity of one array."""

    value: Array
    jac: Array
    second: Array


def bilinear(form: Form, a: Array, b: Array) -> Array:
    """The symmetric bilinear map ``B(a, b)`` of two Jacobians ``(k, w)`` for a form."""
    if form == "trace":
        # Unrolled over the k directions: XLA:CPU compiles a sum over a short leading axis
        # into a slow loop (30x on the batched path); here it saved 495 -> 470 MB temp.
        out = a[0] * b[0]
        for p in range(1, a.shape[0]):
            out = out + a[p] * b[p]
        return out
    if form == "diag":
        return a * b
    if form == "mixed":
        return 0.5 * (a[0] * b[1] + a[1] * b[0])
    raise ValueError(f"form must be 'trace', 'diag' or 'mixed', got {form!r}.")


def input_jet(x: Array, directions: Array, form: Form) -> Jet:
    """Jet of the identity map at ``x`` along the rows of ``directions`` ``(k, d)``."""
    k = directions.shape[0]
    shape = (k,) + x.shape if form == "diag" else x.shape
    return Jet(x, directions.astype(x.dtype), jnp.zeros(shape, x.dtype))


def affine(weight: Array, bias: Array | None, jet: Jet) -> Jet:
    """Jet of ``weight @ h + bias``: every component maps linearly."""
    # One matmul for all rows (value, k Jacobian rows, second-order rows): under vmap this is
    # a single GEMM with N * (k + 2) rows, forward and backward.
    k = jet.jac.shape[0]
    rows = jnp.concatenate(
        [jet.value[None], jet.jac, jnp.reshape(jet.second, (-1, jet.value.shape[0]))]
    )
    out = rows @ weight.T
    value = out[0] if bias is None else out[0] + bias
    second = out[1 + k :]
    second = second.reshape((-1,) + value.shape) if jet.second.ndim == 2 else second[0]
    return Jet(value, out[1 : 1 + k], second)


def input_affine(weight: Array, bias: Array | None, x: Array, directions: Array, form: Form) -> Jet:
    """Jet of ``weight @ x + bias`` at the input, where the second-order part is zero."""
    value = weight @ x
    if bias is not None:
        value = value + bias
    jac = directions.astype(value.dtype) @ weight.T
    k = directions.shape[0]
    shape = (k,) + value.shape if form == "diag" else value.shape
    return Jet(value, jac, jnp.zeros(shape, value.dtype))


def elementwise_derivatives(fn: Callable[[Array], Array], z: Array) -> tuple[Array, Array, Array]:
    """``(fn(z), fn'(z), fn''(z))`` of an elementwise function by nested forward mode."""
    ones = jnp.ones_like(z)

    def first(y):
        return jax.jvp(fn, (y,), (ones,))

    (value, d1), (_, d2) = jax.jvp(first, (z,), (ones,))
    return value, d1, d2


def elementwise(fn: Callable[[Array], Array], jet: Jet, form: Form) -> Jet:
    """Jet of ``fn(h)`` for an elementwise ``fn`` (the forward-Laplacian activation rule)."""
    value, d1, d2 = elementwise_derivatives(fn, jet.value)
    jac = d1 * jet.jac
    second = d1 * jet.second + d2 * bilinear(form, jet.jac, jet.jac)
    return Jet(value, jac, second)


def gate(z: Jet, u: Jet, v: Jet, form: Form) -> Jet:
    """Jet of ``(1 - z) * u + z * v`` (the modified-MLP gate) by the product rule."""
    dv = Jet(v.value - u.value, v.jac - u.jac, v.second - u.second)
    value = u.value + z.value * dv.value
    jac = u.jac + z.value * dv.jac + dv.value * z.jac
    second = (
        u.second + z.value * dv.second + dv.value * z.second + 2.0 * bilinear(form, z.jac, dv.jac)
    )
    return Jet(value, jac, second)


def _varying_axes(a: Array) -> frozenset:
    return frozenset(getattr(getattr(jax.typeof(a), "mat", None), "varying", ()))


def varying_like(a: Array, x: Array) -> Array:
    """``a`` marked as varying over the ``shard_map`` axes that ``x`` varies over.

    Inside ``shard_map`` a point varies over the mesh axes its batch is split along, the
    constant directions do not; nested ``jax.jvp`` along such directions, vmapped over points
    in a ``jax.checkpoint`` or differentiated, failed JAX's check that both operands of a
    product vary over the same axes ("Primitive mul requires varying manual axes to match").
    Outside ``shard_map`` ``a`` is returned unchanged.
    """
    axes = _varying_axes(x) - _varying_axes(a)
    return jax.lax.pcast(a, tuple(sorted(axes)), to="varying") if axes else a


def generic_jet(fn: Callable[[Array], Array], x: Array, directions: Array, form: Form) -> Jet:
    """Jet of any traceable ``fn`` by nested ``jax.jvp`` (forward mode), one pass per direction.

    ``fn`` maps ``(d,)`` to ``(m,)``. ``D^2 fn[v, w]`` is the tangent of the tangent of
    ``jvp(jvp(fn, v), w)``; the directions are batched with ``vmap``.
    """

    def pair(v, w):
        def inner(y):
            return jax.jvp(fn, (y,), (v,))

        (value, dv), (_, d2) = jax.jvp(inner, (x,), (w,))
        return value, dv, d2

    directions = varying_like(directions.astype(x.dtype), x)
    if form == "mixed":
        value, d0, d01 = pair(directions[0], directions[1])
        d1 = jax.jvp(fn, (x,), (directions[1],))[1]
        return Jet(value, jnp.stack([d0, d1]), d01)
    values, jac, d2 = jax.vmap(pair)(directions, directions)
    second = jnp.sum(d2, axis=0) if form == "trace" else d2
    return Jet(values[0], jac, second)
