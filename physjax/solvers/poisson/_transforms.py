"""Fast sine and cosine transforms (DST-II / DCT-II) from real FFTs, and their inverses.

For cell-centred values ``x_j`` at ``(j + 1/2) h`` the DCT-II

    C_k = Σ_j x_j cos(π k (2j + 1) / 2n),          k = 0 … n-1,

diagonalises the second-difference stencil with even (Neumann) reflection at the walls and
the DST-II

    S_k = Σ_j x_j sin(π (k + 1) (2j + 1) / 2n),    k = 0 … n-1,

the one with odd (Dirichlet) reflection. Both are computed with one real FFT of length
``n`` of the reordered sequence ``v = (x_0, x_2, x_4, …, x_5, x_3, x_1)`` and a twiddle
(Makhoul 1980); the inverses undo each step exactly. ``S_k = C_{n-1-k}`` of ``(-1)^j x_j``.

References: J. Makhoul, "A fast cosine transform in one and two dimensions", IEEE Trans.
ASSP 28 (1980) 27–34, doi:10.1109/TASSP.1980.1163351.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _last(fn):
    """Apply a last-axis transform along ``axis``; complex input transforms Re and Im."""

    def wrapped(x: jax.Array, axis: int = -1) -> jax.Array:
        if jnp.iscomplexobj(x):
            return jax.lax.complex(wrapped(x.real, axis), wrapped(x.imag, axis))
        if axis in (-1, x.ndim - 1):
            return fn(x)
        return jnp.moveaxis(fn(jnp.moveaxis(x, axis, -1)), -1, axis)

    return wrapped


def _twiddle(n: int, dtype, sign: int) -> jax.Array:
    k = np.arange(n // 2 + 1)
    w = np.exp(sign * 1j * np.pi * k / (2 * n))
    return jnp.asarray(w, dtype=jnp.result_type(dtype, jnp.complex64))


@_last
def dct2(x: jax.Array) -> jax.Array:
    """Unnormalised DCT-II along ``axis`` (default last)."""
    n = x.shape[-1]
    v = jnp.concatenate([x[..., 0::2], x[..., 1::2][..., ::-1]], axis=-1)
    z = jnp.fft.rfft(v, axis=-1) * _twiddle(n, x.dtype, -1)
    high = -z.imag[..., 1 : (n + 1) // 2][..., ::-1]
    return jnp.concatenate([z.real, high], axis=-1)


@_last
def idct2(c: jax.Array) -> jax.Array:
    """Inverse of [`dct2`][] along ``axis`` (default last)."""
    n = c.shape[-1]
    m = n // 2 + 1
    flipped = jnp.concatenate(
        [jnp.zeros_like(c[..., :1]), c[..., ::-1][..., : m - 1]], axis=-1
    )  # c_{n-k}, with c_n = 0
    z = jax.lax.complex(c[..., :m], -flipped) * _twiddle(n, c.dtype, 1)
    v = jnp.fft.irfft(z, n=n, axis=-1)
    ne = (n + 1) // 2
    even = v[..., :ne]
    odd = v[..., ne:][..., ::-1]
    if n % 2:
        odd = jnp.concatenate([odd, jnp.zeros((*odd.shape[:-1], 1), odd.dtype)], axis=-1)
    x = jnp.stack([even, odd], axis=-1).reshape(*v.shape[:-1], 2 * ne)
    return x[..., :n]


def _alternating(n: int, dtype) -> jax.Array:
    return jnp.asarray(1 - 2 * (np.arange(n) % 2), dtype)


@_last
def dst2(x: jax.Array) -> jax.Array:
    """Unnormalised DST-II along ``axis`` (default last)."""
    n = x.shape[-1]
    return dct2(x * _alternating(n, x.dtype))[..., ::-1]


@_last
def idst2(s: jax.Array) -> jax.Array:
    """Inverse of [`dst2`][] along ``axis`` (default last)."""
    n = s.shape[-1]
    return idct2(s[..., ::-1]) * _alternating(n, s.dtype)


def eigenvalues(
    kind: str, n: int, h: float, *, half: bool = False, continuous: bool = False
) -> np.ndarray:
    """Eigenvalues (float64, ≤ 0) of the 1-D second difference in the transform's mode order.

    ``periodic``: FFT order (``half``: the ``n // 2 + 1`` modes of a real FFT);
    ``dirichlet``: DST-II order; ``neumann``: DCT-II order. With ``continuous`` the
    eigenvalues ``-κ²`` of the exact second derivative on the same modes (spectral
    accuracy) instead of ``-(2 sin(κh/2)/h)²``.
    """
    if kind == "periodic":
        k = np.arange(n // 2 + 1) if half else np.arange(n)
        k = np.minimum(k, n - k)
        theta = np.pi * k / n
    elif kind == "dirichlet":
        theta = np.pi * (np.arange(n) + 1) / (2 * n)
    else:
        theta = np.pi * np.arange(n) / (2 * n)
    if continuous:
        return -((2.0 * theta / h) ** 2)
    return -((2.0 * np.sin(theta) / h) ** 2)
