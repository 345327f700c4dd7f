"""Tests for physjax.gradients: operators vs jax.hessian references, gradients, transforms."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import physjax.gradients as pg

RTOL = 1e-10


def _f64(tree):
    return jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, tree)


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _tree_rel(a, b):
    """Largest relative error over the leaves of ``a`` against the reference ``b``.

    A leaf whose reference is all zero (e.g. a stop-gradient parameter) is compared against
    the tree's largest reference entry instead, an absolute tolerance, so it must be zero too.
    """
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    pairs = [(np.asarray(x), np.asarray(y)) for x, y in pairs]
    scale = max(np.max(np.abs(y), initial=0.0) for _, y in pairs)
    errors = [
        np.max(np.abs(x - y), initial=0.0) / (np.max(np.abs(y), initial=0.0) or scale or 1e-300)
        for x, y in pairs
    ]
    return float(max(errors))


def _model(kind, d=3, out="scalar", depth=3, activation="tanh", width=12, seed=0):
    key = jax.random.key(seed)
    if kind == "mlp":
        m = pg.MLP(d, out, width, depth, activation, key=key)
    elif kind == "fourier":
        m = pg.FourierMLP(d, out, width, depth, activation, num_features=6, key=key)
    elif kind == "modified":
        m = pg.ModifiedMLP(d, out, width, depth, activation, key=key)
    elif kind == "eqx":
        act = getattr(jnp, activation, jax.nn.gelu)
        m = eqx.nn.MLP(d, out, width, depth, act, final_activation=jnp.sin, key=key)
    else:
        raise ValueError(kind)
    return _f64(m)


def _points(n=4, d=3, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, d), dtype=jnp.float64)


MODELS = [  # depths 2-8; tanh, sin and GELU; every model family
    ("mlp", 8, "sin"),
    ("fourier", 2, "tanh"),
    ("modified", 3, "tanh"),
    ("eqx", 3, "gelu"),
]


@pytest.mark.parametrize("kind,depth,activation", MODELS)
def test_second_order_operators_match_hessian(kind, depth, activation):
    model = _model(kind, depth=depth, activation=activation)

    def operators(batched):
        return (
            pg.laplacian(model, batched=batched),
            pg.laplacian(model, spatial=(0, 1), batched=batched),
            pg.hessian_diagonal(model, batched=batched),
            pg.second_partial(model, 0, 2, batched=batched),
            pg.second_partial(model, 1, 1, batched=batched),
        )

    @eqx.filter_jit
    def evaluate(model, xs):
        hess = jax.vmap(jax.hessian(model))(xs)
        ref = (
            jnp.trace(hess, axis1=1, axis2=2),
            hess[:, 0, 0] + hess[:, 1, 1],
            jnp.diagonal(hess, axis1=1, axis2=2),
            hess[:, 0, 2],
            hess[:, 1, 1],
            jax.vmap(jax.grad(model))(xs),
        )
        per_point = tuple(jax.vmap(op)(xs) for op in operators(False))
        per_point += (jax.vmap(pg.gradient(model))(xs),)
        batched = tuple(op(xs) for op in operators(True))
        return per_point, batched, ref

    per_point, batched, ref = evaluate(model, _points(3))
    for a, b in zip(per_point, ref, strict=True):
        assert _rel(a, b) < RTOL
    for a, b in zip(batched, ref, strict=False):
        assert a.shape == b.shape
        assert _rel(a, b) < RTOL


@pytest.mark.parametrize("kind", ["mlp", "modified"])
def test_vector_operators_match_jacfwd(kind):
    model = _model(kind, d=3, out=3, depth=2)
    v = jnp.array([0.3, -1.2])

    @eqx.filter_jit
    def evaluate(model, x):
        jac = jax.jacfwd(model)(x)
        hess = jax.hessian(model)(x)
        ours = (
            pg.vector_laplacian(model, spatial=(0, 1))(x),
            pg.laplacian(model, component=1)(x),
            pg.divergence(model)(x),
            pg.time_derivative(model)(x),
            pg.gradient(model, spatial=(0, 1), component=2)(x),
            pg.advection(model, spatial=(0, 1, 2))(x),
            pg.advection(model, v, spatial=(0, 1))(x),
        )
        ref = (
            jnp.trace(hess[:, :2, :2], axis1=1, axis2=2),
            jnp.trace(hess[1]),
            jnp.trace(jac),
            jac[:, -1],
            jac[2, :2],
            jac @ model(x),
            jac[:, :2] @ v,
        )
        return ours, ref

    ours, ref = evaluate(model, _points(1)[0])
    for a, b in zip(ours, ref, strict=True):
        assert _rel(a, b) < RTOL

    @eqx.filter_jit
    def evaluate_batched(model, xs):
        hess = jax.vmap(jax.hessian(model))(xs)
        ours = (
            pg.vector_laplacian(model, spatial=(0, 1), batched=True)(xs),
            pg.laplacian(model, component=1, batched=True)(xs),
        )
        ref = (
            jnp.trace(hess[:, :, :2, :2], axis1=2, axis2=3),
            jnp.trace(hess[:, 1], axis1=1, axis2=2),
        )
        return ours, ref

    ours, ref = evaluate_batched(model, _points(2))
    for a, b in zip(ours, ref, strict=True):
        assert _rel(a, b) < RTOL


def test_closed_form_functions():
    x = jnp.array([0.3, -0.7, 1.1], dtype=jnp.float64)
    a, b, c = x

    def poly(x):
        return x[0] ** 3 * x[1] ** 2 + 2.0 * x[2] ** 4 - x[0] * x[2]

    lap = 6 * a * b**2 + 2 * a**3 + 24 * c**2
    assert _rel(pg.laplacian(poly)(x), lap) < RTOL
    assert _rel(pg.second_partial(poly, 0, 1)(x), 6 * a**2 * b) < RTOL
    assert _rel(pg.second_partial(poly, 0, 2)(x), -1.0) < RTOL
    assert _rel(pg.hessian_diagonal(poly)(x), jnp.array([6 * a * b**2, 2 * a**3, 24 * c**2])) < RTOL

    def sines(x):
        return jnp.sin(2.0 * x[0]) * jnp.sin(3.0 * x[1]) * jnp.exp(-x[2])

    u = sines(x)
    assert _rel(pg.laplacian(sines, spatial=(0, 1))(x), -13.0 * u) < RTOL
    assert _rel(pg.time_derivative(sines)(x), -u) < RTOL
    assert _rel(pg.vector_laplacian(sines)(x), -12.0 * u) < RTOL

    def field(x):  # u = (sin x sin y, x^2 y), div = cos x sin y + x^2
        return jnp.stack([jnp.sin(x[0]) * jnp.sin(x[1]), x[0] ** 2 * x[1]])

    div = jnp.cos(a) * jnp.sin(b) + a**2
    assert _rel(pg.divergence(field, spatial=(0, 1))(x), div) < RTOL
    lap_ref = jnp.array([-2 * jnp.sin(a) * jnp.sin(b), 2 * b])
    assert _rel(pg.vector_laplacian(field, spatial=(0, 1))(x), lap_ref) < RTOL
    # the batched generic path (nested jvp under vmap, batch-level custom VJP)
    xs = jnp.stack([x, -0.5 * x])
    a, b, c = xs.T
    lap = 6 * a * b**2 + 2 * a**3 + 24 * c**2
    assert _rel(jax.jit(pg.laplacian(poly, batched=True))(xs), lap) < RTOL
    assert _rel(jax.jit(pg.second_partial(poly, 0, 1, batched=True))(xs), 6 * a**2 * b) < RTOL
    vector_lap = jax.jit(pg.vector_laplacian(field, spatial=(0, 1), batched=True))(xs)
    assert _rel(vector_lap[:, 1], 2 * b) < RTOL


@pytest.mark.parametrize("kind", ["mlp", "fourier", "modified", "eqx", "generic"])
def test_parameter_gradient_matches_naive(kind):
    """grad of mean(residual^2) w.r.t. parameters and points: vmap path, batched path, naive."""
    xs = _points(5)
    if kind == "generic":
        model = _f64(jax.random.normal(jax.random.key(3), (3,)))

        def field(w):
            return lambda x: jnp.sin(w @ x) * jnp.tanh(w[0] * x[1] + x[2])
    else:
        model = _model(kind, depth=3, width=8)

        def field(m):
            return m

    def residual(r, xs):
        return jnp.mean((r - jnp.sin(xs[:, 2])) ** 2)

    def loss(m, xs):
        return residual(jax.vmap(pg.laplacian(field(m), spatial=(0, 1)))(xs), xs)

    def loss_batched(m, xs):
        return residual(pg.laplacian(field(m), spatial=(0, 1), batched=True)(xs), xs)

    def loss_ref(m, xs):
        r = jax.vmap(lambda x: jnp.trace(jax.hessian(field(m))(x)[:2, :2]))(xs)
        return residual(r, xs)

    # gradients w.r.t. the parameters and the points (the custom VJPs' x cotangents)
    @eqx.filter_jit
    def value_and_grads(mx):
        fns = (loss_ref, loss, loss_batched)
        return [eqx.filter_value_and_grad(lambda mx, f=f: f(*mx))(mx) for f in fns]

    (val_ref, g_ref), *ours = value_and_grads((model, xs))
    for val, g in ours:
        assert _tree_rel(g, g_ref) < RTOL
        assert abs(float(val) - float(val_ref)) < RTOL * float(val_ref)


def _eqx_variant(variant):
    key = jax.random.key(0)
    if variant == "depth0":  # equinox applies no final activation at depth 0
        m = eqx.nn.MLP(2, "scalar", 8, 0, jnp.tanh, final_activation=jnp.sin, key=key)
    elif variant == "scan":
        m = eqx.nn.MLP(2, "scalar", 8, 3, jnp.tanh, final_activation=jnp.sin, scan=True, key=key)
    elif variant == "prelu":  # an activation holding arrays (one slope per layer and unit)
        m = eqx.nn.MLP(2, "scalar", 8, 2, eqx.nn.PReLU(0.3), final_activation=jnp.tanh, key=key)
    else:  # equinox applies activations to each scalar entry: tanh here, not tanh * width
        act, final = (lambda z: jnp.tanh(z) * z.size), (lambda z: jnp.sin(z) * z.size)
        m = eqx.nn.MLP(2, "scalar", 8, 2, act, final_activation=final, key=key)
    return _f64(m)


@pytest.mark.parametrize("variant", ["depth0", "scan", "prelu", "per_entry"])
def test_equinox_mlp_variants_match_hessian(variant):
    model = _eqx_variant(variant)
    xs = _points(3, d=2)

    def ref(m, xs):
        return jax.vmap(lambda x: jnp.trace(jax.hessian(m)(x)))(xs)

    def values(m, xs):
        per_point = jax.vmap(pg.laplacian(m))(xs)
        batched = pg.laplacian(m, batched=True)(xs)
        return per_point, batched, ref(m, xs)

    per_point, batched, reference = eqx.filter_jit(values)(model, xs)
    assert _rel(per_point, reference) < RTOL
    assert _rel(batched, reference) < RTOL

    def grads(m, xs):
        target = jnp.sin(xs[:, 0])
        fns = (lambda m: pg.laplacian(m, batched=True)(xs), lambda m: ref(m, xs))
        return [eqx.filter_grad(lambda m, f=f: jnp.mean((f(m) - target) ** 2))(m) for f in fns]

    ours, reference = eqx.filter_jit(grads)(model, xs)
    assert _tree_rel(ours, reference) < RTOL


@pytest.mark.parametrize("kind", ["mlp", "eqx", "generic"])
def test_batched_gradient_float32_model_float64_points(kind):
    xs = _points(4, d=2)
    key = jax.random.key(0)
    if kind == "mlp":
        model = pg.MLP(2, "scalar", 8, 2, key=key, dtype=jnp.float32)
    elif kind == "eqx":
        model = eqx.nn.MLP(2, "scalar", 8, 2, jnp.tanh, key=key, dtype=jnp.float32)
    else:
        model = jnp.array([0.7, -0.4], dtype=jnp.float32)

    def loss(m, xs, batched):
        fn = (lambda x: jnp.sin(m @ x) ** 2) if kind == "generic" else m
        op = pg.laplacian(fn, batched=batched)
        return jnp.mean((op(xs) if batched else jax.vmap(op)(xs)) ** 2)

    grad = eqx.filter_jit(lambda mx, b: eqx.filter_grad(lambda mx: loss(*mx, b))(mx))
    g, g_ref = grad((model, xs), True), grad((model, xs), False)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
        assert a.dtype == b.dtype
    assert g[1].dtype == jnp.float64
    assert jax.tree.leaves(g[0])[0].dtype == jnp.float32
    assert _tree_rel(g, g_ref) < 1e-5


@pytest.mark.parametrize("kind", ["mlp", "eqx", "modified", "generic"])
def test_empty_batch(kind):
    """N = 0 gives empty results and zero gradients, like jax.vmap of the per-point operator."""
    xs = jnp.zeros((0, 3))
    if kind == "generic":
        model = jnp.array([0.7, -0.4, 1.1])
    else:
        model = _model(kind, depth=2, width=6)

    @eqx.filter_jit
    def evaluate(mx):
        def loss(mx):
            m, xs = mx
            fn = (lambda x: jnp.sin(m @ x) ** 2) if kind == "generic" else m
            lap = pg.laplacian(fn, batched=True)(xs)
            diag = pg.hessian_diagonal(fn, batched=True)(xs)
            return jnp.sum(lap**2) + jnp.sum(diag), (lap, diag)

        return eqx.filter_grad(loss, has_aux=True)(mx)

    (g_model, g_xs), (lap, diag) = evaluate((model, xs))
    assert lap.shape == (0,) and diag.shape == (0, 3)
    assert g_xs.shape == (0, 3)
    for leaf in jax.tree.leaves(g_model):
        assert not np.any(np.asarray(leaf))


def test_custom_vjp_flag_gives_same_gradient():
    """recompute=True (custom VJPs) vs plain autodiff, incl. the Fourier embedding's chain."""
    model = _model("fourier", depth=2, activation="sin", width=6)
    xs = _points(4)

    def loss(m, flag):
        return jnp.mean(jax.vmap(pg.laplacian(m, recompute=flag))(xs) ** 2)

    def loss_batched(m, flag):
        return jnp.mean(pg.hessian_diagonal(m, recompute=flag, batched=True)(xs) ** 2)

    for fn in (loss, loss_batched):
        g1 = eqx.filter_jit(eqx.filter_grad(fn))(model, True)
        g2 = eqx.filter_jit(eqx.filter_grad(fn))(model, False)
        assert _tree_rel(g1, g2) < RTOL


