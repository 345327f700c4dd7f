"""``physjax poisson``: solve a manufactured or user-supplied Poisson problem to NetCDF4."""

from __future__ import annotations

import argparse
import os

import numpy as np

CASES = ("periodic-sines", "dirichlet", "neumann", "variable-coefficient")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``poisson`` subcommand."""
    from .cli import _parse_devices

    p = subparsers.add_parser(
        "poisson",
        help="solve a Poisson / elliptic problem",
        description="Solve ∇·(a∇u) = f on a unit box; write u and the residual to NetCDF4.",
    )
    p.add_argument("--case", choices=CASES, default="periodic-sines")
    p.add_argument("--rhs", help="user right-hand side FILE.h5:VARIABLE (overrides the case's f)")
    p.add_argument("--bc", help="per-axis conditions in grid order, e.g. dirichlet,periodic")
    p.add_argument("--method", choices=("spectral", "multigrid", "cg"), default=None)
    p.add_argument("--nx", type=int)
    p.add_argument("--ny", type=int)
    p.add_argument("--nz", type=int, help="cells in z (3-D run)")
    p.add_argument("--n", type=int, help="cells per axis")
    p.add_argument("--precision", choices=("float32", "float64"), default="float64")
    p.add_argument("--devices", type=_parse_devices, default=1)
    p.add_argument("--output", default="poisson.h5")
    p.add_argument("--plot", help="quick-look PNG")
    p.set_defaults(func=run)
    return p


def _manufactured(case, grid):
    xs = grid.mesh_coordinates(("centre",) * grid.ndim)
    pi = np.pi
    if case == "periodic-sines":
        u = np.prod([np.sin(2 * pi * x) for x in xs], axis=0)
        return u, -grid.ndim * (2 * pi) ** 2 * u, None
    if case in ("dirichlet", "variable-coefficient"):
        u = np.prod([np.sin(pi * x) for x in xs], axis=0)
        f = -grid.ndim * pi**2 * u
        a = None
        if case == "variable-coefficient":
            x = xs[-1]
            a = 1 + 0.5 * np.sin(2 * pi * x)
            # ∇·(a∇u) = a∇²u + ∂a/∂x ∂u/∂x
            dudx = pi * np.cos(pi * x) * np.prod([np.sin(pi * y) for y in xs[:-1]], axis=0)
            f = a * f + pi * np.cos(2 * pi * x) * dudx
        return u, f, a
    u = np.prod([np.cos(pi * x) for x in xs], axis=0)
    return u, -grid.ndim * pi**2 * u, None


def _read_rhs(spec: str, shape):
    import h5py

    if ":" not in spec:
        raise ValueError(f"--rhs must be FILE.h5:VARIABLE, got {spec!r}")
    path, name = spec.rsplit(":", 1)
    if not os.path.exists(path):
        raise ValueError(f"--rhs: file {path!r} does not exist")
    with h5py.File(path, "r") as f:
        if name not in f:
            raise ValueError(f"--rhs: {path!r} has no variable {name!r}; it has {list(f)}")
        data = np.asarray(f[name])
    data = np.squeeze(data)
    if data.shape != tuple(shape):
        raise ValueError(f"--rhs: {spec} has shape {data.shape}, the grid is {tuple(shape)}")
    return data


def run(args) -> int:
    """Run the ``poisson`` subcommand."""
    from .cli import setup_jax

    setup_jax(args.precision, args.devices)
    import jax.numpy as jnp

    from .grids import Grid
    from .io import NetCDFWriter, Variable, check_writable
    from .parallel import make_mesh
    from .solvers.poisson import PoissonSolver

    n = args.n or 64
    shape = [args.ny or n, args.nx or n]
    if args.nz:
        shape = [args.nz, *shape]
    for s in shape:
        if s < 1:
            raise ValueError(f"grid sizes must be positive integers, got {shape}")
    ndim = len(shape)
    if args.bc:
        bc = tuple(b.strip() for b in args.bc.split(","))
        if len(bc) == 1:
            bc = bc * ndim
    else:
        kind = {"periodic-sines": "periodic", "neumann": "neumann"}.get(args.case, "dirichlet")
        bc = (kind,) * ndim
    periodic = tuple(b == "periodic" for b in bc)
    grid = Grid(shape, (1.0,) * ndim, periodic=periodic, dtype=args.precision)
    exact, f, a = _manufactured(args.case, grid)
    if args.rhs:
        f, exact = _read_rhs(args.rhs, shape), None
    method = args.method or ("cg" if a is not None else "spectral")
    mesh = None if args.devices in (1, None) else make_mesh(args.devices, ndim)
    check_writable(args.output)
    solver = PoissonSolver(grid, bc, method, coefficient=a, mesh=mesh, compatibility="project")
    f = jnp.asarray(f, args.precision)
    sol = solver.solve(f)
    b = f - jnp.mean(f) if solver.singular else f
    residual = np.asarray(solver.residual(sol.u, b))
    centre = ("centre",) * ndim
    variables = [
        Variable("u", centre, "1", "solution of div(a grad u) = f", False),
        Variable("f", centre, "m-2", "right-hand side", False),
        Variable("residual", centre, "m-2", "f - A u of the discrete problem", False),
    ]
    fields = {"u": sol.u, "f": f, "residual": residual}
    if exact is not None:
        err = np.asarray(sol.u) - exact
        if solver.singular:
            err = err - err.mean()
        variables += [
            Variable("u_exact", centre, "1", "manufactured exact solution", False),
            Variable("error", centre, "1", "u - u_exact (zero-mean gauge if singular)", False),
        ]
        fields.update(u_exact=exact, error=err)
    config = dict(case=args.case, bc=list(bc), method=method, shape=shape, rhs=args.rhs or "")
    writer = NetCDFWriter(
        args.output,
        grid,
        variables,
        attrs=dict(case=args.case, title="physjax poisson", parameters={}, configuration=config),
    )
    writer.write_static(fields)
    writer.finish(
        iterations=int(sol.iterations),
        residual_norm=float(sol.residual_norm),
        converged=int(bool(sol.converged)),
    )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        names = ["u", "residual"] + (["error"] if exact is not None else [])
        fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5))
        for ax, name in zip(np.atleast_1d(axes), names):
            data = np.asarray(fields[name])
            data = data[data.shape[0] // 2] if data.ndim == 3 else data
            im = ax.imshow(data, origin="lower", extent=(0, 1, 0, 1))
            ax.set_title(name)
            fig.colorbar(im, ax=ax)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        plt.close(fig)
    print(
        f"poisson {method}: {int(sol.iterations)} iterations, relative residual "
        f"{float(sol.residual_norm):.2e}; wrote {args.output}"
        + (f" and {args.plot}" if args.plot else "")
    )
    return 0
