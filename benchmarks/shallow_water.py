"""Shallow-water speed: physjax against a plain vectorised NumPy version of the same scheme.

Prints, for each grid size and precision: steps/s and cell-updates/s of physjax (its default
step: on the CPU, once the fields outgrow the cache, cache-blocked strips of rows, each
advanced three steps per visit) and of NumPy, the speed-up, the cost per cell-update (also
measured with the sizes interleaved, so that the VM's drifts weigh on all sizes alike), the
costs of physjax's plain (unblocked) step and of strips advanced one step per visit, timed
in the same run, the strip height used, the number of XLA fusions per RK3 step of the plain
step, and the fraction of the machine's memory bandwidth reached (minimum traffic: the three
prognostic fields read and written once per stage, 18·N²·itemsize bytes per step). The
bandwidth is measured here by a STREAM-like in-place add. Writes JSON to
benchmarks/results/shallow_water.json; a partial run (other ``--sizes`` or ``--dtypes``, or
``--no-numpy``) writes ``shallow_water_partial.json`` there instead, so that it never
replaces the full run's file (``--output`` chooses).

    python benchmarks/shallow_water.py                       # 256² … 2048², float32 and float64
    python benchmarks/shallow_water.py --sizes 4096 --dtypes float32 --no-numpy   # GPU check
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import physjax  # noqa: E402

ALLOCATOR_TUNED = physjax.tune_cpu_allocator()
CODEGEN_TUNED = physjax.tune_cpu_codegen()  # before the first computation
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import sw_numpy  # noqa: E402

from physjax.grids import CENTRE, Grid  # noqa: E402
from physjax.solvers import ShallowWater  # noqa: E402
from physjax.solvers.shallow_water._blocked import (  # noqa: E402
    AUTO_STRIP_STEPS,
    OVERLAP,
    auto_strip_rows,
    last_level_cache_bytes,
)
from physjax.solvers.shallow_water._model import _strip_plan  # noqa: E402

G, F0, L, H = 9.81, 1e-4, 4.0e6, 500.0
FULL_SIZES, FULL_DTYPES = [256, 512, 1024, 2048], ["float32", "float64"]  # the full run


def _timeit(fn, min_time=1.0, repeats=3):
    """Median over ``repeats`` of the time per call, each repeat lasting ≥ min_time."""
    fn()  # warm (compile)
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    # rounded up: each repeat lasts at least min_time (int() gave one 0.6-s call for 1 s)
    reps = max(1, math.ceil(min_time / max(one, 1e-9)))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps)
    return float(np.median(out))


def bandwidth(gib: float = 1.0) -> dict:
    """STREAM-like in-place add a += b: 3 × size bytes moved (read a, read b, write a)."""
    n = int(gib * 2**30 / 8 / 2)
    a = np.ones(n)
    b = np.ones(n)

    def np_add():
        np.add(a, b, out=a)

    t_np = _timeit(np_add, 0.5)
    ja, jb = jnp.ones(n), jnp.ones(n)
    add = jax.jit(lambda x, y: x + y, donate_argnums=0)
    state = {"a": ja}

    def jax_add():
        state["a"] = add(state["a"], jb)
        state["a"].block_until_ready()

    t_jax = _timeit(jax_add, 0.5)
    # a copy-like stream, a = a + 1 in place: 2 × size bytes (the GPU check's reference)
    inc = jax.jit(lambda x: x + 1.0, donate_argnums=0)

    def jax_copy():
        state["a"] = inc(state["a"])
        state["a"].block_until_ready()

    t_copy = _timeit(jax_copy, 0.5)
    bytes_moved = 3 * n * 8
    return {
        "numpy_GBps": bytes_moved / t_np / 1e9,
        "jax_GBps": bytes_moved / t_jax / 1e9,
        "jax_copy_GBps": 2 * n * 8 / t_copy / 1e9,
    }


def make(n: int, dtype: str, strip_rows: int | None = None, strip_steps: int | None = None):
    grid = Grid((n, n), (L, L), periodic=True, dtype=dtype)
    model = ShallowWater(
        grid, gravity=G, coriolis=F0, strip_rows=strip_rows, strip_steps=strip_steps
    )
    y, x = grid.mesh_coordinates(CENTRE)
    h = H + 10 * np.exp(-((x - L / 2) ** 2 + (y - L / 2) ** 2) / (L / 8) ** 2)
    state = model.initial_state(h)
    dt = float(model.max_stable_dt(state, 0.5))
    return model, state, dt


#: A fusion instruction in HLO text, its result an array or a tuple (a multi-output fusion).
_FUSION = re.compile(r"^\s*(?:ROOT )?%\S+ = .*?\bfusion\(", re.M)


def count_fusions(model, state, dt, hlo_path=None) -> int:
    """Fusion kernels in the compiled loop body of one RK3 step (inside the scan of 7
    steps, a trip count no backend unrolls into the entry computation). ``hlo_path``: also
    write the compiled program's text there."""
    fn = jax.jit(lambda s: model.advance(s, t0=0.0, dt=dt, n_steps=7))
    text = fn.lower(state).compile().as_text()
    if hlo_path is not None:
        with open(hlo_path, "w") as fh:
            fh.write(text)
    blocks = re.findall(r"\n(%[^\n]*\{\n.*?\n\})", text, re.S)
    best = 0
    for block in blocks:
        head = block.split("\n", 1)[0]
        if "fused" in head or "wrapped" in head:
            continue
        best = max(best, len(_FUSION.findall(block)))
    return best


