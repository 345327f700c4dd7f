"""Equinox neural fields with a layer-wise forward Laplacian (MLP, Fourier, modified MLP)."""

import abc
import math
from collections.abc import Callable, Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from ._jet import Form, Jet, affine, elementwise, gate, input_affine
from ._remat import apply_block

_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "tanh": jnp.tanh,
    "sin": jnp.sin,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "softplus": jax.nn.softplus,
    "sigmoid": jax.nn.sigmoid,
}


def _check_elementwise(activation: Callable[[Array], Array], dtype) -> None:
    """Refuse an activation that mixes the entries of its input (softmax, a normalisation,
    a sort, GroupSort/MaxMin's pairs).

    The forward-Laplacian layer rule takes the activation's derivatives entry by entry, so a
    function that mixes entries gave wrong (and, per point and batched, different) second
    derivatives with no error. Checked on a concrete probe, unsorted and of even length (a
    sorted probe let ``jnp.sort`` through, and one of odd length a sort of pairs): the whole
    vector against each entry alone. An activation that runs on the probe but fails on a
    single entry is refused too (an elementwise function runs on any shape). One that closes
    over a traced value (made inside a ``jit``), that cannot be evaluated on the probe, or
    that returns another shape (per-unit constants of the layer's width) is not checked.
    """
    try:
        with jax.ensure_compile_time_eval():
            probe = jnp.asarray(np.array([0.4, -1.3, 2.1, -0.2]), dtype)
            whole = jnp.asarray(activation(probe))
            if isinstance(whole, jax.core.Tracer):
                return
            whole = np.asarray(whole, np.float64)
    except Exception:  # noqa: BLE001 - not checkable on the probe; used as given
        return
    if whole.shape != probe.shape:
        return  # shaped for the layer's width (e.g. per-unit constants): not checkable here
    not_elementwise = (
        f"activation {activation!r} is not elementwise: applied to a vector it does not "
        "give its value at each entry alone (as softmax, a normalisation or a sort would "
        "not). The forward Laplacian differentiates the activation entry by entry, so its "
        "second derivatives would be wrong; pass an elementwise function."
    )
    try:
        with jax.ensure_compile_time_eval():
            alone = [jnp.asarray(activation(probe[i : i + 1])) for i in range(probe.shape[0])]
            if any(isinstance(a, jax.core.Tracer) for a in alone):
                return
            alone = [np.asarray(a, np.float64) for a in alone]
    except Exception as error:  # noqa: BLE001 - runs on a vector, not on one entry
        raise ValueError(
            f"{not_elementwise} (It runs on a vector of 4 entries but not on one entry "
            f"alone: {type(error).__name__}: {error})"
        ) from error
    tol = float(np.sqrt(jnp.finfo(probe.dtype).eps))
    if any(a.shape != (1,) for a in alone):
        return
    if not np.allclose(whole, np.concatenate(alone), rtol=tol, atol=tol):
        raise ValueError(not_elementwise)


def _resolve_activation(
    activation: str | Callable[[Array], Array], dtype=None
) -> Callable[[Array], Array]:
    if callable(activation):
        if any(eqx.is_inexact_array(a) for a in jax.tree.leaves(activation)):
            # The model keeps its activation as static configuration: arrays in it (a PReLU's
            # slope) would get no gradient and never be trained, with no error.
            raise ValueError(
                f"activation {activation!r} holds floating-point arrays, but a physjax model "
                "keeps its activation as static configuration, so they would never be "
                "trained. For a trainable activation use equinox.nn.MLP (which trains "
                "them), or build the model inside the jitted loss with an activation that "
                "closes over the parameter (lambda z: jnp.tanh(a * z)); to keep them fixed, "
                "pass a plain function (lambda z: act(z))."
            )
        _check_elementwise(activation, dtype)
        return activation
    if isinstance(activation, str) and activation in _ACTIVATIONS:
        return _ACTIVATIONS[activation]
    raise ValueError(
        f"activation must be a callable or one of {sorted(_ACTIVATIONS)}, got {activation!r}."
    )


def _is_int(n) -> bool:
    """A Python or NumPy integer (not a bool)."""
    return isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_))


def _check_sizes(in_size: int, out_size: int | str, width: int, depth: int) -> tuple:
    """The sizes, checked, as Python ints (NumPy integers accepted)."""
    if not _is_int(in_size) or in_size < 1:
        raise ValueError(f"in_size must be a positive int, got {in_size!r}.")
    if out_size != "scalar" and (not _is_int(out_size) or out_size < 1):
        raise ValueError(f"out_size must be a positive int or 'scalar', got {out_size!r}.")
    if not _is_int(width) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}.")
    if not _is_int(depth) or depth < 1:
        raise ValueError(f"depth (number of hidden layers) must be an int >= 1, got {depth!r}.")
    out = out_size if out_size == "scalar" else int(out_size)
    return int(in_size), out, int(width), int(depth)