def test_check_grads_params_and_points():
    model = _model("mlp", depth=2, width=6)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    xs = _points(3)

    def loss(params, xs):
        m = eqx.combine(params, static)
        return jnp.mean(jax.vmap(pg.laplacian(m, spatial=(0, 1)))(xs) ** 2)

    check_grads(jax.jit(loss), (params, xs), order=1, modes=["rev"], eps=1e-4)

    def loss_batched(params, xs):
        m = eqx.combine(params, static)
        return jnp.mean(jnp.sin(pg.second_partial(m, 0, 2, batched=True)(xs)))

    check_grads(jax.jit(loss_batched), (params, xs), order=1, modes=["rev"], eps=1e-4)

    def poly_loss(w):
        return pg.laplacian(lambda x: jnp.sum(w * x**3) * jnp.cos(x[0]))(jnp.array([0.2, 0.5]))

    check_grads(poly_loss, (jnp.array([0.4, -1.3]),), order=2, modes=["rev"], eps=1e-4)


def test_forward_mode_without_custom_vjp():
    x = jnp.array([0.3, 0.8])
    f = pg.laplacian(lambda y: jnp.sin(y[0]) * y[1] ** 3, recompute=False)
    # d/dx0 of Laplacian = -cos(x0) y^3 + 6 cos(x0) y
    expected = -jnp.cos(x[0]) * x[1] ** 3 + 6 * jnp.cos(x[0]) * x[1]
    tangent = jax.jvp(f, (x,), (jnp.array([1.0, 0.0]),))[1]
    assert _rel(tangent, expected) < RTOL
    assert _rel(jax.grad(f)(x)[0], expected) < RTOL