def steps_per_call(n: int) -> int:
    """Steps per timed call: ~4e7 cell-updates on the CPU (~4e9 on an accelerator, where a
    call of a few steps would be mostly dispatch), a multiple of 12 so that strips advanced
    3 steps per visit take no one-step remainder."""
    work = 4e7 if jax.default_backend() == "cpu" else 4e9
    return max(12, int(work / n**2) // 12 * 12)


def bench_physjax(n, dtype, steps, repeats=3, hlo_path=None):
    """Seconds per step of the plain step, of strips advanced one step per visit and of
    strips advanced ``AUTO_STRIP_STEPS`` steps per visit, interleaved: each of ``repeats``
    rounds times each for ≥ 1 s; medians. On the CPU the strips are those the automatic
    choice takes once it blocks (``auto_strip_rows`` with no cache), whether or not it
    blocks on this machine; the default (automatic) step is the plain step or the last
    variant. Also the fusions of the plain step."""
    model, state, dt = make(n, dtype)
    auto, _ = _strip_plan(model)
    candidates = {"plain": (0, None)}
    if jax.default_backend() == "cpu":
        blocked = auto or auto_strip_rows(
            model.grid, cache_bytes=0, min_rows=OVERLAP * AUTO_STRIP_STEPS
        )
        if blocked:
            candidates["strips1"] = (blocked, 1)
            candidates["blocked"] = (blocked, None)
    models = {name: make(n, dtype, *rs)[0] for name, rs in candidates.items()}
    # compiled calls, as a time stepper makes them: `advance` called eagerly would first
    # check the state on the host (a copy of every field per call)
    compiled = {
        name: jax.jit(lambda s, mdl=mdl: mdl.advance(s, t0=0.0, dt=dt, n_steps=steps))
        for name, mdl in models.items()
    }
    fns = {name: lambda fn=fn: jax.block_until_ready(fn(state)) for name, fn in compiled.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(_timeit(fn, 1.0, repeats=1) / steps)
    t = {name: float(np.median(v)) for name, v in times.items()}
    t_default = t["blocked" if auto else "plain"]
    fusions = count_fusions(models["plain"], state, dt, hlo_path)
    return t_default, t, auto, candidates.get("blocked", (0,))[0], fusions


def interleaved(fns: dict, rounds: int = 8, seconds: float = 0.7) -> dict:
    """ns per cell-update of each ``(fn, state, steps, n)`` in ``fns``, timed in turn for
    ``seconds`` in each of ``rounds`` rounds, so that the VM's slow drifts weigh on all of
    them alike: ``{key: (best, median)}``."""
    ns = {key: [] for key in fns}
    for _ in range(rounds):
        for key, (fn, state, steps, n) in fns.items():
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                jax.block_until_ready(fn(state))
                calls += 1
            ns[key].append((time.perf_counter() - t0) / calls / steps / n**2 * 1e9)
    return {key: (float(min(v)), float(np.median(v))) for key, v in ns.items()}


def compiled_advance(n, dtype, strip_rows=None, strip_steps=None):
    """``(fn, state, steps, n)`` for ``interleaved``: a compiled, warmed ``advance``."""
    model, state, dt = make(n, dtype, strip_rows, strip_steps)
    steps = steps_per_call(n)
    fn = jax.jit(lambda s: model.advance(s, t0=0.0, dt=dt, n_steps=steps))
    jax.block_until_ready(fn(state))
    return fn, state, steps, n


def flatness(sizes, dtypes, rounds=8, seconds=0.7):
    """Cost per cell-update of the default step at every size, the sizes interleaved.
    Returns ``{dtype: {n: (best, median)}}`` in ns."""
    fns = {(dtype, n): compiled_advance(n, dtype) for dtype in dtypes for n in sizes}
    out = {}
    for (dtype, n), v in interleaved(fns, rounds, seconds).items():
        out.setdefault(dtype, {})[n] = v
    return out


def bench_numpy(n, dtype, min_steps=2):
    model, state, dt = make(n, dtype)
    h, u, v = (np.asarray(a) for a in (state.h, state.u, state.v))
    grid = model.grid
    kw = dict(g=G, f=F0, dx=grid.dx, dy=grid.dy)
    out = sw_numpy.ssprk3(h, u, v, float(dt), **kw)
    assert all(a.dtype == np.dtype(dtype) for a in out)
    # the two implementations agree: same arithmetic, so to round-off (a few ulps of h;
    # for u and v, which start at rest, a few ulps of g h dt / dx, the rounding of the
    # pressure gradient's step); a baseline that computes something else would make the
    # speed-up meaningless. (h alone missed a wrong velocity tendency in float32: a
    # Coriolis term of the wrong sign changed h after one step by less than 8 ulps.)
    ref = model.step(state, dt)
    eps = float(np.finfo(dtype).eps)
    err = float(np.max(np.abs(out[0] - np.asarray(ref.h))) / H)
    tol = 8 * eps * float(np.max(np.abs(h))) / H
    velocity_tol = 8 * eps * G * float(np.max(np.abs(h))) * float(dt) / min(grid.dx, grid.dy)
    velocity_err = max(
        float(np.max(np.abs(a - np.asarray(b)))) for a, b in zip(out[1:], (ref.u, ref.v))
    )
    if not (err <= tol and velocity_err <= velocity_tol):
        raise RuntimeError(
            f"the NumPy baseline's first step differs from physjax's at {n}² {dtype}: max "
            f"|Δh| / H = {err:.3g} (round-off bound {tol:.3g}), max |Δu|, |Δv| = "
            f"{velocity_err:.3g} m/s (bound {velocity_tol:.3g}): sw_numpy.py no longer "
            "computes the scheme of physjax"
        )

    def run():
        sw_numpy.ssprk3(h, u, v, float(dt), **kw)

    return _timeit(run, 1.0, repeats=min_steps), err


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1 (a size or a count of rounds), refused before any
    measuring (``--sizes 0`` stopped in a division after the bandwidth measurement)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0 (seconds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
    return value


DTYPES = ("float32", "float64")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=positive_int, nargs="+", default=FULL_SIZES)
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=FULL_DTYPES)
    p.add_argument("--no-numpy", action="store_true", help="skip the NumPy baseline")
    p.add_argument(
        "--output",
        help="results file (default: benchmarks/results/shallow_water.json; for a partial run, "
        "other --sizes or --dtypes or --no-numpy, shallow_water_partial.json beside it)",
    )
    p.add_argument(
        "--hlo",
        metavar="DIR",
        help="write the compiled step's HLO text of the largest size there (hlo_N_DTYPE.txt)",
    )
    args = p.parse_args(argv)
    if args.output is None:  # a partial run never replaces the full run's file
        full = args.sizes == FULL_SIZES and args.dtypes == FULL_DTYPES and not args.no_numpy
        name = "shallow_water.json" if full else "shallow_water_partial.json"
        args.output = os.path.join(HERE, "results", name)
    if args.hlo:  # made now: the largest size, whose text goes there, is measured last
        os.makedirs(args.hlo, exist_ok=True)

    device = jax.devices()[0]
    bw = bandwidth(0.5 if device.platform == "cpu" else 2.0)
    # the in-place add (3 streams) is the reference of the CPU tables; the copy-like stream
    # (2 streams) is reported beside it, and is the GPU check's reference
    bw_ref = max(bw["numpy_GBps"], bw["jax_GBps"])
    print(f"device: {device.device_kind} ({device.platform}), {os.cpu_count()} CPU cores")
    llc = last_level_cache_bytes()
    print(f"last-level cache: {'unknown' if llc is None else f'{llc / 2**20:.0f} MiB'}")
    print(
        f"memory bandwidth (in-place add): numpy {bw['numpy_GBps']:.1f} GB/s, "
        f"jax {bw['jax_GBps']:.1f} GB/s; copy-like a = a + 1 (jax) {bw['jax_copy_GBps']:.1f} GB/s"
    )
    header = (
        f"{'N':>6} {'dtype':>8} {'physjax s/step':>15} {'Mcell/s':>9} {'ns/cell':>8} "
        f"{'numpy s/step':>13} {'speed-up':>9} {'plain ns/cell':>14} {'strips×1 ns':>12} "
        f"{'strips ns/cell':>15} "
        f"{'rows':>5} {'default':>8} {'fusions':>8} {'%bw':>6} {'%copy':>6}"
    )
    print(header)
    rows = []
    for dtype in args.dtypes:
        for n in args.sizes:
            steps = steps_per_call(n)
            hlo = None
            if args.hlo and n == max(args.sizes):
                hlo = os.path.join(args.hlo, f"hlo_{n}_{dtype}.txt")
            t_px, t_both, auto, strips, fusions = bench_physjax(n, dtype, steps, hlo_path=hlo)
            t_plain = t_both["plain"]
            t_strips = t_both.get("blocked")
            t_strips1 = t_both.get("strips1")
            t_np, err = (None, None) if args.no_numpy else bench_numpy(n, dtype)
            itemsize = np.dtype(dtype).itemsize
            frac = 18 * n * n * itemsize / t_px / 1e9 / bw_ref
            frac_copy = 18 * n * n * itemsize / t_px / 1e9 / bw["jax_copy_GBps"]
            row = {
                "n": n,
                "dtype": dtype,
                "physjax_s_per_step": t_px,
                "physjax_cell_updates_per_s": n * n / t_px,
                "ns_per_cell_update": t_px / n**2 * 1e9,
                "numpy_s_per_step": t_np,
                "speedup": None if t_np is None else t_np / t_px,
                "plain_ns_per_cell_update": t_plain / n**2 * 1e9,
                "strips_ns_per_cell_update": None if t_strips is None else t_strips / n**2 * 1e9,
                "strips_one_step_ns_per_cell_update": (
                    None if t_strips1 is None else t_strips1 / n**2 * 1e9
                ),
                "strip_steps": AUTO_STRIP_STEPS if strips else None,
                "strip_rows": strips,
                "default": "strips" if auto else "plain",
                "fusions_per_step_plain": fusions,
                "bandwidth_fraction": frac,
                "copy_bandwidth_fraction": frac_copy,
                "numpy_max_rel_diff": err,
            }
            rows.append(row)
            np_txt = "-" if t_np is None else f"{t_np:.3e}"
            sp_txt = "-" if t_np is None else f"{t_np / t_px:.2f}x"
            print(
                f"{n:>6} {dtype:>8} {t_px:>15.3e} {n * n / t_px / 1e6:>9.1f} "
                f"{t_px / n**2 * 1e9:>8.2f} {np_txt:>13} {sp_txt:>9} "
                f"{t_plain / n**2 * 1e9:>14.2f} "
                f"{'-' if t_strips1 is None else f'{t_strips1 / n**2 * 1e9:.2f}':>12} "
                f"{'-' if t_strips is None else f'{t_strips / n**2 * 1e9:.2f}':>15} "
                f"{strips or '-':>5} {'strips' if auto else 'plain':>8} {fusions:>8} "
                f"{100 * frac:>5.1f}% {100 * frac_copy:>5.1f}%",
                flush=True,
            )
    flat = flatness(args.sizes, args.dtypes)
    print("\ncost per cell-update of the default step, sizes interleaved (ns, best / median):")
    for dtype, by_n in flat.items():
        medians = [m for _, m in by_n.values()]
        cells = "  ".join(f"{n}²: {b:.2f} / {m:.2f}" for n, (b, m) in by_n.items())
        print(f"{dtype:>8}  {cells}  max/min of medians {max(medians) / min(medians):.2f}")
    # a bare file name has no folder part: makedirs('') would fail after the whole run
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(
            {
                "device": device.device_kind,
                "platform": device.platform,
                "machine": platform.machine(),
                "cpu_count": os.cpu_count(),
                "cpu_model": _cpu_model(),
                "last_level_cache_bytes": llc,
                "xla_cpu_512_bit_vectors": CODEGEN_TUNED,
                "bandwidth": bw,
                "rows": rows,
                "flatness_ns_best_median": {
                    dtype: {str(n): list(v) for n, v in by_n.items()}
                    for dtype, by_n in flat.items()
                },
            },
            f,
            indent=1,
        )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
