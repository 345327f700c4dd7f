"""SSP-RK3 steps of the shallow-water model advanced one strip of rows at a time.

On the CPU the unblocked step streams every intermediate field (padded copies, potential
vorticity, tendencies) through main memory once the grid outgrows the cache: about 36
field-sized passes per stage for 6 of real traffic. Here the grid is cut into strips of
``m`` full rows. Each strip is read with extra rows on either side (three per step, one per
RK stage: the stencil has radius one), all the stages of ``S`` steps are computed on that
small block (temporal blocking: ``3 S`` rows of overlap), and only the ``m`` final rows are
kept. The strips are visited by ``lax.fori_loop``, so one strip's intermediates are reused
from cache by the next strip's kernels instead of being written to memory, and the state
itself is read and written once per ``S`` steps. The arithmetic is the unblocked step's,
operation for operation: compiled, one step per visit gives the same result to the last
bit; with several, XLA fuses the longer chain differently (and so contracts some
multiply-adds differently) and the results agree to round-off
(tests/test_shallow_water_blocked.py).

Walls across the strips (a channel's north and south walls) are honoured by refilling the
ghost rows of the first and last strip from the stage state after every stage, exactly as
``fill_halo`` fills them for the unblocked step; walls along the strips (east/west) and
periodic axes are handled by the usual one-cell halo of each stage.
"""

from __future__ import annotations

import functools
import glob
import os
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from ...grids import Grid
from ...grids._halo import _pad_axis, _wall_ghosts

if TYPE_CHECKING:
    from ._model import ShallowWater, ShallowWaterState

#: Stages of SSP-RK3 = rows of overlap on either side of a strip.
OVERLAP = 3
#: Fields at least this large (bytes) are advanced in strips on the CPU by default when the
#: size of the last-level cache cannot be read.
AUTO_MIN_FIELD_BYTES = 4 * 2**20
#: Field-sized buffers the plain step keeps live (3 in, 3 out, 7 temporaries: XLA's memory
#: analysis of a compiled step). Strips pay off once these no longer fit in the last-level
#: cache.
PLAIN_WORKING_SET_FIELDS = 13
#: Target size (bytes) of one field of one strip, chosen so that the dozen intermediates
#: of a stage fit in a few MiB of cache (measured best with three steps per visit:
#: docs/benchmarks.md).
AUTO_STRIP_BYTES = 2**20
#: Steps advanced per visit of a strip when the strips are chosen automatically.
AUTO_STRIP_STEPS = 3
#: Grids with fewer columns are never blocked automatically: XLA:CPU runs the strips of
#: rows this short several times slower than the plain step (2-core AMD VM, three steps per
#: visit: 16384×64 float32 203 ns per cell-update against 34 plain, ×96 222 against 35,
#: ×112 195 against 38, 8192×64 float64 270 against 111; from ×128 up faster than plain).
AUTO_MIN_COLUMNS = 128


#: Where Linux describes the first CPU's caches.
CACHE_SYSFS = "/sys/devices/system/cpu/cpu0/cache"


@functools.cache
def last_level_cache_bytes() -> int | None:
    """Size of the CPU's last-level data cache, read from Linux's sysfs (None elsewhere)."""
    best = (0, None)
    for index in glob.glob(os.path.join(CACHE_SYSFS, "index*")):
        try:
            with open(os.path.join(index, "type")) as fh:
                kind = fh.read().strip()
            with open(os.path.join(index, "level")) as fh:
                level = int(fh.read())
            with open(os.path.join(index, "size")) as fh:
                text = fh.read().strip()
        except (OSError, ValueError):
            continue
        if kind not in ("Unified", "Data"):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
        try:
            size = int(text.rstrip("KMGkmg")) * scale
        except ValueError:
            continue
        best = max(best, (level, size))
    return best[1]


