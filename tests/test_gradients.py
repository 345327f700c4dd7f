"""Tests for physjax.gradients: operators vs jax.hessian references, gradients, transforms."""

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
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(_rel(x, y) for x, y in pairs if np.max(np.abs(np.asarray(y))) > 0)


def _model(kind, d=3, out="scalar", depth=3, activation="tanh", width=12, seed=0):
    key = jax.random.key(seed)
    if kind == "mlp":
        m = pg.MLP(d, out, width, depth, activation, key=key)
    elif kind == "fourier":
        m = pg.FourierMLP(d, out, width, depth, activation, num_features=6, key=key)
    elif kind == "modified":
        m = pg.ModifiedMLP(d, out, width, depth, activation, key=key)
    elif kind == "eqx":
        m = eqx.nn.MLP(d, out, width, depth, getattr(jnp, activation, jax.nn.gelu), key=key)
    else:
        raise ValueError(kind)
    return _f64(m)


def _points(n=4, d=3, seed=1):
    return jax.random.normal(jax.random.key(seed), (n, d), dtype=jnp.float64)


MODELS = [
    ("mlp", 2, "tanh"),
    ("mlp", 8, "sin"),
    ("mlp", 4, "gelu"),
    ("fourier", 2, "tanh"),
    ("modified", 3, "gelu"),
    ("eqx", 2, "tanh"),
]


@pytest.mark.parametrize("kind,depth,activation", MODELS)
def test_second_order_operators_match_hessian(kind, depth, activation):
    model = _model(kind, depth=depth, activation=activation)

    @eqx.filter_jit
    def evaluate(model, x):
        hess = jax.hessian(model)(x)
        ours = (
            pg.laplacian(model)(x),
            pg.laplacian(model, spatial=(0, 1))(x),
            pg.hessian_diagonal(model)(x),
            pg.second_partial(model, 0, 2)(x),
            pg.second_partial(model, 1, 1)(x),
            pg.gradient(model)(x),
        )
        ref = (
            jnp.trace(hess),
            hess[0, 0] + hess[1, 1],
            jnp.diag(hess),
            hess[0, 2],
            hess[1, 1],
            jax.grad(model)(x),
        )
        return ours, ref

    ours, ref = jax.vmap(evaluate, (None, 0))(model, _points(3))
    for a, b in zip(ours, ref, strict=True):
        assert _rel(a, b) < RTOL


@pytest.mark.parametrize("kind", ["mlp", "modified", "fourier"])
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


@pytest.mark.parametrize("kind", ["mlp", "fourier", "modified", "generic"])
def test_parameter_gradient_matches_naive(kind):
    xs = _points(5)
    if kind == "generic":
        model = _f64(jax.random.normal(jax.random.key(3), (3,)))

        def field(w):
            return lambda x: jnp.sin(w @ x) * jnp.tanh(w[0] * x[1] + x[2])

        def lap(w, spatial):
            return pg.laplacian(field(w), spatial=spatial)

        def ref_fn(w):
            return field(w)
    else:
        model = _model(kind, depth=4)

        def lap(m, spatial):
            return pg.laplacian(m, spatial=spatial)

        def ref_fn(m):
            return m

    def loss(m):
        r = jax.vmap(lap(m, (0, 1)))(xs) - jnp.sin(xs[:, 2])
        return jnp.mean(r**2)

    def loss_ref(m):
        r = jax.vmap(lambda x: jnp.trace(jax.hessian(ref_fn(m))(x)[:2, :2]))(xs)
        return jnp.mean((r - jnp.sin(xs[:, 2])) ** 2)

    (val, g) = eqx.filter_jit(eqx.filter_value_and_grad(loss))(model)
    (val_ref, g_ref) = eqx.filter_jit(eqx.filter_value_and_grad(loss_ref))(model)
    assert _tree_rel(g, g_ref) < RTOL
    assert abs(float(val) - float(val_ref)) < RTOL * float(val_ref)


def test_custom_vjp_flag_gives_same_gradient():
    model = _model("mlp", depth=3, activation="sin")
    xs = _points(4)

    def loss(m, flag):
        return jnp.mean(jax.vmap(pg.laplacian(m, recompute=flag))(xs) ** 2)

    g1 = eqx.filter_jit(eqx.filter_grad(loss))(model, True)
    g2 = eqx.filter_jit(eqx.filter_grad(loss))(model, False)
    assert _tree_rel(g1, g2) < RTOL


def test_check_grads_params_and_points():
    model = _model("mlp", depth=2, width=6)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    xs = _points(3)

    def loss(params, xs):
        m = eqx.combine(params, static)
        return jnp.mean(jax.vmap(pg.laplacian(m, spatial=(0, 1)))(xs) ** 2)

    check_grads(jax.jit(loss), (params, xs), order=1, modes=["rev"], eps=1e-4)

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


