"""Differential operators on functions of one point: forward-mode, bounded-memory VJP."""

import operator
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._batch import batch_second, is_eqx_chain, per_entry, second_rows
from ._jet import Form, Jet, elementwise, generic_jet, input_affine, varying_like
from ._models import AbstractNeuralField, _chain, has_own_jet

PointFn = Callable[[Float[Array, " d"]], Float[Array, "*m"]]
Spatial = int | Sequence[int] | None


# ----------------------------------------------------------------------------- validation


def _check_callable(fn, name: str = "fn") -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a callable of one point x of shape (d,), got {fn!r}.")


def _check_flags(**flags) -> None:
    """``recompute`` and ``batched`` are True or False: ``batched="no"`` (a truthy string)
    was taken as True and gave a function of a batch of points."""
    for name, value in flags.items():
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name} must be True or False, got {value!r}")


def _as_array(value, name: str) -> Array:
    """``value`` as a JAX array, or a ``TypeError`` naming ``name``: ``"ab"`` or ``None``
    raised JAX's own message, naming neither the argument nor what it takes."""
    try:
        return jnp.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be an array of numbers, got {value!r} ({error})") from None


def _check_point(x, batched: bool = False) -> Array:
    x = _as_array(x, "x")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"x must be a floating-point array to be differentiated, got dtype {x.dtype}; "
            "cast it with x.astype(float)."
        )
    if batched and x.ndim != 2:
        if x.ndim == 1:
            hint = (
                "for N points of a 1-D problem reshape them to (N, 1) (x[:, None]); for one "
                "point pass batched=False"
            )
        elif x.ndim == 0:
            hint = "for one point of a 1-D problem pass shape (1,) with batched=False"
        else:
            hint = "jax.vmap the operator over the leading axes, or reshape to (N, d)"
        raise ValueError(
            f"with batched=True, x must be a batch of points of shape (N, d), got shape "
            f"{x.shape}; {hint}."
        )
    if not batched and x.ndim != 1:
        hint = (
            "a point of a 1-D problem has shape (1,): jax.vmap over points of shape (N, 1) "
            "(x[:, None]), not (N,)"
            if x.ndim == 0
            else "use jax.vmap over points"
        )
        raise ValueError(f"x must be one point of shape (d,), got shape {x.shape}; {hint}.")
    if x.shape[-1] == 0:
        raise ValueError(f"x must have at least one coordinate (d >= 1), got shape {x.shape}.")
    return x


def _check_points(x) -> Array:
    return _check_point(x, batched=True)


def _is_bool(i) -> bool:
    return isinstance(i, bool | np.bool_) or getattr(i, "dtype", None) == np.bool_


def _check_concrete(i, name: str) -> None:
    if isinstance(i, jax.core.Tracer):
        raise TypeError(
            f"{name} must be known when the operator is traced (Python ints or a concrete "
            f"array), got the traced value {i!r}; pass it as a static argument "
            "(jax.jit(..., static_argnums=...)) rather than a jit argument, and loop over it "
            "in Python rather than under jax.vmap."
        )


def _as_index(i, name: str) -> int:
    _check_concrete(i, name)
    if _is_bool(i):
        raise TypeError(f"{name} must be an int, got the boolean {i!r}.")
    try:
        return operator.index(i)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {i!r}.") from None


def _spatial_indices(spatial: Spatial, d: int, name: str = "spatial") -> tuple[int, ...]:
    if spatial is None:
        return tuple(range(d))
    _check_concrete(spatial, name)
    if isinstance(spatial, Sequence) or getattr(spatial, "ndim", None) == 1:
        items = list(spatial)
    else:
        try:
            if _is_bool(spatial):
                raise TypeError
            items = [operator.index(spatial)]
        except TypeError:
            raise TypeError(
                f"{name} must be an int, a sequence of ints or a 1-D integer array, "
                f"got {spatial!r}."
            ) from None
    if len(items) == 0:
        raise ValueError(f"{name} must name at least one input coordinate, got {spatial!r}.")
    out = []
    for i in items:
        i = _as_index(i, f"each entry of {name}")
        if not -d <= i < d:
            raise ValueError(
                f"{name} index {i} is out of range for an input of dimension d={d} "
                f"(allowed {-d}..{d - 1})."
            )
        out.append(i % d)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} must not repeat a coordinate, got {spatial!r}.")
    return tuple(out)


