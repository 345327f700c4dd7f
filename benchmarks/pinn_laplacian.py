"""Benchmark a PINN training step: Poisson-loss Laplacian residual, then its parameter gradient.

Variants: physjax (``laplacian(..., batched=True)``: batched forward Laplacian with the
batch-level custom VJP), physjax_vmap (``jax.vmap`` of the per-point ``laplacian``: per-layer
``jax.checkpoint``), naive (trace of jax.hessian), fwd_rev (jvp of grad per spatial dimension),
folx (forward_laplacian, if installed) and first_order (gradient of u only, the floor). Each
(variant, configuration) runs in its own subprocess, which reports the median step time after
compilation, the compiled executable's temp bytes (``memory_analysis()``) and its own peak RSS.

    python benchmarks/pinn_laplacian.py                 # full run, float32
    python benchmarks/pinn_laplacian.py --quick         # small smoke run
    python benchmarks/pinn_laplacian.py --depths 4 --dims 3 --n 16384

Results go to ``benchmarks/results/pinn_laplacian.json``, except for ``--quick`` runs, which
write ``pinn_laplacian_quick.json`` in the system temp directory unless ``--output`` is given.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

VARIANTS = ("physjax", "physjax_vmap", "naive", "fwd_rev", "folx", "first_order")
RESULTS = Path(__file__).parent / "results" / "pinn_laplacian.json"
QUICK_RESULTS = Path(tempfile.gettempdir()) / "pinn_laplacian_quick.json"


def _child(variant: str, depth: int, dim: int, n: int, width: int, repeats: int, dtype: str):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    if dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    import physjax.gradients as pg

    dt = jnp.dtype(dtype)
    model = pg.MLP(dim, "scalar", width, depth, "tanh", key=jax.random.key(0), dtype=dt)
    xs = jax.random.uniform(jax.random.key(1), (n, dim), dt)
    spatial = (0, 1)  # (x, y); a third input is time
    source = jnp.sin(xs[:, 0]) * jnp.sin(xs[:, 1])

    if variant == "physjax":

        def batch_op(m):
            return pg.laplacian(m, spatial=spatial, batched=True)
    elif variant == "physjax_vmap":

        def op(m):
            return pg.laplacian(m, spatial=spatial)
    elif variant == "naive":

        def op(m):
            return lambda x: jnp.trace(jax.hessian(m)(x)[:2, :2])
    elif variant == "fwd_rev":

        def op(m):
            def lap(x):
                g = jax.grad(m)
                return sum(jax.jvp(g, (x,), (jnp.eye(dim, dtype=dt)[i],))[1][i] for i in spatial)

            return lap
    elif variant == "folx":
        import folx

        def op(m):
            def lap(x):
                def f(y):
                    return m(jnp.concatenate([y, x[2:]]))

                return folx.forward_laplacian(f, sparsity_threshold=0)(x[:2]).laplacian

            return lap
    elif variant == "first_order":

        def op(m):
            return lambda x: jnp.sum(jax.grad(m)(x)[:2])
    else:
        raise ValueError(f"unknown variant {variant!r}")

    if variant != "physjax":

        def batch_op(m):
            return jax.vmap(op(m))

    def loss(m):
        return jnp.mean((batch_op(m)(xs) + source) ** 2)

    grad = eqx.filter_grad(loss)
    step = jax.jit(lambda m: grad(m))
    compiled = step.lower(model).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(compiled(model))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(model))
        times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # statistics.median: with an even number of repeats (--quick: 2) times[n // 2] was the
    # slower of the two middle times, for 2 repeats the slowest step
    return {"time_s": statistics.median(times), "temp_bytes": temp, "peak_rss_bytes": rss}


def _folx_missing():
    """None when folx imports, else why not (the folx variant is then skipped, not failed)."""
    try:
        import folx  # noqa: F401
    except ImportError as err:
        return f"folx is not installed ({err}; pip install folx to compare)"
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # defaults below: the full run's, or --quick's for what is not given
    p.add_argument("--depths", type=int, nargs="+", help="default 4 8 (--quick: 4)")
    p.add_argument("--dims", type=int, nargs="+", help="default 2 3 (--quick: 2)")
    p.add_argument("--n", type=int, nargs="+", help="default 1024 4096 16384 (--quick: 1024)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--repeats", type=int, help="default 3 (--quick: 2)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: depth 4, 2-D, N=1024, 2 repeats (unless given); writes "
        f"{QUICK_RESULTS} by default",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"results file (default: {RESULTS}; with --quick, {QUICK_RESULTS})",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add this run to the output file's 'extra_runs' instead of replacing the file",
    )
    p.add_argument("--child", nargs=4, metavar=("VARIANT", "DEPTH", "DIM", "N"), help="internal")
    args = p.parse_args(argv)
    # --quick sets what is not given: `--quick --depths 8` runs depth 8 (it ran depth 4)
    defaults = ([4], [2], [1024], 2) if args.quick else ([4, 8], [2, 3], [1024, 4096, 16384], 3)
    for name, value in zip(("depths", "dims", "n", "repeats"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, value)

    if args.child:
        v, depth, dim, n = args.child
        res = _child(v, int(depth), int(dim), int(n), args.width, args.repeats, args.dtype)
        print("RESULT " + json.dumps(res))
        return
    if args.output is None:  # a smoke run never replaces the committed results
        args.output = QUICK_RESULTS if args.quick else RESULTS

    rows = []
    folx_missing = _folx_missing() if "folx" in args.variants else None
    print(
        f"{'variant':12s} {'depth':>5s} {'dim':>3s} {'N':>6s} {'s/step':>8s} "
        f"{'temp MB':>8s} {'RSS MB':>8s}"
    )
    for depth in args.depths:
        for dim in args.dims:
            for n in args.n:
                for v in args.variants:
                    row = {"variant": v, "depth": depth, "dim": dim, "n": n}
                    if v == "folx" and folx_missing:
                        # an optional comparison, not a failure of the run
                        row["skipped"] = folx_missing
                        print(f"{v:12s} {depth:5d} {dim:3d} {n:6d}  skipped: {folx_missing}")
                        rows.append(row)
                        continue
                    cmd = [
                        sys.executable,
                        __file__,
                        "--child",
                        v,
                        str(depth),
                        str(dim),
                        str(n),
                        "--width",
                        str(args.width),
                        "--repeats",
                        str(args.repeats),
                        "--dtype",
                        args.dtype,
                    ]
                    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
                    line = [s for s in proc.stdout.splitlines() if s.startswith("RESULT ")]
                    if proc.returncode != 0 or not line:
                        err = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
                        row["error"] = err
                        print(f"{v:12s} {depth:5d} {dim:3d} {n:6d}  FAILED: {err}")
                    else:
                        row.update(json.loads(line[0][7:]))
                        print(
                            f"{v:12s} {depth:5d} {dim:3d} {n:6d} {row['time_s']:8.3f} "
                            f"{row['temp_bytes'] / 1e6:8.0f} {row['peak_rss_bytes'] / 1e6:8.0f}",
                            flush=True,
                        )
                    rows.append(row)
    meta = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "width": args.width,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}",
    }
    try:
        import jax

        meta["jax"] = jax.__version__
        from importlib.metadata import version

        import folx  # noqa: F401

        meta["folx"] = version("folx")
    except ImportError as err:
        meta["folx"] = f"not available: {err}"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "results": rows}
    if args.append and args.output.exists():
        previous = json.loads(args.output.read_text())
        previous.setdefault("extra_runs", []).append(data)
        data = previous
    args.output.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
