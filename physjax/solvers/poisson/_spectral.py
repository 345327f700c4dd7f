"""Exact solution of the discrete Poisson problem in the stencil's eigenbasis.

Per axis the second-difference stencil is diagonalised by the FFT (periodic), the DST-II
(Dirichlet, odd reflection at walls half a cell away) or the DCT-II (Neumann, even
reflection); see [`physjax.solvers.poisson._transforms`][]. The transformed right-hand side
is divided by the sum of the 1-D eigenvalues and transformed back. The zero mode of a
problem without Dirichlet axes is set to zero (zero-mean gauge). With a Helmholtz
``shift`` (``∇²u - shift u = f``, ``shift > 0``) the divisor is the sum minus ``shift``,
never zero: every mode, the zero mode included, is solved.

On one device every combination of boundary conditions is solved with one multi-axis real
FFT and its inverse (see [`spectral_solve_local`][]): sine/cosine axes are reordered before
the FFT and their coefficient pairs combined in one pass over the spectrum, so no axis is
transposed and no transform is run axis by axis.

On a decomposed grid the transforms run on slabs: a first round of ``lax.all_to_all``
gathers every axis but the first on each device (the first split over all devices), the
trailing axes are transformed, a second all-to-all over all devices gathers the first axis
(splitting the last) for its transform, and the inverse retraces the same steps.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...grids import Grid
from ._transforms import dct2, dst2, eigenvalues, idct2, idst2

_FORWARD = {"dirichlet": dst2, "neumann": dct2}
_INVERSE = {"dirichlet": idst2, "neumann": idct2}


def _inverse_eigenvalues(lams: Sequence[jax.Array], dtype, shift=None) -> jax.Array:
    d = len(lams)
    total = 0
    for axis, lam in enumerate(lams):
        shape = [1] * d
        shape[axis] = lam.shape[0]
        total = total + lam.astype(dtype).reshape(shape)
    if shift is not None:
        return 1 / (total - shift)  # eigenvalues ≤ 0, shift > 0: never zero
    safe = jnp.where(total == 0, 1, total)
    return jnp.where(total == 0, 0, 1 / safe)


def spectral_solve_local(
    f: jax.Array,
    grid: Grid,
    bc: Sequence[str],
    continuous: bool = False,
    with_sum: bool = False,
    shift: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Solve ∇²u = f on one device (homogeneous boundary conditions), or
    ∇²u - shift u = f with a scalar ``shift > 0``.

    One real FFT over all axes and one inverse, whatever the boundary conditions: each
    Dirichlet/Neumann axis is reordered as in Makhoul's fast cosine transform (on Dirichlet
    axes the odd points negated, i.e. multiplied by ``(-1)^j``, which turns the DST-II into
    a reversed DCT-II), and
    the pairs of FFT coefficients ``(k, -k)`` that make up the cosine coefficients are
    combined, divided by the eigenvalues and split again in one pass over the spectrum.
    This is the same exact discrete solve as transforming axis by axis with
    [`dst2`][physjax.solvers.poisson._transforms.dst2] /
    [`dct2`][physjax.solvers.poisson._transforms.dct2], with two FFT calls instead of
    one per axis and direction, and no transposes.

    With ``with_sum`` also returns Σ f, read from the zero mode of the forward transform
    (valid without Dirichlet axes, whose reordering negates points): the compatibility
    check of a periodic/Neumann problem then needs no reduction of its own for the mean.
    """
    d = grid.ndim
    last = d - 1
    dtype = f.dtype
    shape = grid.shape
    # eigenvalues in the order of the (reordered-FFT) cosine index of each axis
    lams = []
    for a in range(d):
        lam = eigenvalues(bc[a], shape[a], grid.spacing[a], half=a == last, continuous=continuous)
        lams.append(lam[::-1] if bc[a] == "dirichlet" else lam)
    paired = [a for a in range(last) if bc[a] != "periodic"]
    complex_axes = [a for a in range(last) if bc[a] == "periodic"]

    def along(v, a):
        return jnp.asarray(np.reshape(v, [-1 if b == a else 1 for b in range(d)]), dtype)

    def inverse_sum(per_axis):
        # 1 / Σ λ built from the 1-D eigenvalue vectors inside the graph: XLA fuses it into
        # the pass over the spectrum, which then reads no eigenvalue table (a table of the
        # spectrum's size, baked in as a constant, was no faster and made the compiled
        # program as large as the field).
        total = sum(along(v, a) for a, v in enumerate(per_axis))
        if shift is not None:
            return 1 / (total - shift)  # eigenvalues ≤ 0, shift > 0: never zero
        return jnp.where(total == 0, 0, 1 / jnp.where(total == 0, 1, total))

    def twiddle(a, m):
        w = np.exp(-0.5j * np.pi * np.arange(m) / shape[a])
        return along(w.real, a), along(w.imag, a)

    # (-1)^j on a Dirichlet axis is +1 on the even and -1 on the odd points: the odd ones
    # are negated as they are reordered (and again as they are put back).
    x = f
    for a in range(d):
        if bc[a] != "periodic":
            x = _reorder(x, a, negate_odd=bc[a] == "dirichlet")
    spec = jnp.fft.rfftn(x)
    total = jnp.real(spec[(0,) * d])
    for a in paired:
        # In complex arithmetic, so that each gathered partner has one consumer: split into
        # real and imaginary parts, XLA materialised the partners of a 3-D problem's two
        # paired axes (9 kernels instead of 6, 128³ ~20% slower); 2-D is one pass either way.
        w = lax.complex(*twiddle(a, shape[a]))
        spec = 0.5 * (w * spec + jnp.conj(w) * _flip_mod(spec, a))
    z = (spec.real, spec.imag)
    if bc[last] == "periodic":
        z = _c_scale(z, inverse_sum(lams))
    else:
        n = shape[last]
        m = n // 2 + 1
        k = np.arange(1, m)
        mirrored = np.concatenate([[np.inf], lams[last][n - k]])  # index n: no such mode
        inv_k = inverse_sum([*lams[:last], lams[last][:m]])
        inv_mirror = inverse_sum([*lams[:last], mirrored])
        w = twiddle(last, m)
        zw = _c_mul(w, z)
        if complex_axes:
            partner = z
            for a in complex_axes:
                partner = _c_map(_flip_mod, partner, a)
            q = _c_mul(_c_conj(w), _c_conj(partner))
            c_k = _c_scale(_c_add(zw, q), 0.5)
            c_mirror = _c_scale(_c_times_i(_c_sub(zw, q)), 0.5)
            solved = _c_sub(_c_scale(c_k, inv_k), _c_times_i(_c_scale(c_mirror, inv_mirror)))
        else:
            # real data along the other axes: Re and -Im of w·z are the cosine coefficients
            # of modes k and n - k
            solved = (zw[0] * inv_k, zw[1] * inv_mirror)
        z = _c_mul(_c_conj(w), solved)
    for a in reversed(paired):
        w = twiddle(a, shape[a])
        z = _c_mul(_c_conj(w), _c_sub(z, _c_times_i(_c_map(_shift_mirror, z, a))))
    x = jnp.fft.irfftn(lax.complex(*z), s=shape)
    # Last axis first: a gather along the last axis carries a transpose, and when it was the
    # final step XLA could give the result a column-major layout (plus a copy back) when the
    # solution is returned inside a tuple, e.g. by eqx.filter_jit (docs/benchmarks.md).
    for a in reversed(range(d)):
        if bc[a] != "periodic":
            x = _unreorder(x, a, negate_odd=bc[a] == "dirichlet")
    if with_sum:
        if "dirichlet" in bc:
            raise ValueError("with_sum needs periodic/Neumann axes only")
        return x.astype(dtype), total.astype(dtype)
    return x.astype(dtype)