def _directions(indices: Sequence[int], d: int, dtype) -> Array:
    return jnp.asarray(np.eye(d)[list(indices)], dtype=dtype)


class _ScalarInput(eqx.Module):
    """An ``equinox.nn.MLP`` with ``in_size="scalar"`` as a function of a point ``(1,)``."""

    mlp: eqx.nn.MLP

    def __call__(self, y):
        if y.shape != (1,):
            raise ValueError(
                f"fn is an equinox.nn.MLP with in_size='scalar': points must have shape (1,), "
                f"got {y.shape}"
            )
        return self.mlp(y[0])


def _point_fn(fn):
    """``fn`` as a function of one point of shape ``(d,)``."""
    if isinstance(fn, eqx.nn.MLP) and fn.in_size == "scalar":
        return _ScalarInput(fn)
    return fn


def _output_info(fn, x: Array) -> tuple[int, bool]:
    """Output size ``m`` and whether ``fn`` returns a scalar; checks the output type."""
    model = isinstance(fn, AbstractNeuralField) or (
        isinstance(fn, eqx.nn.MLP) and isinstance(fn.in_size, int)
    )
    if model and fn.in_size != x.shape[0]:
        raise ValueError(
            f"x has dimension {x.shape[0]} but the model expects in_size={fn.in_size}."
        )
    try:
        out = jax.eval_shape(fn, x)
    except (TypeError, ValueError) as err:
        kind = TypeError if isinstance(err, TypeError) else ValueError
        raise kind(f"fn could not be evaluated at a point of shape {x.shape}: {err}") from err
    if not isinstance(out, jax.ShapeDtypeStruct):
        raise TypeError(f"fn must return one array, got a {type(out).__name__}.")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(f"fn must return a floating-point array, got dtype {out.dtype}.")
    if out.ndim > 1:
        raise ValueError(
            f"fn must return a scalar or a vector of shape (m,), got shape {out.shape}."
        )
    return (1 if out.ndim == 0 else out.shape[0]), out.ndim == 0


def _component(component, m: int, scalar: bool, op: str, alternative: str | None) -> int | None:
    """Resolve which output component a scalar-valued operator acts on."""
    if component is None:
        if scalar or m == 1:
            return 0
        hint = f" or use {alternative}" if alternative else ""
        raise ValueError(
            f"{op} needs a scalar output, but fn returns shape ({m},); "
            f"pass component=i (0 <= i < {m}){hint}."
        )
    component = _as_index(component, "component")
    if not -m <= component < m:
        raise ValueError(f"component {component} is out of range for an output of size {m}.")
    return component % m


def _velocity_at(velocity, x) -> Array:
    v = velocity(x)
    try:
        return jnp.asarray(v)
    except (TypeError, ValueError):
        raise TypeError(
            f"velocity(x) must return an array of shape (k,), got a {type(v).__name__}."
        ) from None


# ----------------------------------------------------------------------------- jets


def _eqx_mlp_jet(mlp: eqx.nn.MLP, x, directions, form: Form, recompute: bool) -> Jet:
    """Jet of an ``equinox.nn.MLP`` accepted by ``is_eqx_chain`` (``depth >= 1``)."""
    first = mlp.layers[0]
    pre = input_affine(first.weight, first.bias, x, directions, form)
    steps = [(per_entry(mlp.activation), lin) for lin in mlp.layers[1:]]
    jet = _chain(pre, steps, form, recompute)
    return elementwise(per_entry(mlp.final_activation), jet, form)