def auto_strip_rows(grid: Grid, cache_bytes: int | None | str = "detect", min_rows: int = 8) -> int:
    """Rows per strip chosen for ``grid`` on the CPU (0: do not block), at least ``min_rows``:
    about ``AUTO_STRIP_BYTES`` per field and at most half the rows, the largest divisor of
    ``ny`` from half that up if there is one.

    Strips pay off once the plain step's working set (``PLAIN_WORKING_SET_FIELDS`` fields)
    outgrows the last-level cache of ``cache_bytes`` (default: read from the machine; if it
    cannot be read, from fields of ``AUTO_MIN_FIELD_BYTES`` up). Measured: on a 2-core VM
    with 32 MiB of L3, three steps per visit, slower at 256² float64 (0.5 MiB fields), as
    fast at 512² (float32 and float64), faster from 1024² up (one step per visit: faster from
    768² float64 up); on a 2-core VM with 300 MiB of L3, one step per visit, slower up to
    1024² float64 and 2048² float32, faster at 2048² float64 (docs/benchmarks.md). Grids
    of fewer than ``AUTO_MIN_COLUMNS`` columns are not blocked: their strips run slower.
    """
    ny, nx = grid.shape
    if nx < AUTO_MIN_COLUMNS:
        return 0
    if cache_bytes == "detect":
        cache_bytes = last_level_cache_bytes()
    row_bytes = nx * jnp.dtype(grid.dtype).itemsize
    field = ny * row_bytes
    if cache_bytes is None:
        if field < AUTO_MIN_FIELD_BYTES:
            return 0
    elif PLAIN_WORKING_SET_FIELDS * field <= cache_bytes:
        return 0
    top = min(max(16, AUTO_STRIP_BYTES // row_bytes), ny // 2)
    if top < min_rows:
        return 0
    # a divisor of ny near the target saves compiling a first strip of other rows
    divisors = [m for m in range(max(min_rows, top // 2), top + 1) if ny % m == 0]
    return divisors[-1] if divisors else top


class StripAux(eqx.Module):
    """Fields a strip step reads besides the state, padded once per run by ``pad`` rows
    (at least the overlap of the steps that read them)."""

    f_corner: jax.Array  # f at corner rows -pad .. ny + pad, shape (ny + 2 pad + 1, 1)
    bottom: jax.Array | None  # (ny + 2 pad, nx + 2): rows padded by pad, columns by 1
    wind: tuple[jax.Array, jax.Array] | None  # (ny + 2 pad, nx) each
    pad: int = eqx.field(static=True)


def strip_aux(model: ShallowWater, steps: int = 1) -> StripAux:
    """What strips of ``steps`` steps per visit read besides the state."""
    g = model.grid
    ny = g.shape[0]
    H = OVERLAP * steps
    f_corner = model._coriolis_at_corner_rows(jnp.arange(-H, ny + H + 1))
    bottom = None
    if model.bottom is not None:
        bottom = _pad_axis(model.bottom, g, 0, "centre", 1, H)
        bottom = _pad_axis(bottom, _with_rows(g, ny + 2 * H), 1, "centre", 1, 1)
    wind = None
    if model.wind_stress is not None:
        wind = tuple(_pad_axis(w, g, 0, "centre", 1, H) for w in model.wind_stress)
    return StripAux(f_corner=f_corner, bottom=bottom, wind=wind, pad=H)


def _with_rows(g: Grid, rows: int, periodic_y: bool | None = None) -> Grid:
    """A grid of ``rows`` full rows with ``g``'s spacing and flags (``periodic_y`` overrides
    the y flag)."""
    py = g.periodic[0] if periodic_y is None else periodic_y
    return Grid(
        (rows, g.shape[1]),
        (g.spacing[0] * rows, g.extent[1]),
        periodic=(py, g.periodic[1]),
        origin=g.origin,
        dtype=g.dtype,
        _spacing=g.spacing,
    )


def blocked_ssprk3_steps(
    model: ShallowWater, state: ShallowWaterState, ts, dt, aux: StripAux, m: int
) -> ShallowWaterState:
    """``len(ts)`` SSP-RK3 steps of ``model``, the j-th from time ``ts[j]``, computed in
    strips of ``m`` rows (the first strip takes what ``m`` does not divide), each strip
    advanced through all the steps at one visit (see module doc). ``m`` must be at least the
    overlap, three rows per step, and at most ``ny``."""
    from ._model import ShallowWaterState

    g = model.grid
    ny, nx = g.shape
    S = len(ts)
    H = OVERLAP * S
    P = aux.pad
    if not (S >= 1 and H <= min(m, P) and m <= ny):  # pragma: no cover - guarded by callers
        raise ValueError(f"{S} steps need strips of {H} to ny rows and padding of {H} rows")
    bc = model._bc()
    names = ("h", "u", "v")
    walls_y = not g.periodic[0]
    fields = {k: getattr(state, k) for k in names}
    # The rows a strip reads beyond the grid's first and last row: ghost rows beyond the
    # walls as ``fill_halo`` fills them, or (periodic) the other end's original rows.
    if walls_y:
        edges = {k: _wall_ghosts(a, 0, H, bc[k][0][0], bc[k][1][0]) for k, a in fields.items()}
    else:
        edges = {k: (a[ny - H :], a[:H]) for k, a in fields.items()}

    def tendency(Y: dict, r: int | jax.Array, rows_in: int, t_stage):
        """Tendencies on rows r+1 .. r+rows_in-2 (global) of a stage state ``Y`` whose
        first row is global row ``r``: the model's own right-hand side on a grid of those
        rows, periodic along y because the rows above and below are in ``Y``."""
        rows_out = rows_in - 2
        sg = _with_rows(g, rows_out, periodic_y=True)
        sub = eqx.tree_at(lambda mm: mm.grid, model, sg)
        padded = {k: _pad_axis(Y[k], sg, 1, bc[k][0][1], bc[k][1][1], 1) for k in names}
        padded = lax.optimization_barrier(ShallowWaterState(**padded))
        f_corner = lax.dynamic_slice_in_dim(aux.f_corner, r + 1 + P, rows_out + 1, 0)
        bottom = None
        if aux.bottom is not None:
            bottom = lax.dynamic_slice_in_dim(aux.bottom, r + P, rows_in, 0)
        if aux.wind is not None:
            wind = tuple(lax.dynamic_slice_in_dim(w, r + 1 + P, rows_out, 0) for w in aux.wind)
            sub = eqx.tree_at(lambda mm: mm.wind_stress, sub, wind)
        k = sub._tendency(padded, t_stage, bottom, f_corner=f_corner)
        k = {n: getattr(k, n) for n in names}
        if walls_y:
            # The normal velocity on the south wall (global face row 0) does not change.
            rows = r + 1 + jnp.arange(rows_out)[:, None]
            k["v"] = jnp.where(rows == 0, 0, k["v"])
        return k

    def refill_walls(Y: dict, w: int, first, last) -> dict:
        """Ghost rows beyond the walls (the first ``w`` rows of a block at the south wall,
        the last ``w`` of one at the north wall; ``first``/``last``: whether it is there,
        a bool or a traced one) from the stage state, as ``fill_halo`` fills them."""
        if not walls_y or w == 0 or (first is False and last is False):
            return Y
        out = {}
        for k in names:
            a = Y[k]
            R = a.shape[0]
            if first is not False:
                low, _ = _wall_ghosts(a[w:], 0, w, bc[k][0][0], bc[k][1][0])
                a = a.at[:w].set(low if first is True else jnp.where(first, low, a[:w]))
            if last is not False:
                _, high = _wall_ghosts(a[: R - w], 0, w, bc[k][0][0], bc[k][1][0])
                a = a.at[R - w :].set(high if last is True else jnp.where(last, high, a[R - w :]))
            out[k] = a
        return out

    def rows_of(Y: dict, c: int) -> dict:
        return {k: a[c : a.shape[0] - c] for k, a in Y.items()}

    def gather(state, start, rows_out: int, head: dict, last) -> dict:
        """The block of a strip of ``rows_out`` rows from global row ``start``: ``head``
        (the ``H`` original rows above it), then its rows and the ``H`` below from
        ``state`` (not yet advanced there), or beyond the last row the edge rows."""
        rows = jnp.minimum(start + jnp.arange(rows_out + H), ny - 1)
        Y0 = {}
        for k in names:
            body = jnp.take(state[k], rows, axis=0, mode="clip")
            high = edges[k][1]
            if last is True:
                body = body.at[rows_out:].set(high)
            elif last is not False:
                body = body.at[rows_out:].set(jnp.where(last, high, body[rows_out:]))
            Y0[k] = jnp.concatenate([head[k], body], axis=0)
        return Y0

    def advance_block(Y0: dict, r, rows_out: int, first, last) -> dict:
        """``S`` steps of the block ``Y0`` (``rows_out + 2 H`` rows from global row ``r``):
        its middle ``rows_out`` rows advanced."""
        Y, w = Y0, H  # the step's first stage state and its rows beyond the strip
        for t in ts:
            n = rows_out + 2 * w
            k1 = tendency(Y, r, n, t)
            Y1 = {k: dt * k1[k] + a for k, a in rows_of(Y, 1).items()}
            Y1 = refill_walls(Y1, w - 1, first, last)
            k2 = tendency(Y1, r + 1, n - 2, t + dt)
            W = {k: dt * k2[k] + a for k, a in rows_of(Y1, 1).items()}
            Y2 = {k: a + 0.25 * (W[k] - a) for k, a in rows_of(Y, 2).items()}
            Y2 = refill_walls(Y2, w - 2, first, last)
            k3 = tendency(Y2, r + 2, n - 4, t + 0.5 * dt)
            W = {k: dt * k3[k] + a for k, a in rows_of(Y2, 1).items()}
            Y = {k: a + (2 / 3) * (W[k] - a) for k, a in rows_of(Y, 3).items()}
            r, w = r + OVERLAP, w - OVERLAP
            Y = refill_walls(Y, w, first, last)
        return Y

    # A grid that ``m`` does not divide starts with one strip of the remaining rows (or of
    # ``m`` more, so that the loop's first block does not reach below the first row, where
    # a wall's ghost rows would need refilling at an offset).
    rem = ny % m
    m0 = 0 if rem == 0 else (rem if rem >= H else rem + m)
    K = (ny - m0) // m  # strips of the loop
    low = {k: edges[k][0] for k in names}
    if m0:
        Y0 = gather(fields, 0, m0, low, K == 0)
        new = advance_block(Y0, -H, m0, True, K == 0)
        heads = {k: Y0[k][m0 : m0 + H] for k in names}  # original rows m0 - H .. m0 - 1
        fields = {k: fields[k].at[:m0].set(new[k]) for k in names}
    else:
        heads = low

    def body(s, carry):
        """Strip ``s`` of the loop advanced ``S`` steps, from the state in which the
        strips before it are advanced; ``heads``: the original last ``H`` rows of the
        strip before it."""
        state, heads = carry
        start = m0 + s * m
        Y0 = gather(state, start, m, heads, s == K - 1)
        heads = {k: Y0[k][m : m + H] for k in names}
        first = (s == 0) if m0 == 0 else False
        new = advance_block(Y0, start - H, m, first, s == K - 1)
        state = {k: lax.dynamic_update_slice_in_dim(state[k], new[k], start, 0) for k in names}
        return state, heads

    # The strips are written into the state's own buffers (XLA updates them in place: no
    # padded copy of the state, no output stack); the few original rows that the next strip
    # still reads are carried along.
    if K:
        fields, _ = lax.fori_loop(0, K, body, (fields, heads))
    return ShallowWaterState(**fields)


def blocked_ssprk3_step(
    model: ShallowWater, state: ShallowWaterState, t, dt, aux: StripAux, m: int
) -> ShallowWaterState:
    """One SSP-RK3 step of ``model`` computed in strips of ``m`` rows."""
    return blocked_ssprk3_steps(model, state, (t,), dt, aux, m)