def _makhoul_order(n: int) -> np.ndarray:
    """Indices ``(0, 2, 4, …, 5, 3, 1)``: Makhoul's reordering of ``n`` points."""
    return np.concatenate([np.arange(0, n, 2), np.arange(n - 1 - n % 2, 0, -2)])


def _along(v: np.ndarray, a: int, ndim: int, dtype) -> jax.Array:
    return jnp.asarray(np.reshape(v, [-1 if b == a else 1 for b in range(ndim)]), dtype)


def _reorder(x, a, negate_odd=False):
    """``(x0, x2, x4, …, x5, x3, x1)`` along axis ``a`` (Makhoul's ordering); with
    ``negate_odd`` the odd-indexed points change sign.

    A gather with constant indices: on XLA:CPU this runs at copy speed, 2–3× faster than
    the same permutation written as strided slices, a reversal and a concatenation.
    """
    n = x.shape[a]
    x = jnp.take(x, _makhoul_order(n), axis=a, mode="clip")
    if negate_odd:
        x = x * _along(np.where(np.arange(n) < (n + 1) // 2, 1.0, -1.0), a, x.ndim, x.dtype)
    return x


def _unreorder(v, a, negate_odd=False):
    """Inverse of [`_reorder`][]."""
    n = v.shape[a]
    v = jnp.take(v, np.argsort(_makhoul_order(n)), axis=a, mode="clip")
    if negate_odd:
        v = v * _along(1.0 - 2.0 * (np.arange(n) % 2), a, v.ndim, v.dtype)
    return v


def _flip_mod(x, a):
    """``y[k] = x[(-k) mod n]`` along axis ``a``.

    A constant-index gather, which XLA:CPU fuses into the pass that consumes it; written
    as a slice, a reversal and a concatenation it was materialised as a separate pass over
    the spectrum (one for the real and one for the imaginary part).
    """
    n = x.shape[a]
    return jnp.take(x, (-np.arange(n)) % n, axis=a, mode="clip")


def _shift_mirror(x, a):
    """``y[k] = x[n - k]`` along axis ``a``, with ``y[0] = 0``."""
    n = x.shape[a]
    first = _along(np.arange(n) == 0, a, x.ndim, bool)
    return jnp.where(first, jnp.zeros((), x.dtype), _flip_mod(x, a))


# Complex numbers as (real, imaginary) pairs of real arrays: XLA:CPU vectorises real
# arithmetic, not complex.
def _c_mul(p, q):
    return p[0] * q[0] - p[1] * q[1], p[0] * q[1] + p[1] * q[0]


def _c_add(p, q):
    return p[0] + q[0], p[1] + q[1]


def _c_sub(p, q):
    return p[0] - q[0], p[1] - q[1]


def _c_conj(p):
    return p[0], -p[1]


def _c_scale(p, s):
    return p[0] * s, p[1] * s


def _c_times_i(p):
    return -p[1], p[0]


def _c_map(fn, p, *args):
    return fn(p[0], *args), fn(p[1], *args)


def _split_axes(grid: Grid) -> tuple[str, ...]:
    return tuple(n for n, m in zip(grid.mesh_axes, grid.mesh_shape) if n is not None and m > 1)


def _group_index(grid: Grid) -> jax.Array:
    """Linear index of this device over all split mesh axes, outer axis first."""
    idx = 0
    for name, m in zip(grid.mesh_axes, grid.mesh_shape):
        if name is not None and m > 1:
            idx = idx * m + lax.axis_index(name)
    return idx


def spectral_solve_sharded(
    f: jax.Array,
    grid: Grid,
    bc: Sequence[str],
    continuous: bool = False,
    shift: jax.Array | None = None,
) -> jax.Array:
    """Solve ∇²u = f (or ∇²u - shift u = f, scalar ``shift > 0``) inside ``shard_map`` on
    a decomposed grid by slab transposes."""
    d = grid.ndim
    group = _split_axes(grid)
    p = 1
    for m in grid.mesh_shape:
        p *= m
    last = d - 1

    def to_slab(x):
        for a in range(1, d):
            name, m = grid.mesh_axes[a], grid.mesh_shape[a]
            if name is not None and m > 1:
                x = lax.all_to_all(x, name, 0, a, tiled=True)
        return x

    def from_slab(x):
        for a in reversed(range(1, d)):
            name, m = grid.mesh_axes[a], grid.mesh_shape[a]
            if name is not None and m > 1:
                x = lax.all_to_all(x, name, a, 0, tiled=True)
        return x

    def forward(x, a):
        if bc[a] == "periodic":
            return jnp.fft.fft(x, axis=a)
        return _FORWARD[bc[a]](x, a)

    def inverse(x, a):
        if bc[a] == "periodic":
            return jnp.fft.ifft(x, axis=a)
        return _INVERSE[bc[a]](x, a)

    def trailing_order():
        # Real-to-real transforms first, while the data are still real.
        axes = list(range(1, d))
        return [a for a in axes if bc[a] != "periodic"] + [a for a in axes if bc[a] == "periodic"]

    x = to_slab(f)
    for a in trailing_order():
        x = forward(x, a)
    x = lax.all_to_all(x, group, last, 0, tiled=True)
    x = forward(x, 0)

    lams = []
    for a in range(d):
        lam = jnp.asarray(eigenvalues(bc[a], grid.shape[a], grid.spacing[a], continuous=continuous))
        if a == last:
            n_loc = grid.shape[a] // p
            lam = lax.dynamic_slice_in_dim(lam, _group_index(grid) * n_loc, n_loc)
        lams.append(lam)
    real_dtype = f.dtype
    x = x * _inverse_eigenvalues(lams, real_dtype, shift)

    x = inverse(x, 0)
    x = lax.all_to_all(x, group, 0, last, tiled=True)
    for a in reversed(trailing_order()):
        x = inverse(x, a)
    if jnp.iscomplexobj(x):
        x = x.real
    return from_slab(x).astype(f.dtype)