@pytest.mark.parametrize("kind", ["mlp", "eqx", "generic"])
def test_forward_mode_over_batched_custom_vjp_says_what_to_do(kind):
    model = (lambda y: jnp.sin(y[0]) * y[1] ** 3) if kind == "generic" else _model(kind, d=2)
    xs = _points(3, d=2)
    op = pg.laplacian(model, batched=True)
    with pytest.raises(TypeError, match="recompute=False"):
        jax.jvp(op, (xs,), (xs,))
    with pytest.raises(TypeError, match="recompute=False"):
        jax.jacfwd(op)(xs)
    # recompute=False, and the per-point operator (jax.checkpoint) with the default, work.
    tangent = jax.jvp(pg.laplacian(model, batched=True, recompute=False), (xs,), (xs,))[1]
    point = jax.vmap(lambda x, v: jax.jvp(pg.laplacian(model), (x,), (v,))[1])(xs, xs)
    reference = jax.vmap(
        lambda x, v: jax.jvp(lambda y: jnp.trace(jax.hessian(model)(y)), (x,), (v,))[1]
    )(xs, xs)
    assert _rel(tangent, reference) < RTOL
    assert _rel(point, reference) < RTOL


def test_jit_vmap_and_parameter_vmap():
    model = _model("mlp", depth=2, width=6)
    xs = _points(3)
    op = pg.laplacian(model, spatial=(0, 1))
    loop = jnp.stack([jax.jit(op)(x) for x in xs])
    assert _rel(jax.vmap(op)(xs), loop) < 1e-12  # no jit
    assert _rel(jax.jit(jax.vmap(op))(xs), loop) < 1e-12
    # vmap over an ensemble of models: values and per-model gradients, both paths
    make = eqx.filter_jit(lambda key: _f64(pg.MLP(3, "scalar", 8, 2, key=key)))
    members = [make(jax.random.key(i)) for i in (7, 8)]
    ensemble = jax.tree.map(lambda *a: jnp.stack(a), *members)

    def per_model(m, batched):
        op = pg.laplacian(m, batched=batched)
        return op(xs) if batched else jax.vmap(op)(xs)

    @eqx.filter_jit
    def ensemble_results(ensemble):
        out = []
        for b in (False, True):
            grad = eqx.filter_grad(lambda m, b=b: jnp.sum(per_model(m, b) ** 2))
            out.append(eqx.filter_vmap(lambda m, b=b, g=grad: (per_model(m, b), g(m)))(ensemble))
        return out

    (values, grads), (values_b, grads_b) = ensemble_results(ensemble)
    assert _rel(values_b, values) < 1e-12
    assert _tree_rel(grads_b, grads) < 1e-12
    for i, member in enumerate(members):
        assert _rel(values[i], eqx.filter_jit(per_model)(member, False)) < 1e-12
    # batched == vmap over points, under jit
    op_b = pg.laplacian(model, spatial=(0, 1), batched=True)
    assert _rel(jax.jit(op_b)(xs), loop) < 1e-12


@pytest.mark.multidevice
def test_shard_map_over_points_matches_single_device():
    assert len(jax.devices()) >= 4
    mesh = jax.make_mesh((4,), ("points",), axis_types=(jax.sharding.AxisType.Auto,))
    model = _model("mlp", depth=3)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    xs = jax.device_put(_points(16), jax.sharding.NamedSharding(mesh, P("points")))

    def local_loss(params, xs, batched):
        m = eqx.combine(params, static)
        op = pg.laplacian(m, spatial=(0, 1), batched=batched)
        r = op(xs) if batched else jax.vmap(op)(xs)
        return jax.lax.psum(jnp.sum(r**2), "points") / 16, r

    def make_sharded(batched):
        return jax.jit(
            jax.shard_map(
                lambda p, x: local_loss(p, x, batched),
                mesh=mesh,
                in_specs=(P(), P("points")),
                out_specs=(P(), P("points")),
            )
        )

    def plain(params, xs):
        m = eqx.combine(params, static)
        r = jax.vmap(pg.laplacian(m, spatial=(0, 1)))(xs)
        return jnp.mean(r**2), r

    loss_ref, res_ref = jax.jit(plain)(params, xs)
    g_ref = jax.jit(jax.grad(lambda p: plain(p, xs)[0]))(params)
    for batched in (False, True):
        sharded = make_sharded(batched)
        loss, res = sharded(params, xs)
        assert res.sharding.spec == P("points")
        assert _rel(res, res_ref) < 1e-12
        assert _rel(loss, loss_ref) < 1e-12
        g = jax.jit(jax.grad(lambda p, s=sharded: s(p, xs)[0]))(params)
        assert _tree_rel(g, g_ref) < 1e-10


def test_float32():
    model = pg.MLP(2, "scalar", 16, 3, "tanh", key=jax.random.key(0), dtype=jnp.float32)
    x = jnp.array([0.1, -0.4], dtype=jnp.float32)
    out = eqx.filter_jit(lambda m, x: pg.laplacian(m)(x))(model, x)
    assert out.dtype == jnp.float32
    ref = jax.jit(lambda x: jnp.trace(jax.hessian(_f64(model))(x)))(x.astype(jnp.float64))
    assert _rel(out, ref) < 1e-4


def test_memory_bounded_versus_nested_reverse():
    """The compiled training step keeps far less temporary memory than jax.hessian."""
    model = pg.MLP(3, "scalar", 32, 4, "tanh", key=jax.random.key(0), dtype=jnp.float32)
    xs = jax.random.normal(jax.random.key(1), (512, 3), dtype=jnp.float32)

    def step(op):
        def loss(m):
            return jnp.mean(jax.vmap(op(m))(xs) ** 2)

        grad = eqx.filter_grad(loss)
        return jax.jit(lambda m: grad(m)).lower(model).compile().memory_analysis()

    ours = step(lambda m: pg.laplacian(m)).temp_size_in_bytes
    naive = step(lambda m: lambda x: jnp.trace(jax.hessian(m)(x))).temp_size_in_bytes
    assert ours < 0.6 * naive, (ours, naive)
    batch_loss = eqx.filter_grad(lambda m: jnp.mean(pg.laplacian(m, batched=True)(xs) ** 2))
    batched = jax.jit(lambda m: batch_loss(m)).lower(model).compile().memory_analysis()
    assert batched.temp_size_in_bytes < 0.3 * naive, (batched.temp_size_in_bytes, naive)


def test_batched_memory_grows_by_a_few_rows_arrays_per_layer():
    """The claim behind "memory-stable" (docs/gradients.md): the batched Laplacian's training
    step keeps about one rows array (N × width) per layer plus a few, where nested reverse
    mode keeps tens. Measured here, depth 2 → 8: 5.8 rows arrays per added layer against
    33.4 for jax.hessian."""
    xs = jax.random.normal(jax.random.key(1), (512, 3), dtype=jnp.float32)
    rows = xs.shape[0] * 32 * 4  # N × width float32

    def temp(depth, laplacian):
        model = pg.MLP(3, "scalar", 32, depth, "tanh", key=jax.random.key(0), dtype=jnp.float32)
        grad = eqx.filter_grad(lambda m: jnp.mean(laplacian(m) ** 2))
        compiled = jax.jit(lambda m: grad(m)).lower(model).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    def per_layer(laplacian):
        return (temp(8, laplacian) - temp(2, laplacian)) / 6 / rows

    ours = per_layer(lambda m: pg.laplacian(m, batched=True)(xs))
    naive = per_layer(lambda m: jax.vmap(lambda x: jnp.trace(jax.hessian(m)(x)))(xs))
    assert 0 < ours <= 8, ours
    assert ours <= 0.3 * naive, (ours, naive)


# ----------------------------------------------------------------------------- errors


def test_error_vector_output_without_component():
    model = _model("mlp", out=2, depth=1)
    with pytest.raises(ValueError, match="laplacian needs a scalar output.*component=i"):
        pg.laplacian(model)(jnp.zeros(3))
    with pytest.raises(ValueError, match="component 5 is out of range"):
        pg.laplacian(model, component=5)(jnp.zeros(3))
    with pytest.raises(ValueError, match="divergence needs fn to return 3 components"):
        pg.divergence(model)(jnp.zeros(3))