def test_jit_vmap_and_parameter_vmap():
    model = _model("modified", depth=3)
    xs = _points(3)
    op = pg.laplacian(model, spatial=(0, 1))
    loop = jnp.stack([op(x) for x in xs])
    assert _rel(jax.vmap(op)(xs), loop) < 1e-13
    assert _rel(jax.jit(jax.vmap(op))(xs), loop) < 1e-12
    # vmap over an ensemble of parameters
    keys = jax.random.split(jax.random.key(7), 3)
    ensemble = eqx.filter_vmap(lambda k: _f64(pg.MLP(3, "scalar", 8, 2, key=k)))(keys)

    def per_model(m):
        return jax.vmap(pg.laplacian(m))(xs)

    batched = eqx.filter_jit(eqx.filter_vmap(per_model))(ensemble)
    params, static = eqx.partition(ensemble, eqx.is_array)
    for i in range(3):
        member = eqx.combine(jax.tree.map(lambda a, i=i: a[i], params), static)
        assert _rel(batched[i], eqx.filter_jit(per_model)(member)) < 1e-12


@pytest.mark.multidevice
def test_shard_map_over_points_matches_single_device():
    assert len(jax.devices()) >= 4
    mesh = jax.make_mesh((4,), ("points",), axis_types=(jax.sharding.AxisType.Auto,))
    model = _model("mlp", depth=3)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    xs = jax.device_put(_points(16), jax.sharding.NamedSharding(mesh, P("points")))

    def local_loss(params, xs):
        m = eqx.combine(params, static)
        r = jax.vmap(pg.laplacian(m, spatial=(0, 1)))(xs)
        return jax.lax.psum(jnp.sum(r**2), "points") / 16, r

    sharded = jax.jit(
        jax.shard_map(
            local_loss, mesh=mesh, in_specs=(P(), P("points")), out_specs=(P(), P("points"))
        )
    )
    loss, res = sharded(params, xs)

    def plain(params, xs):
        m = eqx.combine(params, static)
        r = jax.vmap(pg.laplacian(m, spatial=(0, 1)))(xs)
        return jnp.mean(r**2), r

    loss_ref, res_ref = jax.jit(plain)(params, xs)
    assert _rel(res, res_ref) < 1e-12
    assert _rel(loss, loss_ref) < 1e-12
    g = jax.jit(jax.grad(lambda p: sharded(p, xs)[0]))(params)
    g_ref = jax.jit(jax.grad(lambda p: plain(p, xs)[0]))(params)
    assert _tree_rel(g, g_ref) < 1e-10


def test_float32():
    model = pg.MLP(2, "scalar", 16, 3, "tanh", key=jax.random.key(0), dtype=jnp.float32)
    x = jnp.array([0.1, -0.4], dtype=jnp.float32)
    out = eqx.filter_jit(lambda m, x: pg.laplacian(m)(x))(model, x)
    assert out.dtype == jnp.float32
    ref = jnp.trace(jax.hessian(_f64(model))(x.astype(jnp.float64)))
    assert _rel(out, ref) < 1e-4


def test_memory_bounded_versus_nested_reverse():
    """The compiled training step keeps far less temporary memory than jax.hessian."""
    model = pg.MLP(3, "scalar", 32, 6, "tanh", key=jax.random.key(0), dtype=jnp.float32)
    xs = jax.random.normal(jax.random.key(1), (512, 3), dtype=jnp.float32)

    def step(op):
        def loss(m):
            return jnp.mean(jax.vmap(op(m))(xs) ** 2)

        grad = eqx.filter_grad(loss)
        return jax.jit(lambda m: grad(m)).lower(model).compile().memory_analysis()

    ours = step(lambda m: pg.laplacian(m)).temp_size_in_bytes
    naive = step(lambda m: lambda x: jnp.trace(jax.hessian(m)(x))).temp_size_in_bytes
    assert ours < 0.6 * naive, (ours, naive)


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
    with pytest.raises(ValueError, match=r"velocity must have shape \(2,\)"):
        pg.advection(model, jnp.ones(3), spatial=(0, 1))(jnp.zeros(3))


def test_error_model_configuration():
    with pytest.raises(ValueError, match="depth"):
        pg.MLP(2, 1, 8, 0, key=jax.random.key(0))
    with pytest.raises(ValueError, match="activation must be a callable or one of"):
        pg.MLP(2, 1, 8, 2, "relu6", key=jax.random.key(0))
    with pytest.raises(ValueError, match="out_size must be a positive int or 'scalar'"):
        pg.ModifiedMLP(2, 0, 8, 2, key=jax.random.key(0))
