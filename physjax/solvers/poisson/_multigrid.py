"""Matrix-free geometric multigrid for ∇·(a∇u) = f on cell centres, and preconditioned CG.

A Helmholtz term (``∇·(a∇u) - c u = f``, ``c > 0``) is carried on every level: a scalar
``c`` as it is, a field averaged over the children like the coefficient; it adds ``-c`` to
the diagonal (smoother, line systems, dense coarse inverse) and makes the operator regular.

Hierarchy: each level halves the axes whose spacing is within a factor 2 of the finest
spacing (cell-centred coarsening, the coarse cell is the union of ``2^c`` fine cells, ``c``
the number of halved axes) with the operator rediscretised on the coarse grid and the
coefficient averaged over the children. On an isotropic grid that halves every axis; on
an anisotropic one (dx ≪ dy, a thin 3-D box) it is semi-coarsening: only the strongly
coupled (finely spaced) axes are halved until the spacings are within a factor 2, where a
point smoother works again (halving every axis keeps the anisotropy on every level, and
the cycle then stalls). When the finely spaced axis runs out of cells first (a thin layer of
a few cells along an axis far finer than the others, or a single axis halved down to 2 cells
while the others are not halved yet), the levels from there on relax whole lines along it
(zebra line Gauss–Seidel: each line solved exactly, lines coloured red–black by their
position in the other axes) and halve the other axes. Transfers: cell-centred
(bi/tri)linear interpolation ``P`` (weights 3/4, 1/4 along each halved axis, boundary
conditions through the coarse halo) and its scaled adjoint ``R = Pᵀ / 2^c`` as
restriction, so that with symmetric red–black (point or line) Gauss–Seidel smoothing
(red→black before, black→red after the coarse correction) the V-cycle is a symmetric
preconditioner for CG.

On a decomposed grid the halos come from the neighbours. A level is coarsened on the mesh
while every local size is even; when a block cannot be halved any more the residual is
gathered onto every device (``lax.all_gather``) and the remaining levels run replicated on
the undecomposed grid, each device keeping its own block of the correction. The coarsest
level (at most ``max_coarse`` cells) is solved directly with a dense inverse; for a
problem without Dirichlet axes, the constant null space is removed by adding a rank-one
term, which yields the zero-mean solution.

References: U. Trottenberg, C. W. Oosterlee, A. Schüller, *Multigrid*, Academic Press
(2001); M. Mohr, R. Wienands, "Cell-centred multigrid revisited", Comput. Visual. Sci. 7
(2004) 129–140, doi:10.1007/s00791-004-0137-0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ...grids import Grid, fill_halo
from ._operator import apply_operator, face_coefficients, operator_diagonal


class Level(NamedTuple):
    grid: Grid  # as seen from one device
    transition: str  # "restrict" | "gather" | "coarsest"
    halved: tuple[bool, ...] = ()  # "restrict": the axes halved on the way to the next level
    line: int | None = None  # the axis relaxed by lines (None: point smoothing)


def _coarse_grid(grid: Grid, halved: Sequence[bool]) -> Grid:
    g = Grid(
        tuple(n // 2 if c else n for n, c in zip(grid.shape, halved)),
        grid.extent,
        grid.periodic,
        grid.origin,
        grid.dtype,
        1,
    )
    if grid.is_sharded:
        g = g.on_mesh(grid.mesh_axes, grid.mesh_shape)
    return g


#: Coarsening stops once a level has at most this many cells (solved directly): fewer
#: levels compile faster and the dense solve of so few unknowns costs next to nothing.
COARSE_TARGET = 256


#: Axes with a spacing below this factor times the finest spacing are halved together.
ANISOTROPY_FACTOR = 2.0


def axes_to_halve(grid: Grid) -> tuple[bool, ...]:
    """The finely spaced axes: those within ``ANISOTROPY_FACTOR`` of the finest spacing
    (every axis of an isotropic grid)."""
    h_min = min(grid.spacing)
    return tuple(h < ANISOTROPY_FACTOR * h_min * (1 - 1e-12) for h in grid.spacing)


def _axes_to_halve_except(grid: Grid, line: int) -> tuple[bool, ...]:
    """Like [`axes_to_halve`][] among the axes other than ``line`` (never halved)."""
    h_min = min(h for a, h in enumerate(grid.spacing) if a != line)
    return tuple(
        a != line and h < ANISOTROPY_FACTOR * h_min * (1 - 1e-12)
        for a, h in enumerate(grid.spacing)
    )


def line_axis_for(grid: Grid) -> int | None:
    """The axis to relax by lines once the finely spaced axis cannot be halved any more.

    That is the finest axis when every other axis is at least ``ANISOTROPY_FACTOR`` times
    coarser (a thin layer), it has walls (the line systems are then tridiagonal, not
    cyclic) and it is not split across devices. ``None`` when there is no such axis.
    """
    spacing = grid.spacing
    line = min(range(grid.ndim), key=lambda a: spacing[a])
    others = min(h for a, h in enumerate(spacing) if a != line)
    if others < ANISOTROPY_FACTOR * spacing[line] * (1 - 1e-12) or grid.periodic[line]:
        return None
    if grid.is_sharded and grid.mesh_shape[line] > 1:
        return None
    return line


def _blocking_line_axis(grid: Grid, halved: Sequence[bool]) -> int | None:
    """The axis to relax by lines when it alone stops the halving of the finely spaced
    axes (odd or < 4 cells) on a level that is still too large, the others being within
    ``ANISOTROPY_FACTOR`` of it: the axis that was finest above and was halved down to 2
    cells while the others caught up (a 32³ grid of 1 × 16 × 16 reaches (2, 32, 32), every
    spacing equal), or an axis of odd size (97 × 128). Like [`line_axis_for`][] it needs
    walls along the axis and the axis not split across devices; the other halved axes must
    still be halvable."""
    stuck = [a for a, (n, c) in enumerate(zip(grid.shape, halved)) if c and (n % 2 or n < 4)]
    if len(stuck) != 1:
        return None
    (line,) = stuck
    if grid.periodic[line] or (grid.is_sharded and grid.mesh_shape[line] > 1):
        return None
    others = [a for a, c in enumerate(halved) if c and a != line]
    if not others or not all(grid.shape[a] % 2 == 0 and grid.shape[a] >= 4 for a in others):
        return None
    return line


def build_hierarchy(grid: Grid, max_coarse: int) -> tuple[Level, ...] | None:
    """Levels from ``grid`` (possibly decomposed) down to a directly solvable one.

    Each level halves the finely spaced axes. When those cannot be halved any more
    while the level is still too large for the direct solve (a thin layer: a few cells
    along an axis much finer than the others), that axis is relaxed by lines from there
    on and the other axes are halved (see [`line_axis_for`][]).

    Returns ``None`` when the coarsest reachable level has more than ``max_coarse`` cells
    ([`coarsening_stop`][] says where and why).
    """
    levels, _, _ = _coarsen(grid, max_coarse)
    return levels


def coarsening_stop(grid: Grid, max_coarse: int) -> tuple[Grid, int | None]:
    """The level where coarsening stopped, and the line axis then in use (or ``None``)."""
    _, g, line = _coarsen(grid, max_coarse)
    return g, line


def _coarsen(grid: Grid, max_coarse: int):
    levels = []
    g = grid
    line = None
    while True:
        halved = axes_to_halve(g) if line is None else _axes_to_halve_except(g, line)
        halvable = (
            any(halved)
            and all(n % 2 == 0 and n >= 4 for n, c in zip(g.shape, halved) if c)
            and g.size > min(COARSE_TARGET, max_coarse)
        )
        if not halvable and line is None and g.size > max_coarse:
            line = line_axis_for(g)
            if line is None:
                line = _blocking_line_axis(g, halved)
            if line is not None:
                continue
        if g.is_sharded:
            if halvable and all(n % 2 == 0 for n, c in zip(g.local_shape, halved) if c):
                levels.append(Level(g, "restrict", halved, line))
                g = _coarse_grid(g, halved)
            else:
                levels.append(Level(g, "gather"))
                g = g.unsharded()
            continue
        if halvable:
            levels.append(Level(g, "restrict", halved, line))
            g = _coarse_grid(g, halved)
            continue
        if g.size > max_coarse:
            return None, g, line
        levels.append(Level(g, "coarsest"))
        return tuple(levels), g, line


def split_names(grid: Grid) -> tuple[str, ...]:
    return tuple(n for n, m in zip(grid.mesh_axes, grid.mesh_shape) if n is not None and m > 1)


def global_sum(x: jax.Array, grid: Grid) -> jax.Array:
    s = jnp.sum(x)
    names = split_names(grid)
    return lax.psum(s, names) if names else s


def global_dot(x: jax.Array, y: jax.Array, grid: Grid) -> jax.Array:
    return global_sum(x * y, grid)


def global_max(x: jax.Array, grid: Grid) -> jax.Array:
    m = jnp.max(x)
    names = split_names(grid)
    return lax.pmax(m, names) if names else m


def remove_mean(x: jax.Array, grid: Grid) -> jax.Array:
    return x - global_sum(x, grid) / grid.size


def gather(x: jax.Array, grid: Grid) -> jax.Array:
    for axis, (name, m) in enumerate(zip(grid.mesh_axes, grid.mesh_shape)):
        if name is not None and m > 1:
            x = lax.all_gather(x, name, axis=axis, tiled=True)
    return x


def local_block(x: jax.Array, grid: Grid) -> jax.Array:
    for axis, n in enumerate(grid.local_shape):
        if grid.mesh_shape[axis] > 1:
            x = lax.dynamic_slice_in_dim(x, grid.block_index(axis) * n, n, axis=axis)
    return x


def prolong(
    ec: jax.Array, coarse: Grid, parity: Sequence[int], halved: Sequence[bool]
) -> jax.Array:
    """Cell-centred linear interpolation from ``coarse`` to the grid twice as fine along
    the ``halved`` axes (the same along the others)."""
    d = coarse.ndim
    x = fill_halo(ec, coarse, parity=tuple(parity), width=1)
    x = x[tuple(slice(None) if c else slice(1, -1) for c in halved)]
    for axis in range(d):
        if not halved[axis]:
            continue
        n = x.shape[axis] - 2
        mid = lax.slice_in_dim(x, 1, n + 1, axis=axis)
        lo = lax.slice_in_dim(x, 0, n, axis=axis)
        hi = lax.slice_in_dim(x, 2, n + 2, axis=axis)
        even = 0.75 * mid + 0.25 * lo
        odd = 0.75 * mid + 0.25 * hi
        stacked = jnp.stack([even, odd], axis=axis + 1)
        shape = list(mid.shape)
        shape[axis] = 2 * n
        x = stacked.reshape(shape)
    return x


def restrict(
    r: jax.Array, coarse: Grid, parity: Sequence[int], halved: Sequence[bool]
) -> jax.Array:
    """Adjoint of [`prolong`][] divided by ``2^c``, ``c`` halved axes (full weighting for
    cell centres)."""
    shape = jax.ShapeDtypeStruct(coarse.local_shape, r.dtype)
    (rc,) = jax.linear_transpose(lambda e: prolong(e, coarse, parity, halved), shape)(r)
    return rc / 2 ** sum(halved)


def average_children(a: jax.Array, halved: Sequence[bool]) -> jax.Array:
    """Mean over the ``2^c`` fine cells of each coarse cell."""
    shape = []
    for n, c in zip(a.shape, halved):
        shape += [n // 2, 2] if c else [n, 1]
    return a.reshape(shape).mean(axis=tuple(range(1, 2 * a.ndim, 2)))


def colour_mask(grid: Grid, dtype, skip: int | None = None) -> jax.Array:
    """1 on "red" cells (even sum of global indices), 0 on "black" ones; with ``skip``
    the index along that axis is left out (whole lines along it share a colour)."""
    d = grid.ndim
    total = 0
    for axis in range(d):
        if axis == skip:
            continue
        shape = [1] * d
        shape[axis] = grid.local_shape[axis]
        total = total + grid.local_index(axis).reshape(shape)
    return ((total % 2) == 0).astype(dtype)


def dense_inverse(
    grid: Grid, parity: Sequence[int], faces, singular: bool, dtype, shift=None
) -> jax.Array:
    """Inverse of the operator on a small undecomposed grid (rank-one fixed if singular;
    ``shift``: the Helmholtz term's scalar or field on this grid, which makes it regular)."""
    n = grid.size
    eye = jnp.eye(n, dtype=dtype)
    cols = jax.vmap(
        lambda e: apply_operator(e.reshape(grid.shape), grid, parity, faces, shift).ravel()
    )(eye)
    mat = cols.T
    if singular:
        scale = jnp.mean(jnp.abs(jnp.diagonal(mat)))
        mat = mat - scale / n * jnp.ones_like(mat)
    # the coarsest level's solve in a preconditioner: no derivative is taken through it
    # (custom_linear_solve differentiates the operator, not the preconditioner), and jax
    # cannot linearize a custom_vmap function for reverse mode
    return _inverse(lax.stop_gradient(mat))


@jax.custom_batching.custom_vmap
def _inverse(mat: jax.Array) -> jax.Array:
    """``jnp.linalg.inv`` of one matrix; under ``vmap``, one matrix at a time.

    jaxlib's CPU LU kernel splits a batch of matrices into tasks on XLA's intra-op thread
    pool and blocks until they finish. Inside ``shard_map`` on simulated CPU devices every
    device runs that kernel on a thread of the same pool, which then has no thread left for
    the tasks: ``jax.vmap`` over a coefficient (a coarse inverse per item) on a 2×2 mesh of
    4 devices waited for ever. Factored one at a time (``lax.map``), as a loop over the
    items does, the matrices give the same inverses and the call returns."""
    return jnp.linalg.inv(mat)


@_inverse.def_vmap
def _inverse_batched(axis_size, in_batched, mat):
    (batched,) = in_batched
    if not batched:
        return _inverse(mat), False
    return lax.map(_inverse, mat), True


class MultigridData(NamedTuple):
    faces: tuple  # per level: tuple of face coefficient arrays, or None
    diag: tuple  # per level: diagonal (None on gather/coarsest levels)
    red: tuple  # per level: red mask (None on gather/coarsest levels)
    coarse_inverse: jax.Array
    lines: tuple = ()  # per level: LineFactors on line-relaxed levels, else None
    shifts: tuple = ()  # per level: the Helmholtz shift (scalar or field), or None


class LineFactors(NamedTuple):
    """Thomas factors of the tridiagonal part of the operator along the line axis (moved
    first): ``lower[i]`` couples cell ``i`` to ``i - 1``, ``inv[i]`` is the reciprocal of
    the eliminated diagonal, ``upper[i]`` the eliminated coupling to ``i + 1``."""

    lower: jax.Array
    inv: jax.Array
    upper: jax.Array


def line_factors(grid: Grid, line: int, faces, diag: jax.Array) -> LineFactors:
    """Factor, once per solve, the line systems of a line-relaxed level.

    Each line (all cells that differ only in their index along ``line``) carries the
    operator's couplings along it and its full diagonal, the couplings to the other axes
    being left to the residual. The diagonal includes the other axes' share, so each system
    is strictly diagonally dominant and Thomas' elimination needs no pivoting.
    """
    n = grid.local_shape[line]
    inv_h2 = 1.0 / grid.spacing[line] ** 2
    if faces is None:
        a_lo = jnp.full_like(diag, inv_h2)
        a_hi = a_lo
    else:
        a_lo = lax.slice_in_dim(faces[line], 0, n, axis=line) * inv_h2
        a_hi = lax.slice_in_dim(faces[line], 1, n + 1, axis=line) * inv_h2
    lower = jnp.moveaxis(a_lo, line, 0).at[0].set(0)  # the walls are in the diagonal
    upper = jnp.moveaxis(a_hi, line, 0).at[-1].set(0)
    d = jnp.moveaxis(diag, line, 0)

    def eliminate(c_prev, row):
        lo, di, up = row
        inv = 1 / (di - lo * c_prev)
        c = up * inv
        return c, (inv, c)

    _, (inv, c) = lax.scan(eliminate, jnp.zeros_like(d[0]), (lower, d, upper))
    return LineFactors(lower, inv, c)


def line_solve(factors: LineFactors, r: jax.Array, line: int) -> jax.Array:
    """Solve every line system of [`line_factors`][] for the right-hand side ``r``."""
    rl = jnp.moveaxis(r, line, 0)

    def forward(y_prev, row):
        lo, inv, rr = row
        y = (rr - lo * y_prev) * inv
        return y, y

    _, y = lax.scan(forward, jnp.zeros_like(rl[0]), (factors.lower, factors.inv, rl))

    def backward(x_next, row):
        c, yy = row
        x = yy - c * x_next
        return x, x

    _, x = lax.scan(backward, jnp.zeros_like(rl[0]), (factors.upper, y), reverse=True)
    return jnp.moveaxis(x, 0, line)


def prepare(
    levels: Sequence[Level],
    parity: Sequence[int],
    coefficient: jax.Array | None,
    coarse_inverse: jax.Array | None,
    singular: bool,
    dtype,
    shift: jax.Array | None = None,
    coarse_shift: jax.Array | None = None,
) -> MultigridData:
    """Per-level coefficients, diagonals and colour masks (inside ``shard_map`` if split).

    ``shift``: the Helmholtz term (``A u = ∇·(a∇u) - shift u``), a scalar kept on every
    level or a local cell-centred field averaged over the children like the coefficient.
    ``coarse_inverse``: the coarsest level's inverse prepared beforehand (``None``: made
    here), for the scalar ``coarse_shift`` when that is given: where ``shift`` differs from
    it, the inverse is made here instead."""
    faces, diags, reds, lines, shifts = [], [], [], [], []
    a = coefficient
    c = shift
    for level in levels:
        g = level.grid
        fc = None if a is None else face_coefficients(a, g)
        faces.append(fc)
        shifts.append(c)
        if level.transition == "restrict":
            diag = operator_diagonal(g, parity, fc, dtype, c)
            diags.append(diag)
            reds.append(colour_mask(g, dtype, skip=level.line))
            lines.append(None if level.line is None else line_factors(g, level.line, fc, diag))
        else:
            diags.append(None)
            reds.append(None)
            lines.append(None)
        if a is not None:
            if level.transition == "restrict":
                a = average_children(a, level.halved)
            elif level.transition == "gather":
                a = gather(a, g)
        if c is not None and jnp.ndim(c) > 0:
            if level.transition == "restrict":
                c = average_children(c, level.halved)
            elif level.transition == "gather":
                c = gather(c, g)

    def make_inverse():
        return dense_inverse(levels[-1].grid, parity, faces[-1], singular, dtype, shifts[-1])

    if coarse_inverse is None:
        coarse_inverse = make_inverse()
    elif coarse_shift is not None:
        stored = coarse_inverse
        coarse_inverse = lax.cond(shift == coarse_shift, lambda: stored, make_inverse)
    return MultigridData(
        tuple(faces), tuple(diags), tuple(reds), coarse_inverse, tuple(lines), tuple(shifts)
    )


class Multigrid:
    """V/F-cycles on a prepared hierarchy (a plain helper used inside traced code)."""

    def __init__(
        self,
        levels: Sequence[Level],
        parity: Sequence[int],
        data: MultigridData,
        pre_smooth: int,
        post_smooth: int,
        cycle: str,
    ):
        self.levels = levels
        self.parity = tuple(parity)
        self.data = data
        self.pre = pre_smooth
        self.post = post_smooth
        self.cycle = cycle

    def apply(self, k: int, u: jax.Array) -> jax.Array:
        shift = self.data.shifts[k] if self.data.shifts else None
        return apply_operator(u, self.levels[k].grid, self.parity, self.data.faces[k], shift)

    def _half_sweep(self, k, u, f, mask):
        return u + self._correction(k, f - self.apply(k, u), mask)

    def _correction(self, k, r, mask):
        line = self.levels[k].line
        if line is None:
            return mask * r / self.data.diag[k]
        # Lines of one colour are coupled only to lines of the other: solving each for
        # the residual is the Gauss–Seidel update of the whole line at once.
        return mask * line_solve(self.data.lines[k], r, line)

    def _smooth(self, k, u, f, sweeps, reverse):
        """``sweeps`` red–black sweeps on ``A_k u = f``; ``u=None`` starts from zero, whose
        first half-sweep needs no operator (the residual is ``f``), and so no halo
        exchange of a field of zeros."""
        red = self.data.red[k]
        black = 1 - red
        first, second = (black, red) if reverse else (red, black)
        if u is None:
            if sweeps == 0:
                return jnp.zeros_like(f)
            u, start = self._correction(k, f, first), 1
        else:
            start = 0
        if 2 * sweeps == start:
            return u

        # A loop rather than unrolled sweeps: one copy of the stencil per level keeps the
        # compiled program (and its compile time) small.
        def body(i, u):
            return self._half_sweep(k, u, f, jnp.where(i % 2 == 0, first, second))

        return lax.fori_loop(start, 2 * sweeps, body, u)

    def _coarsest(self, f):
        shape = f.shape
        return (self.data.coarse_inverse @ f.ravel()).reshape(shape)

    def vcycle(self, k: int, f: jax.Array, fcycle: bool = False) -> jax.Array:
        """Approximate solution of ``A_k u = f`` from a zero initial guess."""
        level = self.levels[k]
        if level.transition == "coarsest":
            return self._coarsest(f)
        if level.transition == "gather":
            return local_block(self.vcycle(k + 1, gather(f, level.grid), fcycle), level.grid)
        coarse = self.levels[k + 1].grid
        halved = level.halved
        u = self._smooth(k, None, f, self.pre, reverse=False)
        rc = restrict(f - self.apply(k, u), coarse, self.parity, halved)
        ec = self.vcycle(k + 1, rc, fcycle)
        if fcycle:
            ec = ec + self.vcycle(k + 1, rc - self.apply(k + 1, ec), False)
        u = u + prolong(ec, coarse, self.parity, halved)
        return self._smooth(k, u, f, self.post, reverse=True)

    def __call__(self, r: jax.Array) -> jax.Array:
        return self.vcycle(0, r, fcycle=self.cycle == "F")


class IterativeInfo(NamedTuple):
    iterations: jax.Array
    residual_norm: jax.Array  # relative: |f - A u| / |f|
    converged: jax.Array


def _tolerance(fnorm, rtol, atol):
    return jnp.maximum(rtol * fnorm, atol)


def _round_off(u, grid, dtype, abs_operator):
    """``eps ‖|A| |u|‖``: the residual that rounding ``u`` to its precision can leave by
    itself (``abs_operator(u)`` is ``|A| |u|``, the operator with every stencil entry made
    positive, applied to ``|u|``). In float32 the residual of the best representable solution
    is of that order: ~1e-4 of ‖f‖ at 128² and ~1e-3 at 512² for a smooth solution. The
    componentwise form, not ``eps ‖A‖ ‖u‖``: with a coefficient varying by 1e8 the norm bound
    overstated the round-off residual 2600-fold, and a float32 multigrid solve that had
    stalled at 8% of ‖f‖ was reported converged."""
    v = lax.stop_gradient(abs_operator(u))
    return jnp.finfo(dtype).eps * jnp.sqrt(global_dot(v, v, grid))


#: An iteration whose correction is below this many ulps of ``u`` (relative, in norm) has
#: exhausted the working precision: it stops there.
STALL_ULPS = 10


def _stalled(dnorm, unorm, dtype):
    return dnorm <= STALL_ULPS * jnp.finfo(dtype).eps * unorm


def _keep_going(rnorm, tol, dnorm, unorm, k, max_iterations, dtype):
    """Loop condition shared by both iterations; a non-finite residual (a diverged cycle,
    NaN in the data) ends the loop at once."""
    return (
        (rnorm > tol) & jnp.isfinite(rnorm) & ~_stalled(dnorm, unorm, dtype) & (k < max_iterations)
    )


def _converged(rnorm, tol, u, unorm, grid, abs_operator, ran_out):
    """Within the tolerance, or within it plus the round-off of ``u`` when the loop did not
    merely run out of iterations; never with a non-finite residual or solution (``inf ≤
    inf`` would otherwise pass).

    ``ran_out``: the loop ended at ``max_iterations`` with its residual above the tolerance
    and ``u`` still changing by more than ``STALL_ULPS`` ulps. The round-off allowance is
    for an iteration that has exhausted the precision; one still moving has not converged.
    In float32 on cells of aspect ratio ≥ 1e4 the allowance exceeds ‖f‖ (the largest 1/h²
    dominates ``|A| |u|``): multigrid ran its 100 cycles there and was reported converged
    with u 0.3% off (32², 1e4) or 100% off (1e6), CG with u 56% off (1e6)."""
    finite = jnp.isfinite(rnorm) & jnp.isfinite(unorm)
    within = rnorm <= tol + jnp.where(ran_out, 0, _round_off(u, grid, u.dtype, abs_operator))
    return finite & within


def _ran_out(loop_rnorm, tol, dnorm, unorm, k, max_iterations, dtype):
    """The loop ended only because it reached ``max_iterations``."""
    return (k >= max_iterations) & (loop_rnorm > tol) & ~_stalled(dnorm, unorm, dtype)


def _first_iterate(x0, f, fnorm, matvec, grid: Grid):
    """``(x0, f - A x0, ‖f - A x0‖, ‖x0‖)``; from zero without an operator application.

    A guess with a larger residual than zero's (``‖f‖``) is dropped for zero: ``f = 0``,
    solved by ``u = 0`` with a tolerance of 0, which iterations from a guess only
    approach; and a guess far larger than the solution, from which CG cannot bring the
    true residual below ``eps ‖A x0‖`` (the recurrence drifts from it)."""
    if x0 is None:
        zero = jnp.zeros_like(f)
        return zero, f, fnorm, jnp.zeros_like(fnorm)
    r0 = f - matvec(x0)
    r0norm = jnp.sqrt(global_dot(r0, r0, grid))
    worse = r0norm > fnorm  # (NaN in the guess: kept, and reported not converged)
    x0 = jnp.where(worse, jnp.zeros_like(x0), x0)
    r0 = jnp.where(worse, f, r0)
    r0norm = jnp.where(worse, fnorm, r0norm)
    return x0, r0, r0norm, jnp.sqrt(global_dot(x0, x0, grid))


def multigrid_iterate(
    matvec,
    precondition,
    f,
    grid: Grid,
    singular: bool,
    rtol,
    atol,
    max_iterations,
    abs_operator,
    u0=None,
):
    """Stationary iteration ``u ← u + M(f - A u)`` until ``‖f - A u‖ ≤ max(rtol ‖f‖, atol)``,
    or until a cycle changes ``u`` by less than ``STALL_ULPS`` ulps (the precision is
    exhausted: in float32 the residual stops falling long before ``u`` stops improving).
    ``converged``: the residual is within ``max(rtol ‖f‖, atol) + eps ‖|A| |u|‖``. ``u0``:
    the first iterate (default zero)."""
    fnorm = jnp.sqrt(global_dot(f, f, grid))
    tol = _tolerance(fnorm, rtol, atol)

    def cond(state):
        _, _, rnorm, dnorm, unorm, k = state
        return _keep_going(rnorm, tol, dnorm, unorm, k, max_iterations, f.dtype)

    def body(state):
        u_old, r, _, _, _, k = state
        u = u_old + precondition(r)
        if singular:
            u = remove_mean(u, grid)
        d = u - u_old
        r = f - matvec(u)
        norm = lambda v: jnp.sqrt(global_dot(v, v, grid))  # noqa: E731
        return u, r, norm(r), norm(d), norm(u), k + 1

    inf = jnp.full((), jnp.inf, fnorm.dtype)
    u0, r0, r0norm, u0norm = _first_iterate(u0, f, fnorm, matvec, grid)
    state = (u0, r0, r0norm, inf, u0norm, jnp.asarray(0, jnp.int32))
    u, _, rnorm, dnorm, unorm, k = lax.while_loop(cond, body, state)
    rel = rnorm / jnp.where(fnorm > 0, fnorm, 1)
    ran_out = _ran_out(rnorm, tol, dnorm, unorm, k, max_iterations, f.dtype)
    return u, IterativeInfo(k, rel, _converged(rnorm, tol, u, unorm, grid, abs_operator, ran_out))


def conjugate_gradient(
    matvec,
    precondition,
    f,
    grid: Grid,
    singular: bool,
    rtol,
    atol,
    max_iterations,
    abs_operator,
    x0=None,
):
    """Preconditioned CG for the negative semi-definite operator (signs absorbed).

    Stops like [`multigrid_iterate`][] (the updated residual below ``max(rtol ‖f‖, atol)``,
    or a step below ``STALL_ULPS`` ulps of ``x``). The residual reported, and checked for
    ``converged``, is the true ``‖f - A x‖`` of the returned ``x`` (one more operator
    application): in float32 the updated residual keeps falling long after the true one
    has reached round-off. ``x0``: the first iterate (default zero); the tolerance stays
    relative to ``‖f‖``, so a close guess ends the loop sooner.
    """
    fnorm = jnp.sqrt(global_dot(f, f, grid))
    tol = _tolerance(fnorm, rtol, atol)

    def prec(r):
        z = precondition(r)
        return remove_mean(z, grid) if singular else z

    # The preconditioner is applied at the top of the loop body only (one compiled copy of
    # the cycle); the first pass has beta = 0.
    def cond(state):
        *_, rnorm, dnorm, xnorm, k = state
        return _keep_going(rnorm, tol, dnorm, xnorm, k, max_iterations, f.dtype)

    def body(state):
        x, r, p, rz_old, _, _, _, k = state
        z = prec(r)
        rz = global_dot(r, z, grid)
        beta = jnp.where(k == 0, 0, rz / jnp.where(rz_old == 0, 1, rz_old))
        p = z + beta * p
        ap = matvec(p)
        pap = global_dot(p, ap, grid)
        alpha = rz / jnp.where(pap == 0, 1, pap)
        x = x + alpha * p
        r = r - alpha * ap
        norm = lambda v: jnp.sqrt(global_dot(v, v, grid))  # noqa: E731
        return x, r, p, rz, norm(r), jnp.abs(alpha) * norm(p), norm(x), k + 1

    zero = jnp.zeros_like(f)
    one = jnp.ones((), f.dtype)
    inf = jnp.full((), jnp.inf, fnorm.dtype)
    x0, r0, r0norm, x0norm = _first_iterate(x0, f, fnorm, matvec, grid)
    state = (x0, r0, zero, one, r0norm, inf, x0norm, jnp.asarray(0, jnp.int32))
    x, *_, loop_rnorm, dnorm, loop_xnorm, k = lax.while_loop(cond, body, state)
    ran_out = _ran_out(loop_rnorm, tol, dnorm, loop_xnorm, k, max_iterations, f.dtype)
    if singular:
        x = remove_mean(x, grid)
    r = f - matvec(x)
    rnorm = jnp.sqrt(global_dot(r, r, grid))
    xnorm = jnp.sqrt(global_dot(x, x, grid))
    rel = rnorm / jnp.where(fnorm > 0, fnorm, 1)
    return x, IterativeInfo(k, rel, _converged(rnorm, tol, x, xnorm, grid, abs_operator, ran_out))