def _check_dtype(dtype):
    """``dtype`` checked to be a real floating-point dtype (``None``: JAX's default float)."""
    if dtype is None:
        return None
    try:
        resolved = jnp.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
        raise ValueError(
            f"dtype must be a real floating-point dtype such as jnp.float32 or jnp.float64, "
            f"got {dtype!r}."
        )
    if resolved.itemsize > 4 and not jax.config.jax_enable_x64:
        # jax would make every parameter float32, with one warning per array
        raise ValueError(
            f"dtype {resolved.name} needs jax_enable_x64, which is off (the parameters would "
            f"silently be float32): call jax.config.update('jax_enable_x64', True) first, or "
            f"use dtype=jnp.float32"
        )
    return resolved


def _check_scale(scale) -> None:
    """``scale`` checked to be a positive, finite real number (a traced one is taken as is)."""
    if isinstance(scale, jax.core.Tracer):
        return
    ok = not isinstance(scale, (str, bool, np.bool_)) and np.ndim(scale) == 0
    try:
        ok = ok and np.isrealobj(scale) and bool(np.isfinite(scale) and scale > 0)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(
            f"scale (the standard deviation of the frequencies) must be a positive, finite "
            f"real number, got {scale!r}."
        )


def _chain(
    pre: Jet,
    steps: Sequence[tuple[Callable[[Array], Array], eqx.nn.Linear]],
    form: Form,
    recompute: bool,
) -> Jet:
    """Run ``pre -> linear(activation(pre))`` for each step, one recomputed block per step.

    Each block's saved input is the pre-activation jet, so the backward pass keeps one jet
    per layer and recomputes the activation and its derivatives.
    """
    for activation, linear in steps:

        def block(lin, jet, activation=activation):
            return affine(lin.weight, lin.bias, elementwise(activation, jet, form))

        pre = apply_block(block, linear, pre, recompute)
    return pre


class AbstractNeuralField(eqx.Module):
    """A network ``R^d -> R^m`` that propagates second-order jets layer by layer.

    Subclasses implement ``__call__`` (one point) and ``jet``; the operators of
    :mod:`physjax.gradients` use ``jet`` for the forward Laplacian (``jax.checkpoint`` per
    layer block; ``jax.vmap`` of it with ``batched=True``, except for ``MLP`` and
    ``FourierMLP``, which have a batch-level custom VJP) and fall back to nested
    ``jax.jvp`` for any other function.
    """

    in_size: eqx.AbstractVar[int]
    out_size: eqx.AbstractVar[int | Literal["scalar"]]

    @abc.abstractmethod
    def __call__(self, x: Float[Array, " d"]) -> Float[Array, "*m"]:
        """Evaluate the field at one point ``x``."""

    @abc.abstractmethod
    def jet(
        self,
        x: Float[Array, " d"],
        directions: Float[Array, "k d"],
        form: Form,
        recompute: bool = True,
    ) -> Jet:
        """Value ``(m,)``, directional derivatives ``(k, m)`` and second-order part at ``x``."""


def has_own_jet(fn) -> bool:
    """Whether ``fn`` is an [`AbstractNeuralField`][] whose ``jet`` describes its
    ``__call__``: a subclass that overrides ``__call__`` without its own ``jet`` (say a hard
    boundary condition, ``x (1 - x) net(x)``) would get the base network's derivatives from
    the inherited ``jet``, so it takes the generic path instead. The ``jet`` is trusted where
    the class that defines it comes no later in the method resolution order than the one
    that defines ``__call__``: a ``__call__`` from a mixin listed before the model
    (``class Net(HardBC, MLP)``) counts as an override too (a subclass test missed it, the
    mixin being no subclass of ``MLP``, and the hard boundary condition was dropped)."""
    if not isinstance(fn, AbstractNeuralField):
        return False
    mro = type(fn).__mro__
    call_owner = next(k for k in mro if "__call__" in vars(k))
    jet_owner = next(k for k in mro if "jet" in vars(k))
    return mro.index(jet_owner) <= mro.index(call_owner)


def _init_linears(sizes: Sequence[int], key: PRNGKeyArray, dtype) -> tuple[eqx.nn.Linear, ...]:
    keys = jax.random.split(key, len(sizes) - 1)
    return tuple(
        eqx.nn.Linear(a, b, key=k, dtype=dtype)
        for a, b, k in zip(sizes[:-1], sizes[1:], keys, strict=True)
    )