def test_error_bad_point_and_spatial():
    model = _model("mlp", depth=1)
    with pytest.raises(ValueError, match="x has dimension 2 but the model expects in_size=3"):
        pg.laplacian(model)(jnp.zeros(2))
    with pytest.raises(ValueError, match=r"x must be one point of shape \(d,\)"):
        pg.laplacian(model)(jnp.zeros((4, 3)))
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        pg.laplacian(model)(jnp.zeros(3, dtype=jnp.int32))
    with pytest.raises(ValueError, match="spatial index 3 is out of range"):
        pg.laplacian(model, spatial=(0, 3))(jnp.zeros(3))
    with pytest.raises(ValueError, match="must not repeat"):
        pg.hessian_diagonal(model, spatial=(1, 1))(jnp.zeros(3))
    with pytest.raises(TypeError, match="fn must be a callable"):
        pg.laplacian(3.0)
    with pytest.raises(ValueError, match="fn must return a scalar or a vector"):
        pg.laplacian(lambda x: jnp.outer(x, x))(jnp.zeros(3))
    with pytest.raises(TypeError, match="fn must return a floating-point array"):
        pg.gradient(lambda x: jnp.round(x).astype(jnp.int32)[0])(jnp.zeros(3))
    with pytest.raises(ValueError, match=r"batch of points of shape \(N, d\), got shape \(3,\)"):
        pg.laplacian(model, batched=True)(jnp.zeros(3))
    with pytest.raises(ValueError, match=r"got shape \(2, 4, 3\); jax.vmap the operator"):
        pg.laplacian(model, batched=True)(jnp.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match="x has dimension 2 but the model expects in_size=3"):
        pg.hessian_diagonal(model, batched=True)(jnp.zeros((4, 2)))
    with pytest.raises(TypeError, match="x must be a floating-point array"):
        pg.second_partial(model, 0, 1, batched=True)(jnp.zeros((4, 3), dtype=jnp.int32))
    with pytest.raises(ValueError, match=r"velocity must have shape \(2,\)"):
        pg.advection(model, jnp.ones(3), spatial=(0, 1))(jnp.zeros(3))
    # not arrays at all: JAX's own message named neither the argument nor what it takes
    for bad in ("ab", None):
        given = re.escape(repr(bad))
        with pytest.raises(TypeError, match=rf"^x must be an array of numbers, got {given}"):
            pg.laplacian(model)(bad)
    with pytest.raises(TypeError, match=r"^velocity must be an array of numbers, got 'abc'"):
        pg.advection(model, "abc")


def test_error_model_configuration():
    with pytest.raises(ValueError, match=r"depth \(number of hidden layers\) must be an int >= 1"):
        pg.MLP(2, 1, 8, 0, key=jax.random.key(0))
    with pytest.raises(ValueError, match="activation must be a callable or one of"):
        pg.MLP(2, 1, 8, 2, "relu6", key=jax.random.key(0))
    with pytest.raises(ValueError, match="out_size must be a positive int or 'scalar'"):
        pg.ModifiedMLP(2, 0, 8, 2, key=jax.random.key(0))
    for cls in (pg.MLP, pg.FourierMLP, pg.ModifiedMLP):
        for dtype in (jnp.int32, "not a dtype", jnp.complex64):
            with pytest.raises(ValueError, match="dtype must be a real floating-point dtype"):
                cls(2, 1, 8, 2, key=jax.random.key(0), dtype=dtype)


def test_a_float64_model_needs_x64():
    """Without x64, ``MLP(..., dtype="float64")`` (also ``FourierMLP``, ``ModifiedMLP``) gave a
    float32 model, with one jax warning per parameter array ("Explicitly requested dtype
    float64 is not available": 6 for a depth-2 MLP); a float64 ``Grid`` is refused there. The
    models refuse it too now, naming jax_enable_x64; float32 and the default still build."""
    for cls in (pg.MLP, pg.FourierMLP, pg.ModifiedMLP):
        for dtype in ("float64", jnp.float64, np.dtype("float64")):
            with jax.enable_x64(False):
                with pytest.raises(ValueError, match="dtype float64 needs jax_enable_x64"):
                    cls(2, 1, 8, 2, key=jax.random.key(0), dtype=dtype)
    with jax.enable_x64(False):
        for dtype in (None, jnp.float32):
            model = pg.MLP(2, 1, 8, 2, key=jax.random.key(0), dtype=dtype)
            assert {leaf.dtype for leaf in jax.tree.leaves(model)} == {jnp.dtype("float32")}
    model = pg.MLP(2, 1, 8, 2, key=jax.random.key(0), dtype="float64")  # x64 on (conftest)
    assert {leaf.dtype for leaf in jax.tree.leaves(model)} == {jnp.dtype("float64")}


def test_spatial_integer_array():
    model = _model("mlp", depth=1)
    x = _points(1)[0]
    ref = pg.laplacian(model, spatial=(0, 2))(x)
    assert _rel(pg.laplacian(model, spatial=np.array([0, 2]))(x), ref) < RTOL
    assert (
        _rel(pg.laplacian(model, spatial=jnp.array([0, 2]), batched=True)(x[None])[0], ref) < RTOL
    )
    with pytest.raises(TypeError, match="spatial must be an int, a sequence of ints"):
        pg.laplacian(model, spatial=np.zeros((2, 2), int))(x)
    with pytest.raises(TypeError, match="spatial must be an int, a sequence of ints"):
        pg.laplacian(model, spatial={0, 1})(x)


def test_advection_velocity_function_returning_list():
    model = _model("mlp", depth=1)
    x = _points(1)[0]
    ref = pg.advection(model, jnp.array([1.0, 2.0]), spatial=(0, 1))(x)
    assert _rel(pg.advection(model, lambda y: [1.0, 2.0], spatial=(0, 1))(x), ref) < RTOL
    with pytest.raises(TypeError, match=r"velocity\(x\) must return an array"):
        pg.advection(model, lambda y: None, spatial=(0, 1))(x)


def test_error_point_without_coordinates():
    def fn(y):
        return jnp.sum(y**2)

    with pytest.raises(ValueError, match="x must have at least one coordinate"):
        pg.laplacian(fn)(jnp.zeros(0))
    with pytest.raises(ValueError, match="x must have at least one coordinate"):
        pg.laplacian(fn, batched=True)(jnp.zeros((4, 0)))
    with pytest.raises(ValueError, match="x must have at least one coordinate"):
        pg.gradient(fn)(jnp.zeros(0))


@pytest.mark.parametrize("batched", [False, True])
def test_grad_of_a_jitted_loss_whose_field_closes_over_an_integer_array(batched):
    """An index array made inside the jitted loss: jax.closure_convert left integer tracers
    in the custom VJP's closure, and jax.grad(jax.jit(loss)) failed with "No constant
    handler for type: DynamicJaxprTracer"."""
    w0 = jnp.asarray(np.random.default_rng(3).normal(size=(4, 3)))
    xs = _points(3)

    def loss(w, recompute):
        idx = jnp.arange(3)  # traced inside the jit

        def u(y):
            return jnp.sum(jnp.tanh(w @ y)[idx])

        op = pg.laplacian(u, recompute=recompute, batched=batched)
        return jnp.sum(op(xs) if batched else jax.vmap(op)(xs))

    def reference(w):
        return jnp.sum(jax.vmap(lambda y: jnp.trace(jax.hessian(lambda z: jnp.sum(
            jnp.tanh(w @ z)[:3]))(y)))(xs))  # fmt: skip

    expected = jax.grad(reference)(w0)
    for recompute in (True, False):
        assert _rel(jax.grad(jax.jit(lambda w, r=recompute: loss(w, r)))(w0), expected) < RTOL
        _, pullback = jax.vjp(jax.jit(lambda w, r=recompute: loss(w, r)), w0)
        assert _rel(pullback(1.0)[0], expected) < RTOL


def test_forward_mode_through_the_recomputed_generic_operator():
    x = jnp.array([0.3, 0.8])
    f = pg.laplacian(lambda y: jnp.sin(y[0]) * y[1] ** 3)  # recompute=True, one point
    expected = -jnp.cos(x[0]) * x[1] ** 3 + 6 * jnp.cos(x[0]) * x[1]
    assert _rel(jax.jvp(f, (x,), (jnp.array([1.0, 0.0]),))[1], expected) < RTOL


