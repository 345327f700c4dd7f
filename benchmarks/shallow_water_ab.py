"""Same-process A/B of shallow-water step variants, interleaved: cost per cell-update.

Each variant is ``N:DTYPE:ROWS:STEPS`` (``ROWS``/``STEPS``: ``strip_rows``/``strip_steps``
of ``ShallowWater``, or ``auto``); every round times each variant for 0.7 s in turn, so
that the VM's slow drifts weigh on all of them alike. Prints best and median ns per
cell-update over the rounds. Example (the before/after table in docs/benchmarks.md):

    python benchmarks/shallow_water_ab.py 256:float64:0:auto 512:float64:0:auto \\
        1024:float64:64:1 2048:float64:32:1 1024:float64:128:3 2048:float64:64:3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shallow_water import jax, make  # noqa: E402  (tunes the allocator, enables x64)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("variants", nargs="+", help="N:DTYPE:ROWS:STEPS")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=0.7)
    args = p.parse_args(argv)
    fns = {}
    for v in args.variants:
        n, dtype, rows, steps = v.split(":")
        n = int(n)
        rows = None if rows == "auto" else int(rows)
        steps = None if steps == "auto" else int(steps)
        model, state, dt = make(n, dtype, rows, steps)
        k = max(12, int(4e7 / n**2) // 12 * 12)
        fn = jax.jit(lambda s, m=model, dt=dt, k=k: m.advance(s, t0=0.0, dt=dt, n_steps=k))
        jax.block_until_ready(fn(state))
        fns[v] = (fn, state, k, n)
    ns = {v: [] for v in fns}
    for _ in range(args.rounds):
        for v, (fn, state, k, n) in fns.items():
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                jax.block_until_ready(fn(state))
                calls += 1
            ns[v].append((time.perf_counter() - t0) / calls / k / n**2 * 1e9)
    for v, t in ns.items():
        print(f"{v:>24}  best {min(t):6.2f}  median {np.median(t):6.2f} ns per cell-update")


if __name__ == "__main__":
    main()