def _check_input(model: "AbstractNeuralField", x) -> Array:
    """``x`` as an array; a clear error when it is not one point of shape ``(in_size,)``."""
    x = jnp.asarray(x)
    shape = x.shape
    if shape != (model.in_size,):
        hint = "; use jax.vmap over points" if shape[-1:] == (model.in_size,) else ""
        raise ValueError(
            f"{type(model).__name__} takes one point x of shape ({model.in_size},) "
            f"(in_size={model.in_size}), got shape {shape}{hint}."
        )
    return x


def _finish(value: Array, out_size) -> Array:
    return value[0] if out_size == "scalar" else value


class MLP(AbstractNeuralField):
    """Multilayer perceptron ``x -> W_L s(... s(W_1 x + b_1) ...) + b_L``.

    ``depth`` hidden layers of ``width`` units with an elementwise, twice-differentiable
    activation ``s``. Weights and biases start uniform on ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``
    (``equinox.nn.Linear``'s initialisation: standard deviation ``1/sqrt(3 fan_in)``, not
    Glorot's ``sqrt(2/(fan_in + fan_out))``); re-initialise with ``eqx.tree_at`` for another.

    Args:
        in_size: input dimension ``d``.
        out_size: output dimension ``m``, or ``"scalar"`` for a scalar field.
        width: hidden width.
        depth: number of hidden layers (``depth + 1`` linear layers), ``>= 1``.
        activation: ``"tanh"`` (default), ``"sin"``, ``"gelu"``, ``"silu"``, ``"softplus"``,
            ``"sigmoid"`` or any elementwise callable.
        key: PRNG key.
        dtype: parameter dtype (default: JAX's default float); float64 needs
            ``jax_enable_x64`` (a ``ValueError`` otherwise).
    """

    layers: tuple[eqx.nn.Linear, ...]
    activation: Callable[[Array], Array] = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    out_size: int | Literal["scalar"] = eqx.field(static=True)

    def __init__(
        self,
        in_size: int,
        out_size: int | Literal["scalar"],
        width: int,
        depth: int,
        activation: str | Callable[[Array], Array] = "tanh",
        *,
        key: PRNGKeyArray,
        dtype=None,
    ):
        in_size, out_size, width, depth = _check_sizes(in_size, out_size, width, depth)
        dtype = _check_dtype(dtype)
        m = 1 if out_size == "scalar" else out_size
        self.layers = _init_linears([in_size] + [width] * depth + [m], key, dtype)
        self.activation = _resolve_activation(activation, dtype)
        self.in_size = in_size
        self.out_size = out_size

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, "*m"]:
        x = _check_input(self, x)
        h = x
        for lin in self.layers[:-1]:
            h = self.activation(lin(h))
        return _finish(self.layers[-1](h), self.out_size)

    def jet(self, x, directions, form, recompute=True):
        first = self.layers[0]
        pre = input_affine(first.weight, first.bias, x, directions, form)
        steps = [(self.activation, lin) for lin in self.layers[1:]]
        return _chain(pre, steps, form, recompute)


class FourierMLP(AbstractNeuralField):
    """MLP on random Fourier features ``[cos(B x), sin(B x)]`` (Tancik et al. 2020).

    ``B`` has shape ``(num_features, d)`` with entries ``N(0, scale^2)`` and is not trained
    (it enters through ``jax.lax.stop_gradient``). The embedding is written as a linear layer
    ``[B; B] x + [pi/2; 0]`` followed by ``sin``, so the forward Laplacian (per point, with
    a ``jax.checkpoint`` per layer block, and ``batched=True``, with the batch custom VJP)
    treats it like any other layer.

    Args:
        in_size, out_size, width, depth, activation, key, dtype: as for :class:`MLP`
            (``width``/``depth`` of the MLP after the embedding).
        num_features: number of frequencies (the embedding has ``2 * num_features`` entries).
        scale: standard deviation of the frequencies (default 1.0).

    References: Tancik et al. (2020), arXiv:2006.10739; Wang, Wang & Perdikaris (2021),
    DOI 10.1016/j.cma.2021.113938.
    """

    frequencies: Float[Array, "f d"]
    mlp: MLP
    in_size: int = eqx.field(static=True)
    out_size: int | Literal["scalar"] = eqx.field(static=True)

    def __init__(
        self,
        in_size: int,
        out_size: int | Literal["scalar"],
        width: int,
        depth: int,
        activation: str | Callable[[Array], Array] = "tanh",
        *,
        num_features: int = 32,
        scale: float = 1.0,
        key: PRNGKeyArray,
        dtype=None,
    ):
        in_size, out_size, width, depth = _check_sizes(in_size, out_size, width, depth)
        dtype = _check_dtype(dtype)
        if not _is_int(num_features) or num_features < 1:
            raise ValueError(f"num_features must be a positive int, got {num_features!r}.")
        num_features = int(num_features)
        _check_scale(scale)
        kb, km = jax.random.split(key)
        dtype = jnp.zeros((), dtype).dtype
        frequencies = scale * jax.random.normal(kb, (num_features, in_size), dtype)
        self.frequencies = frequencies.astype(dtype)  # a NumPy float64 scale promoted them
        self.mlp = MLP(2 * num_features, out_size, width, depth, activation, key=km, dtype=dtype)
        self.in_size = in_size
        self.out_size = out_size

    def _embedding(self):
        b = jax.lax.stop_gradient(self.frequencies)
        weight = jnp.concatenate([b, b], axis=0)
        f = b.shape[0]
        phase = jnp.concatenate([jnp.full((f,), 0.5 * math.pi, b.dtype), jnp.zeros((f,), b.dtype)])
        return weight, phase

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, "*m"]:
        x = _check_input(self, x)
        weight, phase = self._embedding()
        return self.mlp(jnp.sin(weight @ x + phase))

    def jet(self, x, directions, form, recompute=True):
        weight, phase = self._embedding()
        pre = input_affine(weight, phase, x, directions, form)
        layers = self.mlp.layers
        steps = [(jnp.sin, layers[0])] + [(self.mlp.activation, lin) for lin in layers[1:]]
        return _chain(pre, steps, form, recompute)


