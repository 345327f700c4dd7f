"""Experiment: the shallow-water RK3 step with the state kept padded through the whole run.

The package's plain step pads each stage's state afresh (one new padded array per field and
stage, built by slicing and concatenating; on XLA:GPU three separate halo kernels per
stage, docs/benchmarks.md). Here the scan carries the padded fields instead, with two spare
padded buffers per field: each stage writes its interior into a buffer whose contents are
dead (``dynamic_update_slice``, which XLA can do in place) and then refills only the halo
rows and columns of that buffer in place. Two steps per scan iteration bring the buffers
back to their roles, so the loop carry needs no copy. Minimum traffic of the stage-by-stage
RK3: about 24·N² values per step (stage 1 reads 3 fields and writes 3, stages 2 and 3 also
read the step's start), against ~51·N² for the package's accelerator form.

Doubly periodic f-plane only (the benchmark's case). It is not in the package: it has not
been measured on an accelerator yet. Run:

    python benchmarks/sw_padded_carry.py --sizes 256 1024 --dtype float64

It checks the result against ``ShallowWater.advance`` (the same arithmetic: equal to
round-off, to the last bit where the compiler contracts alike), counts the kernels (two
steps per loop body for the carried variants, one for the plain step) and whole-field
copies in the compiled loop body, and times the variants interleaved (best and median ns
per cell-update, and the fraction of the copy-like stream's bandwidth for the 18·N² count
the benchmark uses).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

# importing shallow_water tunes the allocator and enables x64
from shallow_water import (  # noqa: E402
    DTYPES,
    bandwidth,
    compiled_advance,
    interleaved,
    make,
    positive_float,
    positive_int,
    steps_per_call,
)

from physjax.solvers import ShallowWaterState  # noqa: E402


def refill_periodic(p):
    """Halo (width 1) of a doubly periodic padded field, read back from its interior and
    written in place (``--halo readback``). On XLA:CPU the strip reads are fused into the
    writes of the same buffer, and XLA then copies the whole field before each write
    (optimisation barriers around the strips did not prevent it)."""
    ny, nx = p.shape[0] - 2, p.shape[1] - 2
    top, bottom = p[ny : ny + 1, 1 : nx + 1], p[1:2, 1 : nx + 1]

    def column(i):  # interior column i with the corners it wraps to
        return jnp.concatenate([p[ny : ny + 1, i : i + 1], p[1 : ny + 1, i : i + 1],
                                p[1:2, i : i + 1]])  # fmt: skip

    top, bottom, left, right = top, bottom, column(nx), column(1)
    p = lax.dynamic_update_slice(p, top, (0, 1))
    p = lax.dynamic_update_slice(p, bottom, (ny + 1, 1))
    p = lax.dynamic_update_slice(p, left, (0, 0))
    return lax.dynamic_update_slice(p, right, (0, nx + 1))


def _interior(p):
    return p[1:-1, 1:-1]


def _wrap(interior):
    """The four periodic edge strips of a padded field (columns with their corners), taken
    from the interior values themselves."""
    c_left, c_right = interior[:, -1:], interior[:, :1]
    return (
        interior[-1:, :],
        interior[:1, :],
        jnp.concatenate([c_left[-1:], c_left, c_left[:1]]),
        jnp.concatenate([c_right[-1:], c_right, c_right[:1]]),
    )


def _write(dead, interior, halo="interior"):
    """``interior`` written into a padded buffer whose contents are dead, then its halo:
    with ``halo="interior"`` the edge strips are computed from the stage's expression (so
    the buffer being written is never read; XLA may recompute the edge values or
    materialise the expression), with ``"readback"`` they are read back from the buffer."""
    p = lax.dynamic_update_slice(dead, interior, (1, 1))
    if halo == "readback":
        return refill_periodic(p)
    ny, nx = interior.shape
    top, bottom, left, right = _wrap(interior)
    p = lax.dynamic_update_slice(p, top, (0, 1))
    p = lax.dynamic_update_slice(p, bottom, (ny + 1, 1))
    p = lax.dynamic_update_slice(p, left, (0, 0))
    return lax.dynamic_update_slice(p, right, (0, nx + 1))


def padded_advance(model, n_steps: int, halo: str = "interior"):
    """``advance(state, dt)`` for an even ``n_steps``, carrying padded fields."""
    if n_steps % 2:
        raise ValueError("n_steps must be even (two steps per loop iteration)")
    names = ("h", "u", "v")

    def k(p, t):  # interior tendencies of a padded state
        d = model._tendency(ShallowWaterState(*p), t, None)
        return d.h, d.u, d.v

    def step(y, s1, s2, t, dt):
        # the arithmetic of physjax.solvers._time_stepping.ssprk3_step, field by field
        y_int = [_interior(a) for a in y]
        k1 = k(y, t)
        s1 = [_write(b, dt * ki + yi, halo) for b, ki, yi in zip(s1, k1, y_int)]
        k2 = k(s1, t + dt)
        s2 = [
            _write(b, yi + 0.25 * ((dt * ki + _interior(w)) - yi), halo)
            for b, ki, yi, w in zip(s2, k2, y_int, s1)
        ]
        k3 = k(s2, t + 0.5 * dt)
        new = [
            _write(b, yi + (2 / 3) * ((dt * ki + _interior(w)) - yi), halo)
            for b, ki, yi, w in zip(s1, k3, y_int, s2)
        ]
        return new, y, s2  # the old state's buffers are the next step's spares

    def body(carry, i):
        y, s1, s2, t, dt = carry
        y, s1, s2 = step(y, s1, s2, t, dt)
        y, s1, s2 = step(y, s1, s2, t + dt, dt)
        return (y, s1, s2, t + 2 * dt, dt), None

    def run(state, dt):
        y = [getattr(model._pad(state), k) for k in names]
        spare = [jnp.zeros_like(a) for a in y]
        spare2 = [jnp.zeros_like(a) for a in y]
        t0 = jnp.zeros((), y[0].dtype)
        (y, _, _, _, _), _ = lax.scan(
            body, (y, spare, spare2, t0, jnp.asarray(dt, y[0].dtype)), None, length=n_steps // 2
        )
        return ShallowWaterState(*[_interior(a) for a in y])

    return run


_FUSION = re.compile(r"^\s*(?:ROOT )?%\S+ = .*?\bfusion\(", re.M)
_COPY = re.compile(r"^\s*(?:ROOT )?%\S+ = \S+ copy\(", re.M)


def loop_counts(text: str) -> tuple[int, int]:
    """(fusions, copies) in the largest non-fused computation of compiled HLO text (the
    loop body)."""
    best = (0, 0)
    for block in re.findall(r"\n(%[^\n]*\{\n.*?\n\})", text, re.S):
        head = block.split("\n", 1)[0]
        if "fused" in head or "wrapped" in head:
            continue
        count = (len(_FUSION.findall(block)), len(_COPY.findall(block)))
        best = max(best, count)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=positive_int, nargs="+", default=[256, 1024])
    p.add_argument("--dtype", choices=DTYPES, default="float64")
    p.add_argument("--rounds", type=positive_int, default=8)
    p.add_argument("--seconds", type=positive_float, default=0.7)
    p.add_argument("--output", default=None, help="JSON file for the figures")
    p.add_argument("--hlo", default=None, help="folder for the compiled programs' text")
    p.add_argument(
        "--core",
        choices=("auto", "shared", "pointwise"),
        default="auto",
        help="tendency form for both variants (default: the package's choice for the backend)",
    )
    p.add_argument(
        "--halo",
        nargs="+",
        choices=("interior", "readback"),
        default=["interior", "readback"],
        help="how the padded fields' halos are refilled (see _write)",
    )
    args = p.parse_args(argv)
    if args.output:  # made now, not after minutes of measuring
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    if args.core != "auto":
        from physjax.solvers.shallow_water import _model

        _model._pointwise_core = lambda: args.core == "pointwise"
    backend = jax.default_backend()
    copy_gbps = bandwidth(0.5 if backend == "cpu" else 2.0)["jax_copy_GBps"]
    print(f"{backend}: copy-like stream a = a + 1: {copy_gbps:.1f} GB/s", flush=True)
    results = {"backend": backend, "jax": jax.__version__, "copy_GBps": copy_gbps,
               "core": args.core, "rows": []}  # fmt: skip
    for n in args.sizes:
        model, state, dt = make(n, args.dtype, 0)
        steps = steps_per_call(n) // 2 * 2
        ref = jax.jit(lambda s, model=model, dt=dt: model.advance(s, t0=0.0, dt=dt, n_steps=12))
        a = ref(state)
        plain = compiled_advance(n, args.dtype, 0, None)
        fns = {"plain": plain}
        texts = {"plain": plain[0].lower(state).compile().as_text()}
        row = {"n": n, "dtype": args.dtype}
        for halo in args.halo:
            # check: 12 steps against the package's plain step
            short = padded_advance(model, 12, halo)
            b = jax.jit(lambda s, run=short, dt=dt: run(s, dt))(state)
            diff = max(
                float(jnp.max(jnp.abs(x - y)) / jnp.max(jnp.abs(x)))
                for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
            )
            row[f"max_rel_diff_12_steps_{halo}"] = diff
            print(f"{n}² {args.dtype}, halo {halo}: against advance, 12 steps: "
                  f"max rel diff {diff:.2e}")  # fmt: skip
            run = padded_advance(model, steps, halo)
            fn = jax.jit(lambda s, run=run, dt=dt: run(s, dt))
            texts[halo] = fn.lower(state).compile().as_text()
            jax.block_until_ready(fn(state))
            fns[halo] = (fn, state, steps, n)
        if args.hlo:
            os.makedirs(args.hlo, exist_ok=True)
            for name, text in texts.items():
                with open(os.path.join(args.hlo, f"carry_{name}_{n}_{args.dtype}.txt"), "w") as fh:
                    fh.write(text)
        for name, (best, median) in interleaved(fns, args.rounds, args.seconds).items():
            fusions, copies = loop_counts(texts[name])
            frac = 100 * 18 * np.dtype(args.dtype).itemsize / best / copy_gbps
            row[name] = {"best_ns": best, "median_ns": median, "fusions": fusions,
                         "copies": copies, "pct_copy_best": frac}  # fmt: skip
            print(
                f"  {name:>9}: best {best:6.3f}  median {median:6.3f} ns per cell-update, "
                f"{frac:5.1f}% of copy (best), loop body {fusions} fusions, {copies} copies",
                flush=True,
            )
        results["rows"].append(row)
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