def _generic(fn, x, directions, form: Form, recompute: bool) -> Jet:
    def vector_fn(y):
        return jnp.reshape(fn(y), (-1,))

    if not recompute:
        return generic_jet(vector_fn, x, directions, form)
    # The whole nested-jvp operator as one jax.checkpoint block: its backward pass keeps
    # only the point and what fn closes over, and recomputes. Not a per-point custom VJP:
    # under jax.vmap over points that would form every parameter's cotangent per point
    # before the sum (4.6x the memory of plain autodiff for a depth-2 MLP in a closure),
    # where jax.checkpoint is differentiated as the vmapped block (one contraction over
    # points). It also leaves the result differentiable in forward mode.
    return jax.checkpoint(lambda y: generic_jet(vector_fn, y, directions, form))(x)


def _jet(fn, x, indices, form: Form, recompute: bool) -> Jet:
    directions = _directions(indices, x.shape[0], x.dtype)
    if has_own_jet(fn):
        return fn.jet(x, directions, form, recompute)
    if is_eqx_chain(fn):
        return _eqx_mlp_jet(fn, x, directions, form, recompute)
    return _generic(fn, x, directions, form, recompute)


def _prepare(fn, x, batched: bool) -> tuple[Array, int, bool]:
    """Checked points and ``fn``'s output size and scalar-ness, for one point or a batch."""
    if not batched:
        x = _check_point(x)
        return x, *_output_info(fn, x)
    x = _check_points(x)
    return x, *_output_info(fn, jax.ShapeDtypeStruct(x.shape[1:], x.dtype))


def _second(fn, x, indices, form: Form, recompute: bool, batched: bool) -> Array:
    """Second-order rows of ``fn``: ``(s, m)`` at one point, ``(N, s, m)`` for a batch."""
    if batched:
        # A NumPy constant: the batch custom VJP's backward pass may be traced outside the
        # jit that traced its forward pass (e.g. jax.vjp of a jitted loss), so it must not
        # close over a traced array.
        directions = np.eye(x.shape[-1], dtype=x.dtype)[list(indices)]
        try:
            return batch_second(fn, x, directions, form, recompute)
        except TypeError as err:
            if not recompute or "forward-mode" not in str(err):
                raise
            raise TypeError(
                "a second-order operator with batched=True and recompute=True is a "
                "jax.custom_vjp and cannot be differentiated in forward mode first (jax.jvp "
                "or jax.jacfwd of it); pass recompute=False, or use the per-point operator "
                "under jax.vmap. Forward mode over reverse mode (jax.hessian, jax.jvp of "
                "jax.grad) works with recompute=True."
            ) from err
    return second_rows(_jet(fn, x, indices, form, recompute).second, form)


def _jacobian(fn, x, indices) -> tuple[Array, Array]:
    """``(fn(x), J)`` with ``J[p] = d fn / d x_{indices[p]}`` of shape ``(k, m)``, forward mode."""
    directions = varying_like(_directions(indices, x.shape[0], x.dtype), x)

    def vec(y):
        return jnp.reshape(fn(y), (-1,))

    values, jac = jax.vmap(lambda v: jax.jvp(vec, (x,), (v,)))(directions)
    return values[0], jac


# ----------------------------------------------------------------------------- operators


