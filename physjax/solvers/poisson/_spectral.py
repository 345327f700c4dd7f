"""Exact solution of the discrete Poisson problem in the stencil's eigenbasis.

Per axis the second-difference stencil is diagonalised by the FFT (periodic), the DST-II
(Dirichlet, odd reflection at walls half a cell away) or the DCT-II (Neumann, even
reflection); see [`physjax.solvers.poisson._transforms`][]. The transformed right-hand side
is divided by the sum of the 1-D eigenvalues and transformed back. The zero mode of a
problem without Dirichlet axes is set to zero (zero-mean gauge).

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


def _inverse_eigenvalues(lams: Sequence[jax.Array], dtype) -> jax.Array:
    d = len(lams)
    total = 0
    for axis, lam in enumerate(lams):
        shape = [1] * d
        shape[axis] = lam.shape[0]
        total = total + lam.astype(dtype).reshape(shape)
    safe = jnp.where(total == 0, 1, total)
    return jnp.where(total == 0, 0, 1 / safe)


def _inverse_eigenvalues_np(lams: Sequence[np.ndarray]) -> np.ndarray:
    """As [`_inverse_eigenvalues`][], in NumPy at trace time: a constant of the compiled
    solve instead of a pass over the spectrum at every call."""
    total = sum(
        np.reshape(lam, [-1 if b == a else 1 for b in range(len(lams))])
        for a, lam in enumerate(lams)
    )
    return np.where(total == 0, 0.0, 1.0 / np.where(total == 0, 1.0, total))


def spectral_solve_local(
    f: jax.Array, grid: Grid, bc: Sequence[str], continuous: bool = False
) -> jax.Array:
    """Solve ∇²u = f on one device (homogeneous boundary conditions)."""
    d = grid.ndim
    real_axes = [a for a in range(d) if bc[a] != "periodic"]
    fft_axes = [a for a in range(d) if bc[a] == "periodic"]
    g = f
    for a in real_axes:
        g = _FORWARD[bc[a]](g, a)
    if fft_axes:
        g = jnp.fft.rfftn(g, axes=fft_axes)
    lams = []
    for a in range(d):
        half = bool(fft_axes) and a == fft_axes[-1]
        lams.append(
            eigenvalues(bc[a], grid.shape[a], grid.spacing[a], half=half, continuous=continuous)
        )
    g = g * jnp.asarray(_inverse_eigenvalues_np(lams), dtype=f.dtype)
    if fft_axes:
        g = jnp.fft.irfftn(g, s=[grid.shape[a] for a in fft_axes], axes=fft_axes)
    for a in reversed(real_axes):
        g = _INVERSE[bc[a]](g, a)
    return g.astype(f.dtype)


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
    f: jax.Array, grid: Grid, bc: Sequence[str], continuous: bool = False
) -> jax.Array:
    """Solve ∇²u = f inside ``shard_map`` on a decomposed grid by slab transposes."""
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
    x = x * _inverse_eigenvalues(lams, real_dtype)

    x = inverse(x, 0)
    x = lax.all_to_all(x, group, 0, last, tiled=True)
    for a in reversed(trailing_order()):
        x = inverse(x, a)
    if jnp.iscomplexobj(x):
        x = x.real
    return from_slab(x).astype(f.dtype)
