"""A plain vectorised NumPy implementation of physjax's shallow-water scheme, for benchmarks.

Doubly periodic, f-plane, inviscid: the Sadourny (1975) energy-conserving C-grid right-hand
side with ``np.roll`` stencils and SSP-RK3, exactly the arithmetic of
``physjax.solvers.ShallowWater`` for that configuration. ``dt`` must be a Python float: under
NumPy 2 an ``np.float64`` scalar would silently upcast float32 fields.
"""

from __future__ import annotations

import numpy as np


def _bx(a):  # a[i-1]
    return np.roll(a, 1, axis=1)


def _fx(a):  # a[i+1]
    return np.roll(a, -1, axis=1)


def _by(a):
    return np.roll(a, 1, axis=0)


def _fy(a):
    return np.roll(a, -1, axis=0)


def rhs(h, u, v, *, g, f, dx, dy):
    # each shifted or squared array is computed once (a fair baseline does no work twice)
    h_bx, h_by = _bx(h), _by(h)
    uu, vv = u * u, v * v
    U = 0.5 * (h + h_bx) * u
    V = 0.5 * (h + h_by) * v
    zeta = (v - _bx(v)) / dx - (u - _by(u)) / dy
    hq = 0.25 * (h + h_bx + h_by + _bx(h_by))
    q = (f + zeta) / hq
    K = 0.5 * (0.5 * (uu + _fx(uu)) + 0.5 * (vv + _fy(vv)))
    B = g * h + K
    dh = -((_fx(U) - U) / dx + (_fy(V) - V) / dy)
    qV = q * 0.5 * (V + _bx(V))
    du = 0.5 * (qV + _fy(qV)) - (B - _bx(B)) / dx
    qU = q * 0.5 * (U + _by(U))
    dv = -0.5 * (qU + _fx(qU)) - (B - _by(B)) / dy
    return dh, du, dv


def ssprk3(h, u, v, dt: float, **kw):
    assert isinstance(dt, float) and not isinstance(dt, np.floating)
    k = rhs(h, u, v, **kw)
    h1, u1, v1 = (a + dt * b for a, b in zip((h, u, v), k))
    k = rhs(h1, u1, v1, **kw)
    h2, u2, v2 = (a + 0.25 * (b + dt * c - a) for a, b, c in zip((h, u, v), (h1, u1, v1), k))
    k = rhs(h2, u2, v2, **kw)
    return tuple(a + (2 / 3) * (b + dt * c - a) for a, b, c in zip((h, u, v), (h2, u2, v2), k))