def laplacian(
    fn: PointFn,
    *,
    spatial: Spatial = None,
    component: int | None = None,
    recompute: bool = True,
    batched: bool = False,
) -> Callable[[Float[Array, "*n d"]], Float[Array, "*n"]]:
    """Laplacian of a scalar field over selected input coordinates, in forward mode.

    .. math:: \\Delta u(x) = \\sum_{i \\in S} \\frac{\\partial^2 u}{\\partial x_i^2}(x)

    Value, first derivatives and the Laplacian are pushed through ``fn`` in one forward pass
    (the forward Laplacian of Li et al. 2023, arXiv:2307.08214) for physjax models and
    ``equinox.nn.MLP``; any other function uses nested ``jax.jvp`` per direction. With
    ``recompute=True`` the backward pass recomputes instead of storing. With
    ``batched=True`` (the fast path for training losses) an MLP-like chain is one
    batch-level ``jax.custom_vjp`` that saves one pre-activation array per layer and forms
    each weight cotangent as one matmul over all points; any other function is a
    batch-level ``jax.custom_vjp`` that keeps its inputs and re-runs the operator under
    ``jax.vjp``. For one point, layered models use a ``jax.checkpoint`` per layer block and
    other functions one ``jax.checkpoint`` of the whole operator.

    Args:
        fn: ``R^d -> R`` or ``R^d -> R^m`` (with ``component``); a physjax model, an Equinox
            module or any jax-traceable callable of one point.
        spatial: input coordinates ``S`` to differentiate over (default: all), e.g. ``(0, 1)``
            for ``(x, y, t)`` inputs.
        component: output component for vector-valued ``fn``.
        recompute: bounded-memory backward pass (default). Set ``False`` for plain autodiff
            through the forward-mode computation, e.g. to apply ``jax.jvp`` to a
            ``batched=True`` result (a ``jax.custom_vjp`` cannot be differentiated in forward
            mode first; forward over reverse, e.g. ``jax.hessian``, works with either
            setting, and so do the per-point operators in forward mode).
        batched: return a function of a batch of points ``(N, d)`` instead of one point;
            equal to ``jax.vmap`` of the per-point function, but much faster and smaller
            under ``grad`` (``jax.vmap`` cannot route a per-point custom VJP to a batch one;
            see ``docs/gradients.md``). ``jax.vmap`` of the batched function, e.g. over an
            ensemble of models, is supported.

    Returns:
        A function of one point ``x`` of shape ``(d,)`` returning a scalar (``jax.vmap`` it
        over points), or with ``batched=True`` of points ``(N, d)`` returning ``(N,)``.
    """
    _check_callable(fn)
    _check_flags(recompute=recompute, batched=batched)

    fn = _point_fn(fn)

    def apply(x: Float[Array, "*n d"]) -> Float[Array, "*n"]:
        x, m, scalar = _prepare(fn, x, batched)
        c = _component(component, m, scalar, "laplacian", "vector_laplacian")
        idx = _spatial_indices(spatial, x.shape[-1])
        return _second(fn, x, idx, "trace", recompute, batched)[..., 0, c]

    return apply


def vector_laplacian(
    fn: PointFn, *, spatial: Spatial = None, recompute: bool = True, batched: bool = False
) -> Callable[[Float[Array, "*n d"]], Float[Array, "*n m"]]:
    """Laplacian of every output component, in one forward pass.

    .. math:: (\\Delta u)_c(x) = \\sum_{i \\in S} \\partial^2 u_c / \\partial x_i^2

    Args:
        fn: ``R^d -> R^m``; see :func:`laplacian`.
        spatial: input coordinates to differentiate over (default: all).
        recompute, batched: see :func:`laplacian`.

    Returns:
        A function of one point returning shape ``(m,)`` (a scalar if ``fn`` is scalar);
        with ``batched=True``, of points ``(N, d)`` returning ``(N, m)`` (or ``(N,)``).
    """
    _check_callable(fn)
    _check_flags(recompute=recompute, batched=batched)

    fn = _point_fn(fn)

    def apply(x: Float[Array, "*n d"]) -> Float[Array, "*n m"]:
        x, _, scalar = _prepare(fn, x, batched)
        idx = _spatial_indices(spatial, x.shape[-1])
        second = _second(fn, x, idx, "trace", recompute, batched)[..., 0, :]
        return second[..., 0] if scalar else second

    return apply