class _HardWalls(pg.MLP):
    """u = x (1 - x) y (1 - y) net(x): overrides __call__ only."""

    def __call__(self, x):
        return x[0] * (1 - x[0]) * x[1] * (1 - x[1]) * super().__call__(x)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("recompute", [True, False])
def test_a_model_subclass_that_overrides_call_gets_its_own_derivatives(batched, recompute):
    """The inherited layer rule describes the base network, not the subclass's __call__: it
    used to return the base MLP's Laplacian (0.109 where 0.108 is right) and mixed partial
    (0.094 where -0.006 is right)."""
    u = _f64(_HardWalls(2, "scalar", 8, 2, "tanh", key=jax.random.key(4)))
    xs = jnp.asarray(np.random.default_rng(5).random((3, 2)))
    hess = jax.jit(jax.vmap(jax.hessian(u)))(xs)

    # compiled: one program per operator, not a few hundred eager operations
    def apply(op):
        return jax.jit(op if batched else jax.vmap(op))(xs)

    lap = apply(pg.laplacian(u, recompute=recompute, batched=batched))
    mixed = apply(pg.second_partial(u, 0, 1, recompute=recompute, batched=batched))
    assert _rel(lap, jnp.trace(hess, axis1=1, axis2=2)) < RTOL
    assert _rel(mixed, hess[:, 0, 1]) < RTOL

    # gradients in the parameters, too
    def loss(m):
        return jnp.sum(apply(pg.laplacian(m, recompute=recompute, batched=batched)) ** 2)

    def ref(m):
        return jnp.sum(jax.vmap(lambda y: jnp.trace(jax.hessian(m)(y)))(xs) ** 2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(u)
    assert _tree_rel(grads, eqx.filter_jit(eqx.filter_grad(ref))(u)) < RTOL


class _WallsMixin:
    """The hard walls of `_HardWalls` as a mixin, listed before the model class."""

    def __call__(self, x):
        return x[0] * (1 - x[0]) * x[1] * (1 - x[1]) * super().__call__(x)


class _MixinWalls(_WallsMixin, pg.MLP):
    pass


class _MixinWallsModified(_WallsMixin, pg.ModifiedMLP):
    pass


@pytest.mark.parametrize("cls", [_MixinWalls, _MixinWallsModified])
def test_a_call_from_a_mixin_gets_its_own_derivatives(cls):
    """A __call__ supplied by a mixin (no subclass of the model class that defines jet) was
    differentiated through the model's jet: the walls were dropped, and the Laplacian was
    the bare network's (-0.061 where -0.420 is right), per point and batched alike."""
    u = _f64(cls(2, "scalar", 8, 2, "tanh", key=jax.random.key(0)))
    xs = jnp.asarray([[0.3, -0.4], [0.6, -0.8], [0.1, 0.7]])
    hess = jax.jit(jax.vmap(jax.hessian(u)))(xs)
    for batched in (False, True):

        def apply(op, batched=batched):
            return jax.jit(op if batched else jax.vmap(op))(xs)

        lap = apply(pg.laplacian(u, batched=batched))
        diag = apply(pg.hessian_diagonal(u, batched=batched))
        mixed = apply(pg.second_partial(u, 0, 1, batched=batched))
        assert _rel(lap, jnp.trace(hess, axis1=1, axis2=2)) < RTOL
        assert _rel(diag, jnp.diagonal(hess, axis1=1, axis2=2)) < RTOL
        assert _rel(mixed, hess[:, 0, 1]) < RTOL


class _Scaled(pg.MLP):
    """u = 2 net(x), with its own jet: a subclass that describes its own derivatives."""

    def __call__(self, x):
        return 2.0 * super().__call__(x)

    def jet(self, x, directions, form, recompute=True):
        j = super().jet(x, directions, form, recompute)
        return pg.Jet(2 * j.value, 2 * j.jac, 2 * j.second)


@pytest.mark.parametrize("recompute", [True, False])
def test_a_subclass_with_its_own_jet_is_used_by_the_batched_operator(recompute):
    """batched=True rebuilt such a subclass from its layers, as the base MLP: it returned half
    the Laplacian here, without an error."""
    u = _f64(_Scaled(2, "scalar", 8, 2, "tanh", key=jax.random.key(4)))
    xs = jnp.asarray(np.random.default_rng(5).random((3, 2)))
    ref = jax.jit(jax.vmap(lambda y: jnp.trace(jax.hessian(u)(y))))(xs)
    assert _rel(jax.jit(pg.laplacian(u, recompute=recompute, batched=True))(xs), ref) < RTOL
    assert _rel(jax.jit(jax.vmap(pg.laplacian(u, recompute=recompute)))(xs), ref) < RTOL

    def loss(m):
        return jnp.sum(pg.laplacian(m, recompute=recompute, batched=True)(xs) ** 2)

    def reference(m):
        return jnp.sum(jax.vmap(lambda y: jnp.trace(jax.hessian(m)(y)))(xs) ** 2)

    grads = eqx.filter_jit(eqx.filter_grad(loss))(u)
    assert _tree_rel(grads, eqx.filter_jit(eqx.filter_grad(reference))(u)) < RTOL


def test_burgers_terms_of_a_scalar_field_in_one_dimension():
    """u u_x and u_x of a scalar 1-D field: self-advection and divergence needed an output of
    shape (1,), with the message 'needs fn to return 1 components, got output size 1'."""
    u = _f64(pg.MLP(1, "scalar", 8, 2, "tanh", key=jax.random.key(2)))
    xs = jnp.asarray([[0.3], [-0.6]])
    du = jax.vmap(jax.grad(u))(xs)[:, 0]
    values = jax.vmap(u)(xs)
    assert _rel(jax.vmap(pg.advection(u))(xs), values * du) < RTOL
    assert _rel(jax.vmap(pg.divergence(u))(xs), du) < RTOL
    assert jax.vmap(pg.advection(u))(xs).shape == (2,)
    u2 = _model("mlp", depth=1)  # scalar output of a 3-D point
    with pytest.raises(ValueError, match="needs fn to return 3 components .*got a scalar"):
        pg.advection(u2)(jnp.zeros(3))
    with pytest.raises(
        ValueError, match="divergence needs fn to return 3 components .*got a scalar"
    ):
        pg.divergence(u2)(jnp.zeros(3))


def test_an_equinox_mlp_of_the_wrong_input_size_is_named():
    mlp = eqx.nn.MLP(2, "scalar", 4, 1, key=jax.random.key(0))
    with pytest.raises(ValueError, match="x has dimension 3 but the model expects in_size=2"):
        pg.laplacian(mlp)(jnp.ones(3))
    with pytest.raises(ValueError, match="x has dimension 3 but the model expects in_size=2"):
        pg.laplacian(mlp, batched=True)(jnp.ones((4, 3)))


@pytest.mark.parametrize("kind", ["mlp", "fourier", "modified"])
def test_a_model_called_on_a_wrong_point_says_so(kind):
    model = _model(kind, d=2, depth=1)
    with pytest.raises(ValueError, match=r"takes one point x of shape \(2,\).*got shape \(3,\)"):
        model(jnp.ones(3))
    with pytest.raises(ValueError, match=r"got shape \(5, 2\); use jax.vmap over points"):
        model(jnp.ones((5, 2)))

    # inside a user's wrapper, the operators pass the model's message on
    def wrapped(x):
        return x[0] * model(x)

    with pytest.raises(ValueError, match=r"takes one point x of shape \(2,\)"):
        pg.laplacian(wrapped)(jnp.ones(3))


@pytest.mark.parametrize("spatial", [True, np.bool_(False), (0, True)])
def test_a_boolean_is_no_coordinate_index(spatial):
    model = _model("mlp", depth=1)
    with pytest.raises(TypeError, match="spatial must be an int|must be an int, got the boolean"):
        pg.laplacian(model, spatial=spatial)(jnp.zeros(3))


def test_a_boolean_is_no_component_index():
    with pytest.raises(TypeError, match="component must be an int, got the boolean"):
        pg.laplacian(_model("mlp", out=2, depth=1), component=True)(jnp.zeros(3))


def test_an_equinox_mlp_of_a_scalar_input_takes_points_of_shape_1():
    mlp = _f64(eqx.nn.MLP("scalar", "scalar", 8, 2, jnp.tanh, key=jax.random.key(6)))
    xs = jnp.asarray([[0.3], [-0.7]])
    second = jax.vmap(jax.grad(jax.grad(mlp)))(xs[:, 0])
    assert _rel(jax.vmap(pg.laplacian(mlp))(xs), second) < RTOL
    assert _rel(pg.laplacian(mlp, batched=True)(xs), second) < RTOL
    assert _rel(pg.gradient(mlp)(xs[0]), jax.grad(mlp)(xs[0, 0])[None]) < RTOL
    with pytest.raises(ValueError, match=r"in_size='scalar': points must have shape \(1,\)"):
        pg.laplacian(mlp)(jnp.zeros(2))


def test_recompute_under_vmap_of_a_closure_holds_no_per_point_cotangents():
    """jax.vmap of the per-point operator of a function that is not a layered model: its
    recomputation is a jax.checkpoint, differentiated as the vmapped block. As a per-point
    custom VJP it formed every weight cotangent per point before the sum: 211 / 310 / 392 MiB
    against 46 / 78 / 142 MiB without recompute (N = 4096, width 64, depth 2 / 4 / 8)."""

    class Wrap(eqx.Module):
        net: pg.MLP

        def __call__(self, x):
            return self.net(x)

    xs = jnp.zeros((512, 2), jnp.float32)

    def temp(recompute):
        m = Wrap(pg.MLP(2, "scalar", 32, 4, key=jax.random.key(0)))
        p, s = eqx.partition(m, eqx.is_array)

        def loss(p):
            op = pg.laplacian(eqx.combine(p, s), recompute=recompute)
            return jnp.mean(jax.vmap(op)(xs) ** 2)

        compiled = jax.jit(jax.grad(loss)).lower(p).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp(True) <= 1.25 * temp(False), (temp(True), temp(False))


def test_modified_mlp_temp_memory_figures_of_the_docs_are_mib():
    """docs/gradients.md gives ModifiedMLP's gradient temp memory (width 64, N = 4096,
    float32, depth 2) as 64 MiB with recompute=True and 65 MiB without: figures of 2^20
    bytes (67.2 and 68.2 MB of 10^6 bytes, the unit of the page's benchmark tables)."""
    xs = jnp.zeros((4096, 2), jnp.float32)
    model = pg.ModifiedMLP(2, "scalar", 64, 2, key=jax.random.key(0), dtype=jnp.float32)

    def temp_mib(recompute):
        def loss(m):
            return jnp.mean(pg.laplacian(m, batched=True, recompute=recompute)(xs) ** 2)

        compiled = jax.jit(jax.grad(loss)).lower(model).compile()
        return compiled.memory_analysis().temp_size_in_bytes / 2**20

    with_recompute, without = temp_mib(True), temp_mib(False)
    assert round(with_recompute) == 64, with_recompute
    assert round(without) == 65, without


def test_models_take_numpy_integer_sizes():
    """Sizes from NumPy arithmetic (np.int64) were refused with 'must be a positive int, got
    np.int64(3)'; they build the same model as Python ints, stored as Python ints."""
    key = jax.random.PRNGKey(0)
    x = jnp.array([0.1, 0.2, 0.3])
    for cls, extra in (
        (pg.MLP, {}),
        (pg.FourierMLP, {"num_features": np.int64(4)}),
        (pg.ModifiedMLP, {}),
    ):
        a = cls(3, 2, 8, 2, key=key, **{k: int(v) for k, v in extra.items()})
        b = cls(np.int64(3), np.int32(2), np.int64(8), np.int16(2), key=key, **extra)
        assert type(b.in_size) is int and type(b.out_size) is int
        assert np.array_equal(a(x), b(x))
    with pytest.raises(ValueError, match="in_size must be a positive int"):
        pg.MLP(np.int64(0), 1, 4, 1, key=key)
    with pytest.raises(ValueError, match="width must be a positive int"):
        pg.MLP(3, 1, np.bool_(True), 1, key=key)


@pytest.mark.multidevice
def test_shard_map_over_points_first_order_and_nested_jvp_operators():
    """Under ``shard_map``: the first-order operators and the nested-``jvp`` path (a hard
    boundary condition around a model). Their constant directions did not vary over the mesh
    axis as the points do, and JAX's varying-axes check failed for the gradient of any
    first-order operator (a model's too) and for the recomputed second-order ones."""
    assert len(jax.devices()) >= 4
    mesh = jax.make_mesh((4,), ("points",), axis_types=(jax.sharding.AxisType.Auto,))
    params, static = eqx.partition(_model("mlp", depth=1, width=6), eqx.is_inexact_array)
    xs = _points(8)

    def residual(params, xs, batched, recompute):
        net = eqx.combine(params, static)

        def u(x):  # zero on x_0 = 0 and x_0 = 1
            return x[0] * (1 - x[0]) * net(x)

        lap = pg.laplacian(u, spatial=(0, 1), batched=batched, recompute=recompute)
        mixed = pg.second_partial(u, 0, 2, batched=batched, recompute=recompute)
        r = (lap(xs) + mixed(xs)) if batched else jax.vmap(lambda x: lap(x) + mixed(x))(xs)
        r = r + jax.vmap(pg.gradient(u, spatial=1))(xs)[:, 0]
        return r + jax.vmap(pg.time_derivative(net))(xs)

    def sharded_loss(params, batched, recompute):
        local = jax.shard_map(
            lambda p, x: jax.lax.psum(jnp.sum(residual(p, x, batched, recompute) ** 2), "points"),
            mesh=mesh,
            in_specs=(P(), P("points")),
            out_specs=P(),
        )
        return local(params, xs)

    ref = jnp.sum(residual(params, xs, False, False) ** 2)
    g_ref = jax.grad(lambda p: jnp.sum(residual(p, xs, False, False) ** 2))(params)
    for batched in (False, True):
        for recompute in (True, False):
            loss, g = jax.jit(jax.value_and_grad(sharded_loss), static_argnums=(1, 2))(
                params, batched, recompute
            )
            assert _rel(loss, ref) < 1e-12
            assert _tree_rel(g, g_ref) < 1e-10


def test_fourier_scale_must_be_a_positive_finite_number():
    """An infinite scale made infinite frequencies (every output NaN) without a word, and
    None, a string or an array failed inside the comparison with an unrelated message."""
    key = jax.random.key(0)
    for scale in (float("inf"), float("nan"), 0.0, -1.0, None, "2", 1j, jnp.ones(2)):
        with pytest.raises(ValueError, match="scale .* must be a positive, finite real number"):
            pg.FourierMLP(2, "scalar", 4, 1, scale=scale, key=key)
    # a traced scale (a sweep over scales under jax.vmap) cannot be checked and is taken
    freqs = jax.vmap(lambda s: pg.FourierMLP(2, 1, 4, 1, scale=s, key=key).frequencies)(
        jnp.array([1.0, 2.0])
    )
    np.testing.assert_allclose(freqs[1], 2 * freqs[0], rtol=1e-12)


def test_a_traced_index_is_named_as_traced():
    """A component, spatial, i, j or time_index passed as a jit argument (or vmapped) was
    refused as 'must be an int, got JitTracer(~int32[])' although it is an int."""
    model = _model("mlp", out=2, depth=1, width=4)
    x = _points(1)[0]
    cases = [
        ("component", lambda c: pg.laplacian(model, component=c)(x), 1),
        ("spatial", lambda s: pg.laplacian(model, component=0, spatial=s)(x), jnp.arange(2)),
        ("i", lambda i: pg.second_partial(model, i, 0, component=0)(x), 1),
        ("time_index", lambda t: pg.time_derivative(model, time_index=t)(x), 1),
    ]
    for name, f, arg in cases:
        with pytest.raises(TypeError, match=f"^{name} must be known when the operator is traced"):
            jax.jit(f)(arg)
    with pytest.raises(TypeError, match="component must be known .* rather than under jax.vmap"):
        jax.vmap(lambda c: pg.laplacian(model, component=c)(x))(jnp.arange(2))


@pytest.mark.parametrize("kind", ["mlp", "fourier", "modified"])
def test_a_model_takes_a_point_given_as_a_list(kind):
    """``u([0.5, 0.5])`` failed with "unsupported operand type(s) for @: ... and 'list'"."""
    model = _model(kind, d=2, depth=1, width=4)
    assert model([0.5, -0.25]) == model(jnp.array([0.5, -0.25]))
    assert model((1, 2)) == model(jnp.array([1.0, 2.0]))


def test_fourier_frequencies_keep_the_model_dtype_whatever_the_scale():
    """A NumPy scale (np.float64 from a config or np.logspace) promoted the frequencies of a
    float32 model to float64, and with them the model's output and every operator."""
    key = jax.random.key(0)
    for dtype, scale in ((jnp.float32, np.float64(3.0)), (jnp.float16, np.float32(3.0))):
        model = pg.FourierMLP(2, "scalar", 4, 1, scale=scale, key=key, dtype=dtype)
        assert model.frequencies.dtype == dtype
        x = jnp.array([0.1, 0.2], dtype)
        assert model(x).dtype == dtype
        assert pg.laplacian(model)(x).dtype == dtype
        reference = pg.FourierMLP(2, "scalar", 4, 1, scale=3.0, key=key, dtype=dtype)
        assert jnp.array_equal(model.frequencies, reference.frequencies)


def test_points_of_a_one_dimensional_problem_given_as_a_flat_array():
    """Points of a 1-D problem given as shape (N,), the usual linspace: jax.vmap of an operator
    was told to 'use jax.vmap over points' (it had), and batched=True to 'pass one point with
    batched=False'. Both now say that the points must have shape (N, 1)."""
    u = _model("mlp", d=1, depth=1, width=4)
    xs = jnp.linspace(0.0, 1.0, 5)
    with pytest.raises(ValueError, match=r"shape \(1,\): jax.vmap over points of shape \(N, 1\)"):
        jax.vmap(pg.laplacian(u))(xs)
    with pytest.raises(ValueError, match=r"got shape \(5,\); for N points of a 1-D problem"):
        pg.laplacian(u, batched=True)(xs)
    with pytest.raises(ValueError, match=r"got shape \(\); for one point of a 1-D problem"):
        pg.laplacian(u, batched=True)(xs[0])
    assert pg.laplacian(u, batched=True)(xs[:, None]).shape == (5,)


@pytest.mark.parametrize("kind", ["mlp", "fourier", "eqx"])
def test_an_activation_closing_over_a_trained_slope_is_differentiated_with_batched(kind):
    """An adaptive activation, tanh(a z) with the slope a trained: with batched=True and
    recompute=True the chain's custom VJP closed over a, and jax.grad with respect to a
    stopped with an UnexpectedTracerError. It now gives the gradient of the nested-reverse
    reference."""
    key = jax.random.key(0)
    xs = jax.random.uniform(jax.random.key(1), (5, 2), jnp.float64)
    base = eqx.nn.MLP(2, "scalar", 6, 2, jnp.tanh, key=key, dtype=jnp.float64)

    def model(a):
        act = lambda z: jnp.tanh(a * z)  # noqa: E731
        if kind == "eqx":
            return eqx.tree_at(lambda m: m.activation, base, act)
        cls = pg.MLP if kind == "mlp" else pg.FourierMLP
        return cls(2, "scalar", 6, 2, act, key=key, dtype=jnp.float64)

    def loss(a):
        return jnp.sum(pg.laplacian(model(a), batched=True)(xs) ** 2)

    def reference(a):
        lap = jax.vmap(lambda x: jnp.trace(jax.hessian(model(a))(x)))(xs)
        return jnp.sum(lap**2)

    expected = jax.grad(reference)(1.3)
    assert _rel(jax.grad(loss)(1.3), expected) < RTOL
    assert _rel(jax.jit(jax.grad(loss))(1.3), expected) < RTOL


def test_a_complex_velocity_is_refused_not_cut_to_its_real_part():
    """advection cast the velocity to the point's dtype: 1j * v gave (0 . grad) u = 0."""
    model = _model("mlp", depth=1)
    x = _points(1)[0]
    ref = pg.advection(model, jnp.array([1.0, 2.0]), spatial=(0, 1))(x)
    assert abs(float(ref)) > 1e-3
    # integer velocities stay accepted and give the same numbers
    assert _rel(pg.advection(model, jnp.array([1, 2]), spatial=(0, 1))(x), ref) < RTOL
    for velocity in (jnp.array([1.0, 2.0]) * 1j, lambda y: jnp.array([1.0j, 2.0j])):
        with pytest.raises(TypeError, match="velocity must be real.*complex128"):
            pg.advection(model, velocity, spatial=(0, 1))(x)


def test_an_activation_holding_arrays_is_refused_by_the_physjax_models():
    """A physjax model's activation is static: a PReLU's slope got no gradient, silently."""
    key = jax.random.key(0)
    for cls in (pg.MLP, pg.FourierMLP, pg.ModifiedMLP):
        with pytest.raises(ValueError, match="holds floating-point arrays.*never be trained"):
            cls(2, "scalar", 6, 2, eqx.nn.PReLU(0.3), key=key)
    # a plain function of the same activation is accepted and gives the PReLU's numbers
    prelu = eqx.nn.PReLU(0.3)
    model = pg.MLP(2, "scalar", 6, 2, lambda z: prelu(z), key=key, dtype=jnp.float64)
    x = jnp.array([0.3, -0.2])
    h = x
    for lin in model.layers[:-1]:
        h = jnp.where(lin(h) >= 0, lin(h), 0.3 * lin(h))
    assert _rel(model(x), model.layers[-1](h)[0]) < 1e-14


def test_pinn_benchmark_reports_the_median_of_an_even_number_of_repeats(monkeypatch):
    """benchmarks/pinn_laplacian.py took times[n // 2]: of 2 repeats (--quick), the slower."""
    import importlib.util
    import pathlib
    import types

    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "pinn_laplacian.py"
    spec = importlib.util.spec_from_file_location("pinn_laplacian_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    clock = iter([0.0, 1.0, 10.0, 13.0])  # two timed steps of 1 s and 3 s
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    result = bench._child("physjax", 1, 2, 4, 4, 2, "float32")
    assert result["time_s"] == pytest.approx(2.0)


def test_an_activation_that_mixes_entries_is_refused():
    """The layer rule differentiates the activation entry by entry: softmax or a normalisation
    gave Laplacians of about 1e-35 against 5e-4 (jax.hessian), and per point != batched. A
    sort passed the old, sorted probe, and GroupSort/MaxMin (a sort of pairs, which fails on
    one entry) was accepted unchecked: Laplacians 0.070 against 0.012, with no error."""
    key = jax.random.key(2)

    def maxmin(z):
        return jnp.tanh(jnp.sort(z.reshape(-1, 2), axis=-1).reshape(z.shape))

    mixing = (
        jax.nn.softmax,
        lambda z: z / jnp.linalg.norm(z),
        lambda z: jnp.tanh(z - z.mean()),
        lambda z: jnp.tanh(jnp.sort(z)),
        maxmin,
    )
    for cls in (pg.MLP, pg.FourierMLP, pg.ModifiedMLP):
        for act in mixing:
            with pytest.raises(ValueError, match="is not elementwise"):
                cls(2, "scalar", 5, 2, act, key=key, dtype=jnp.float64)
    with pytest.raises(ValueError, match="is not elementwise"):  # built inside a jit too
        jax.jit(lambda k: pg.MLP(2, "scalar", 5, 2, jax.nn.softmax, key=k).layers)(key)
    # elementwise callables stay accepted, and their Laplacian is jax.hessian's
    x = jnp.array([0.3, -0.7])
    for act in (jax.nn.relu, lambda z: jnp.sin(2.0 * z), jax.nn.elu):
        model = pg.MLP(2, "scalar", 5, 2, act, key=key, dtype=jnp.float64)
        assert _rel(pg.laplacian(model)(x), jnp.trace(jax.hessian(model)(x))) < 1e-12
    # per-unit constants of the probe's length (4) are elementwise too, not refused
    scale = jnp.array([1.0, 2.0, 3.0, 4.0])
    model = pg.MLP(2, "scalar", 4, 2, lambda z: jnp.tanh(scale * z), key=key, dtype=jnp.float64)
    assert _rel(pg.laplacian(model)(x), jnp.trace(jax.hessian(model)(x))) < 1e-12


def test_recompute_and_batched_must_be_true_or_false():
    """batched="no" (a truthy string) was taken as True, giving a function of a batch of
    points where one point was meant; recompute=0.5 likewise. Both are refused by name for
    every second-order operator, and NumPy booleans are taken."""
    model = _model("mlp", depth=1)
    points = jnp.linspace(0.1, 0.9, 6).reshape(2, 3)
    for op in (pg.laplacian, pg.vector_laplacian, pg.hessian_diagonal):
        with pytest.raises(TypeError, match="batched must be True or False, got 'no'"):
            op(model, batched="no")
        with pytest.raises(TypeError, match="recompute must be True or False, got 0.5"):
            op(model, recompute=0.5)
    with pytest.raises(TypeError, match="batched must be True or False, got 1"):
        pg.second_partial(model, 0, 1, batched=1)
    got = pg.laplacian(model, batched=np.bool_(True), recompute=np.bool_(False))(points)
    want = jax.vmap(pg.laplacian(model))(points)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["mlp", "eqx", "generic"])
def test_forward_over_reverse_works_through_the_batched_custom_vjp(kind):
    """jax.hessian (forward over reverse) of a batched=True, recompute=True operator and a
    Hessian-vector product of a loss in its parameters work and equal recompute=False; the
    error for forward mode first says so rather than listing jax.hessian as failing."""
    model = (lambda y: jnp.sin(y[0]) * y[1] ** 3) if kind == "generic" else _model(kind, d=2)
    xs = _points(3, d=2)
    ours, plain = (pg.laplacian(model, batched=True, recompute=rc) for rc in (True, False))
    assert _rel(jax.hessian(ours)(xs), jax.hessian(plain)(xs)) < RTOL
    with pytest.raises(TypeError, match=r"jax\.jvp or jax\.jacfwd of it.*jax\.hessian.*works"):
        jax.jacfwd(ours)(xs)
    if kind == "generic":
        return
    params, static = eqx.partition(model, eqx.is_inexact_array)

    def loss(p, recompute):
        op = pg.laplacian(eqx.combine(p, static), batched=True, recompute=recompute)
        return jnp.mean(op(xs) ** 2)

    def hvp(recompute):
        grad = jax.grad(lambda p: loss(p, recompute))
        return jax.jvp(grad, (params,), (params,))[1]

    assert _tree_rel(hvp(True), hvp(False)) < RTOL


def _small_mlp(out="scalar", d=3):
    return _f64(pg.MLP(d, out, 6, 2, "tanh", key=jax.random.key(0)))


def test_negative_spatial_indices_name_the_same_coordinates():
    """Negative `spatial` indices count from the end; two names of one coordinate are refused."""
    model = _small_mlp()
    x = jnp.array([0.3, -0.5, 0.8])
    hess = jax.jit(jax.hessian(model))(x)
    assert _rel(jax.jit(pg.laplacian(model, spatial=(0, -1)))(x), hess[0, 0] + hess[2, 2]) < RTOL
    assert _rel(jax.jit(pg.hessian_diagonal(model, spatial=-2))(x), hess[1, 1][None]) < RTOL
    for spatial in ((2, -1), (-3, 0)):
        with pytest.raises(ValueError, match="spatial must not repeat a coordinate"):
            pg.laplacian(model, spatial=spatial)(x)
        with pytest.raises(ValueError, match="spatial must not repeat a coordinate"):
            pg.laplacian(model, spatial=spatial, batched=True)(x[None])


@pytest.mark.parametrize("batched", [False, True])
def test_fourier_frequencies_get_no_gradient(batched):
    """FourierMLP's frequencies B are not trained: their gradient is exactly zero."""
    model = _f64(pg.FourierMLP(2, "scalar", 6, 1, num_features=3, key=jax.random.key(0)))
    xs = jnp.asarray([[0.3, -0.4], [0.6, 0.1]])

    def loss(m):
        op = pg.laplacian(m, batched=batched)
        return jnp.sum((op(xs) if batched else jax.vmap(op)(xs)) ** 2 + jax.vmap(m)(xs))

    grads = eqx.filter_jit(eqx.filter_grad(loss))(model)
    assert float(jnp.max(jnp.abs(grads.mlp.layers[0].weight))) > 1e-6  # the MLP does train
    assert not np.any(np.asarray(grads.frequencies))


def test_time_derivative_of_one_component():
    """`component=` picks the component whose time derivative is taken."""
    model = _small_mlp(out=3)
    x = jnp.array([0.3, -0.5, 0.8])
    jac = jax.jit(jax.jacfwd(model))(x)
    for c in (1, 2, -1):
        assert _rel(pg.time_derivative(model, component=c)(x), jac[c, -1]) < RTOL
    assert _rel(pg.time_derivative(model, time_index=0, component=2)(x), jac[2, 0]) < RTOL
    with pytest.raises(ValueError, match="component 3 is out of range"):
        pg.time_derivative(model, component=3)(x)


def test_advection_of_one_component():
    """`component=` picks the advected component, with a given velocity and self-advection."""
    model = _small_mlp(out=3)
    x = jnp.array([0.3, -0.5, 0.8])
    jac = jax.jit(jax.jacfwd(model))(x)
    v = jnp.array([0.7, -1.1])
    for c in (1, 2):
        assert (
            _rel(pg.advection(model, v, spatial=(0, 1), component=c)(x), (jac[:, :2] @ v)[c]) < RTOL
        )
        assert _rel(pg.advection(model, component=c)(x), (jac @ model(x))[c]) < RTOL
    with pytest.raises(ValueError, match="component -4 is out of range"):
        pg.advection(model, v, spatial=(0, 1), component=-4)(x)


def test_a_negative_component_counts_from_the_end():
    """`component=-1` is the last output, per point and batched."""
    model = _small_mlp(out=3)
    xs = jnp.asarray([[0.3, -0.5, 0.8], [0.1, 0.2, -0.4]])
    hess = jax.jit(jax.vmap(jax.hessian(model)))(xs)
    for batched in (False, True):
        op = pg.laplacian(model, component=-1, batched=batched)
        got = jax.jit(op if batched else jax.vmap(op))(xs)
        assert _rel(got, jnp.trace(hess[:, 2], axis1=1, axis2=2)) < RTOL
    mixed = jax.jit(jax.vmap(pg.second_partial(model, 0, 1, component=-2)))(xs)
    assert _rel(mixed, hess[:, 1, 0, 1]) < RTOL


def test_an_empty_spatial_is_refused():
    """`spatial=()` raises the documented error, not an IndexError or an empty result."""
    model = _small_mlp()
    x = jnp.array([0.3, -0.5, 0.8])

    def fn(y):
        return jnp.sum(jnp.sin(y) ** 2)

    for f in (model, fn):
        for op in (pg.laplacian, pg.hessian_diagonal, pg.vector_laplacian):
            with pytest.raises(ValueError, match="spatial must name at least one input coordinate"):
                op(f, spatial=())(x)
        with pytest.raises(ValueError, match="spatial must name at least one input coordinate"):
            pg.hessian_diagonal(f, spatial=[], batched=True)(x[None])
        with pytest.raises(ValueError, match="spatial must name at least one input coordinate"):
            pg.gradient(f, spatial=())(x)


@pytest.mark.parametrize("use_bias,use_final_bias", [(False, False), (True, False), (False, True)])
def test_batched_gradient_of_an_equinox_mlp_without_biases(use_bias, use_final_bias):
    """An `eqx.nn.MLP` without biases takes the batched custom VJP; its gradient is right."""
    model = eqx.nn.MLP(
        2,
        "scalar",
        5,
        2,
        jnp.tanh,
        use_bias=use_bias,
        use_final_bias=use_final_bias,
        key=jax.random.key(0),
        dtype=jnp.float64,
    )
    xs = jnp.asarray([[0.3, -0.4], [0.6, 0.1], [-0.2, 0.9]])

    def loss(mx):
        m, xs = mx
        return jnp.sum(pg.laplacian(m, batched=True)(xs) ** 2)

    def reference(mx):
        m, xs = mx
        return jnp.sum(jax.vmap(lambda x: jnp.trace(jax.hessian(m)(x)))(xs) ** 2)

    got = eqx.filter_jit(eqx.filter_grad(loss))((model, xs))
    want = eqx.filter_jit(eqx.filter_grad(reference))((model, xs))
    assert _tree_rel(got, want) < RTOL