class ModifiedMLP(AbstractNeuralField):
    """Modified MLP of Wang, Teng & Perdikaris (2021) with two gating encoders.

    .. math::
        U = s(W_u x + b_u),\\quad V = s(W_v x + b_v),\\quad H_1 = s(W_1 x + b_1),\\\\
        Z_k = s(W_{z,k} H_k + b_{z,k}),\\quad H_{k+1} = (1 - Z_k) \\odot U + Z_k \\odot V,\\\\
        f(x) = W H_{L} + b.

    Args:
        in_size, out_size, width, activation, key, dtype: as for :class:`MLP`.
        depth: number of hidden layers ``L`` (``H_1`` and ``L - 1`` gated layers), ``>= 1``.

    Reference: Wang, Teng & Perdikaris (2021), SIAM J. Sci. Comput. 43(5),
    DOI 10.1137/20M1318043.
    """

    encoder_u: eqx.nn.Linear
    encoder_v: eqx.nn.Linear
    layers: tuple[eqx.nn.Linear, ...]
    activation: Callable[[Array], Array] = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    out_size: int | Literal["scalar"] = eqx.field(static=True)

    def __init__(
        self,
        in_size: int,
        out_size: int | Literal["scalar"],
        width: int,
        depth: int,
        activation: str | Callable[[Array], Array] = "tanh",
        *,
        key: PRNGKeyArray,
        dtype=None,
    ):
        in_size, out_size, width, depth = _check_sizes(in_size, out_size, width, depth)
        dtype = _check_dtype(dtype)
        ku, kv, kl = jax.random.split(key, 3)
        m = 1 if out_size == "scalar" else out_size
        self.encoder_u = eqx.nn.Linear(in_size, width, key=ku, dtype=dtype)
        self.encoder_v = eqx.nn.Linear(in_size, width, key=kv, dtype=dtype)
        self.layers = _init_linears([in_size] + [width] * depth + [m], kl, dtype)
        self.activation = _resolve_activation(activation, dtype)
        self.in_size = in_size
        self.out_size = out_size

    def __call__(self, x: Float[Array, " d"]) -> Float[Array, "*m"]:
        x = _check_input(self, x)
        s = self.activation
        u, v = s(self.encoder_u(x)), s(self.encoder_v(x))
        h = s(self.layers[0](x))
        for lin in self.layers[1:-1]:
            z = s(lin(h))
            h = u + z * (v - u)
        return _finish(self.layers[-1](h), self.out_size)

    def jet(self, x, directions, form, recompute=True):
        s = self.activation
        u = elementwise(
            s, input_affine(self.encoder_u.weight, self.encoder_u.bias, x, directions, form), form
        )
        v = elementwise(
            s, input_affine(self.encoder_v.weight, self.encoder_v.bias, x, directions, form), form
        )
        first = self.layers[0]
        pre = input_affine(first.weight, first.bias, x, directions, form)
        for i, lin in enumerate(self.layers[1:]):
            gated = i > 0  # the previous linear layer was a gated Z-layer

            def block(params, carry, gated=gated):
                pre_, u_, v_ = carry
                h = elementwise(s, pre_, form)
                if gated:
                    h = gate(h, u_, v_, form)
                return affine(params.weight, params.bias, h)

            pre = apply_block(block, lin, (pre, u, v), recompute)
        return pre