def hessian_diagonal(
    fn: PointFn,
    *,
    spatial: Spatial = None,
    component: int | None = None,
    recompute: bool = True,
    batched: bool = False,
) -> Callable[[Float[Array, "*n d"]], Float[Array, "*n k"]]:
    """Unmixed second partials ``d^2 u / d x_i^2`` for ``i`` in ``spatial``, in forward mode.

    Args:
        fn, spatial, component, recompute, batched: see :func:`laplacian`.

    Returns:
        A function of one point returning shape ``(k,)``, ``k = len(spatial)``; with
        ``batched=True``, of points ``(N, d)`` returning ``(N, k)``.
    """
    _check_callable(fn)
    _check_flags(recompute=recompute, batched=batched)

    fn = _point_fn(fn)

    def apply(x: Float[Array, "*n d"]) -> Float[Array, "*n k"]:
        x, m, scalar = _prepare(fn, x, batched)
        c = _component(component, m, scalar, "hessian_diagonal", None)
        idx = _spatial_indices(spatial, x.shape[-1])
        return _second(fn, x, idx, "diag", recompute, batched)[..., c]

    return apply


def second_partial(
    fn: PointFn,
    i: int,
    j: int,
    *,
    component: int | None = None,
    recompute: bool = True,
    batched: bool = False,
) -> Callable[[Float[Array, "*n d"]], Float[Array, "*n"]]:
    """One second partial derivative ``d^2 u / (d x_i d x_j)``, in forward mode.

    Args:
        fn, component, recompute, batched: see :func:`laplacian`.
        i, j: input coordinates (``i == j`` gives an unmixed second derivative).

    Returns:
        A function of one point returning a scalar; with ``batched=True``, of points
        ``(N, d)`` returning ``(N,)``.
    """
    _check_callable(fn)
    _check_flags(recompute=recompute, batched=batched)
    i = _as_index(i, "i")
    j = _as_index(j, "j")

    fn = _point_fn(fn)

    def apply(x: Float[Array, "*n d"]) -> Float[Array, "*n"]:
        x, m, scalar = _prepare(fn, x, batched)
        c = _component(component, m, scalar, "second_partial", None)
        (a,) = _spatial_indices(i, x.shape[-1], "i")
        (b,) = _spatial_indices(j, x.shape[-1], "j")
        if a == b:
            return _second(fn, x, (a,), "trace", recompute, batched)[..., 0, c]
        return _second(fn, x, (a, b), "mixed", recompute, batched)[..., 0, c]

    return apply


def gradient(
    fn: PointFn, *, spatial: Spatial = None, component: int | None = None
) -> Callable[[Float[Array, " d"]], Float[Array, " k"]]:
    """Gradient of a scalar field over selected coordinates, ``(d u / d x_i)_{i in S}``.

    Computed in forward mode (one ``jax.jvp`` per selected coordinate, batched).

    Args:
        fn, spatial, component: see :func:`laplacian`.

    Returns:
        A function of one point returning shape ``(k,)``.
    """
    _check_callable(fn)

    fn = _point_fn(fn)

    def apply(x: Float[Array, " d"]) -> Float[Array, " k"]:
        x = _check_point(x)
        m, scalar = _output_info(fn, x)
        c = _component(component, m, scalar, "gradient", None)
        idx = _spatial_indices(spatial, x.shape[0])
        return _jacobian(fn, x, idx)[1][:, c]

    return apply


def divergence(
    fn: PointFn, *, spatial: Spatial = None
) -> Callable[[Float[Array, " d"]], Float[Array, ""]]:
    """Divergence of a vector field, ``sum_p d u_p / d x_{S_p}``.

    Args:
        fn: ``R^d -> R^k`` with ``k = len(spatial)``; component ``p`` is differentiated along
            the ``p``-th selected coordinate.
        spatial: input coordinates (default: all, then ``k == d``).

    Returns:
        A function of one point returning a scalar.
    """
    _check_callable(fn)

    fn = _point_fn(fn)

    def apply(x: Float[Array, " d"]) -> Float[Array, ""]:
        x = _check_point(x)
        m, scalar = _output_info(fn, x)
        idx = _spatial_indices(spatial, x.shape[0])
        if m != len(idx):
            got = "a scalar" if scalar else f"shape ({m},)"
            raise ValueError(
                f"divergence needs fn to return {len(idx)} components (one per spatial "
                f"coordinate {idx}), got {got}."
            )
        return jnp.trace(_jacobian(fn, x, idx)[1])

    return apply


def time_derivative(
    fn: PointFn, *, time_index: int = -1, component: int | None = None
) -> Callable[[Float[Array, " d"]], Float[Array, "*m"]]:
    """Partial derivative along the time coordinate, ``d u / d t``, by one ``jax.jvp``.

    Args:
        fn: ``R^d -> R`` or ``R^d -> R^m``.
        time_index: which input coordinate is time (default: the last).
        component: optional output component.

    Returns:
        A function of one point returning the output's shape (a scalar with ``component``).
    """
    _check_callable(fn)
    time_index = _as_index(time_index, "time_index")

    fn = _point_fn(fn)

    def apply(x: Float[Array, " d"]) -> Float[Array, "*m"]:
        x = _check_point(x)
        m, scalar = _output_info(fn, x)
        (t,) = _spatial_indices(time_index, x.shape[0], "time_index")
        dt = _jacobian(fn, x, (t,))[1][0]
        if component is not None:
            return dt[_component(component, m, scalar, "time_derivative", None)]
        return dt[0] if scalar else dt

    return apply


def advection(
    fn: PointFn,
    velocity: Array | Callable[[Array], Array] | None = None,
    *,
    spatial: Spatial = None,
    component: int | None = None,
) -> Callable[[Float[Array, " d"]], Float[Array, "*m"]]:
    """Advective derivative ``(v . grad) u``, one ``jax.jvp`` along ``v``.

    Args:
        fn: ``R^d -> R`` or ``R^d -> R^m``.
        velocity: ``v`` over the spatial coordinates: an array ``(k,)``, a function of the
            point returning ``(k,)``, or ``None`` for self-advection ``(u . grad) u``
            (then ``fn`` must return ``k`` components).
        spatial: spatial input coordinates (default: all).
        component: optional output component.

    Returns:
        A function of one point returning the output's shape (a scalar with ``component``).
    """
    _check_callable(fn)
    if velocity is not None and not callable(velocity):
        velocity = _as_array(velocity, "velocity")

    fn = _point_fn(fn)

    def apply(x: Float[Array, " d"]) -> Float[Array, "*m"]:
        x = _check_point(x)
        m, scalar = _output_info(fn, x)
        idx = _spatial_indices(spatial, x.shape[0])
        if velocity is None:
            if m != len(idx):
                got = "a scalar" if scalar else f"output size {m}"
                raise ValueError(
                    f"advection with velocity=None uses u itself and needs fn to return "
                    f"{len(idx)} components (one per spatial coordinate {idx}), got {got}."
                )
            v = jnp.reshape(fn(x), (-1,))
        else:
            v = _velocity_at(velocity, x) if callable(velocity) else velocity
        if v.shape != (len(idx),):
            raise ValueError(
                f"velocity must have shape ({len(idx)},) (one entry per spatial coordinate), "
                f"got {v.shape}."
            )
        if not (jnp.issubdtype(v.dtype, jnp.floating) or jnp.issubdtype(v.dtype, jnp.integer)):
            # a complex velocity lost its imaginary part in the cast to the point's dtype
            raise TypeError(f"velocity must be real (a float or int array), got dtype {v.dtype}.")
        tangent = jnp.zeros_like(x).at[jnp.asarray(idx)].set(v.astype(x.dtype))
        out = jax.jvp(lambda y: jnp.reshape(fn(y), (-1,)), (x,), (tangent,))[1]
        if component is not None:
            return out[_component(component, m, scalar, "advection", None)]
        return out[0] if scalar else out

    return apply
