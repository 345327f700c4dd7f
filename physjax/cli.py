"""The ``physjax`` command: run cases, write NetCDF4 output, draw quick-look plots.

Every run subcommand takes ``--case``, the grid size, ``--t-end``, ``--dt`` or ``--cfl``,
``--save-every``, ``--precision``, ``--devices``, ``--output``, ``--plot`` and
``--config FILE.toml``; settings on the command line override the config file, which
overrides the case's defaults. Bad settings are reported before anything is compiled or
written.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tomllib
from typing import Any

import numpy as np

#: Settings a run subcommand accepts (also the keys allowed at the top of a config file).
RUN_KEYS = (
    "case",
    "nx",
    "ny",
    "n",
    "t_end",
    "dt",
    "cfl",
    "save_every",
    "precision",
    "devices",
    "output",
    "plot",
    "cfl_check",
)


# ----------------------------------------------------------------------------- config
def load_config(path: str, allowed: tuple[str, ...] = RUN_KEYS) -> dict[str, Any]:
    """Read a TOML config: top-level run settings and a ``[parameters]`` table."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"--config: file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--config: {path!r} is not valid TOML: {e}") from None
    raw = {k.replace("-", "_"): v for k, v in raw.items()}
    unknown = sorted(set(raw) - set(allowed) - {"parameters"})
    if unknown:
        raise ValueError(
            f"--config: unknown setting(s) {unknown} in {path!r}; allowed: "
            f"{', '.join(allowed)} and a [parameters] table"
        )
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        raise ValueError(f"--config: 'parameters' in {path!r} must be a table [parameters]")
    return raw


def resolve_settings(args: argparse.Namespace, keys: tuple[str, ...] = RUN_KEYS) -> dict:
    """Merge command line over config file; ``None`` means not given."""
    settings: dict[str, Any] = {"parameters": {}}
    if getattr(args, "config", None):
        settings.update(load_config(args.config, keys))
    for key in keys:
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    for key, value in getattr(args, "param", None) or []:
        settings["parameters"][key] = value
    # --n sets nx and ny unless those are given themselves (command line before config).
    n = settings.pop("n", None)
    if n is not None:
        for key in ("nx", "ny"):
            if getattr(args, key, None) is None and (args.n is not None or key not in settings):
                settings[key] = n
    return settings


def _parse_devices(text: str) -> int | tuple[int, ...]:
    try:
        if "x" in text:
            return tuple(int(p) for p in text.lower().split("x"))
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--devices takes a count like 4 or a layout like 2x2, got {text!r}"
        ) from None


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--param takes NAME=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip().replace("-", "_"), parsed


def setup_jax(precision: str, devices) -> None:
    """Enable float64 and, on a CPU host, simulate the devices asked for. Must run before
    jax initialises its backend."""
    if precision not in ("float32", "float64"):
        raise ValueError(f"--precision must be float32 or float64, got {precision!r}")
    n = math.prod(devices) if isinstance(devices, (tuple, list)) else int(devices or 1)
    if n < 1:
        raise ValueError(f"--devices must be a positive count or layout, got {devices!r}")
    flags = os.environ.get("XLA_FLAGS", "")
    if n > 1 and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    import jax

    if precision == "float64":
        jax.config.update("jax_enable_x64", True)


def _positive_number(name: str, value, integer: bool = False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and value > 0 and (not integer or float(value).is_integer())
    if not ok:
        kind = "a positive integer" if integer else "a finite number > 0"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


def _check_plot_path(path: str | None) -> None:
    if path is None:
        return
    from .io import check_writable

    if not path.lower().endswith(".png"):
        raise ValueError(f"--plot must name a .png file, got {path!r}")
    check_writable(path)


def add_run_options(p: argparse.ArgumentParser, cases: list[str], default_case: str) -> None:
    """The options every run subcommand shares."""
    p.add_argument(
        "--case", choices=None, help=f"one of: {', '.join(cases)} (default {default_case})"
    )
    p.add_argument("--nx", type=int, help="cells in x (default: the case's)")
    p.add_argument("--ny", type=int, help="cells in y (default: the case's)")
    p.add_argument("--n", type=int, help="cells in x and y (sets both)")
    p.add_argument("--t-end", dest="t_end", type=float, help="end time [s] (default: the case's)")
    p.add_argument("--dt", type=float, help="time step [s]; checked against the CFL limit")
    p.add_argument(
        "--cfl", type=float, help="choose dt as this fraction of the stability limit (default 0.5)"
    )
    p.add_argument(
        "--save-every",
        dest="save_every",
        type=int,
        help="steps between frames (default: ~20 frames)",
    )
    p.add_argument("--precision", choices=None, help="float32 (default) or float64")
    p.add_argument(
        "--devices",
        type=_parse_devices,
        help="devices to split the grid over: a count (4) or layout (2x2)",
    )
    p.add_argument("--output", help="NetCDF4/HDF5 output file (default <case>.h5)")
    p.add_argument("--plot", help="quick-look PNG of the last frame")
    p.add_argument("--config", help="TOML file of settings and a [parameters] table")
    p.add_argument(
        "--param",
        action="append",
        type=_parse_param,
        metavar="NAME=VALUE",
        help="override a physical parameter of the case (repeatable)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --output from its last frame"
    )
    p.add_argument(
        "--max-frames",
        dest="max_frames",
        type=int,
        help="stop (resumably) after writing this many frames",
    )
    p.add_argument(
        "--no-cfl-check",
        dest="cfl_check",
        action="store_false",
        default=None,
        help="run even if --dt exceeds the estimated stability limit",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


# ----------------------------------------------------------------------- shallow water
def _sw_variables():
    from .grids import CENTRE, CORNER, X_FACE, Y_FACE
    from .io import Variable

    return [
        Variable("h", CENTRE, "m", "layer thickness"),
        Variable("u", X_FACE, "m s-1", "x-velocity on x-faces"),
        Variable("v", Y_FACE, "m s-1", "y-velocity on y-faces"),
        Variable("zeta", CORNER, "s-1", "relative vorticity at cell corners"),
        Variable("bottom", CENTRE, "m", "bottom height", time_dependent=False),
    ]


def _check_resume_settings(given: dict, stored: dict, output: str, defaults: dict) -> None:
    """A run continues with the configuration stored in its file: a setting given with
    ``--resume`` (other than ``--output``/``--plot``) must not differ from it."""

    def same(a, b):
        norm = lambda v: list(v) if isinstance(v, (tuple, list)) else v  # noqa: E731
        return norm(a) == norm(b)

    for key, value in given.items():
        if key in ("output", "plot", "parameters") or value is None:
            continue
        if key not in stored or not same(value, stored[key]):
            option = "--" + key.replace("_", "-")
            was = f"the stored {stored[key]!r}" if key in stored else "a stored dt"
            raise ValueError(
                f"--resume continues {output!r} with the configuration stored in it; "
                f"{option} {value!r} differs from {was} (leave it out, or start a new run)"
            )
    stored_params = {**defaults, **(stored.get("parameters") or {})}
    for key, value in (given.get("parameters") or {}).items():
        if key not in stored_params or not same(value, stored_params[key]):
            raise ValueError(
                f"--resume continues {output!r} with the configuration stored in it; "
                f"parameter {key}={value!r} differs from the stored "
                f"{stored_params.get(key, 'default')!r} (leave it out, or start a new run)"
            )


def run_shallow_water(
    settings: dict,
    *,
    resume: bool = False,
    max_frames: int | None = None,
    quiet: bool = False,
    out=sys.stdout,
) -> dict:
    """Run a shallow-water case from resolved settings; returns a summary dict.

    All settings are validated, the case built and ``dt`` checked before the output file is
    created or anything compiled.
    """
    from .io import NetCDFWriter, read_attrs, read_frame
    from .solvers.shallow_water import CASES

    output = settings.get("output")
    if resume:
        if not output:
            raise ValueError("--resume needs --output naming the file to continue")
        attrs = read_attrs(output)
        if attrs.get("status") == "complete":
            print(f"{output} is already complete; nothing to resume", file=out)
            return {"output": output, "frames": attrs["n_frames"], "resumed": False}
        stored = attrs.get("configuration")
        if not isinstance(stored, dict) or stored.get("command") != "shallow-water":
            raise ValueError(f"--resume: {output!r} was not written by physjax shallow-water")
        case = CASES.get(stored.get("case"))
        _check_resume_settings(settings, stored, output, case.defaults if case else {})
        settings = {**stored, "output": output, "plot": settings.get("plot") or stored.get("plot")}

    case_name = settings.get("case") or "geostrophic-adjustment"
    if case_name not in CASES:
        raise ValueError(f"--case: unknown case {case_name!r}; choose one of {', '.join(CASES)}")
    precision = settings.get("precision") or "float32"
    devices = settings.get("devices") or 1
    if isinstance(devices, str):  # from a config file: "4" or "2x2"
        try:
            devices = _parse_devices(devices)
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None
    if isinstance(devices, list):
        devices = tuple(devices)
    setup_jax(precision, devices)

    import jax

    from ._runner import SimulationBlewUp, drive, to_numpy
    from .parallel import decompose, make_mesh, shard
    from .solvers.shallow_water import make_case

    kw = {}
    for key in ("nx", "ny"):
        if settings.get(key) is not None:
            kw[key] = _positive_number(f"--{key}", settings[key], integer=True)
    params = dict(settings.get("parameters") or {})
    case = make_case(case_name, precision=precision, **kw, **params)
    model, state = case.model, case.state
    grid = model.grid

    t_end = (
        case.t_end
        if settings.get("t_end") is None
        else _positive_number("--t-end", settings["t_end"])
    )
    cfl_check = settings.get("cfl_check")
    cfl_check = True if cfl_check is None else bool(cfl_check)
    if settings.get("dt") is not None:
        dt = _positive_number("--dt", settings["dt"])
        if cfl_check:
            model.check_dt(state, dt)
        n_steps = max(1, math.ceil(t_end / dt - 1e-9))
    else:
        cfl = 0.5 if settings.get("cfl") is None else _positive_number("--cfl", settings["cfl"])
        if cfl > 1:
            raise ValueError(
                f"--cfl must be in (0, 1] (a fraction of the stability limit), got {cfl}"
            )
        n_steps = max(1, math.ceil(t_end / model.max_stable_dt(state, cfl)))
        dt = t_end / n_steps
    save_every = settings.get("save_every")
    save_every = (
        max(1, n_steps // 20)
        if save_every is None
        else _positive_number("--save-every", save_every, integer=True)
    )

    mesh = None
    if devices != 1:
        n_dev = math.prod(devices) if isinstance(devices, (tuple, list)) else int(devices)
        mesh = make_mesh(tuple(devices) if isinstance(devices, (tuple, list)) else n_dev, ndim=2)
        decompose(grid, mesh)  # raises if the mesh does not divide the grid

    output = output or f"{case_name}.h5"
    plot = settings.get("plot")
    _check_plot_path(plot)
    resolved = {
        "command": "shallow-water",
        "case": case_name,
        "nx": grid.shape[1],
        "ny": grid.shape[0],
        "t_end": t_end,
        "dt": dt,
        "n_steps": n_steps,
        "save_every": save_every,
        "precision": precision,
        "devices": list(devices) if isinstance(devices, tuple) else devices,
        "output": output,
        "plot": plot,
        "cfl_check": cfl_check,
        "parameters": params,
        "scheme": model.scheme,
    }
    variables = _sw_variables()

    @jax.jit
    def diagnose(state):
        return model.relative_vorticity(state)

    def fields_of(state):
        return {
            "h": to_numpy(state.h),
            "u": to_numpy(state.u),
            "v": to_numpy(state.v),
            "zeta": to_numpy(diagnose(state)),
        }

    if resume:
        writer = NetCDFWriter.reopen(output, grid, variables)
        last = read_frame(output)
        state = model.initial_state(last["h"], last["u"], last["v"])
        step0 = int(last["step"])
        frames_before = read_attrs(output)["n_frames"]
    else:
        from .io import check_writable

        check_writable(output)
        writer = NetCDFWriter(
            output,
            grid,
            variables,
            attrs={
                "title": f"physjax shallow-water: {case.description}",
                "case": case_name,
                "parameters": case.parameters,
                "configuration": resolved,
            },
        )
        writer.write_static(
            {"bottom": np.zeros(grid.shape) if model.bottom is None else to_numpy(model.bottom)}
        )
        writer.append(0.0, 0, fields_of(state))
        step0 = 0
        frames_before = 1
    if mesh is not None:
        state = shard(state, grid, mesh)

    def advance(s, t0, n):
        return model.advance(s, t0=t0, dt=dt, n_steps=n, mesh=mesh)

    from tqdm import tqdm

    bar = tqdm(
        total=n_steps,
        initial=step0,
        unit="step",
        desc=f"shallow-water {case_name}",
        disable=quiet,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    try:
        state, step, frames = drive(
            advance,
            state,
            dt=dt,
            step0=step0,
            n_steps=n_steps,
            save_every=save_every,
            on_frame=lambda s, t, k: writer.append(t, k, fields_of(s)),
            progress=bar,
            max_frames=max_frames,
        )
    except SimulationBlewUp as e:
        bar.close()
        writer.finish(f"failed: NaN/Inf at step {e.step}, t = {e.time:.6g} s")
        e.frames_written += frames_before
        raise SimulationBlewUp(e.step, e.time, e.frames_written) from None
    bar.close()
    total_frames = frames_before + frames
    done = step >= n_steps
    if done:
        writer.finish()
    if plot:
        from ._plot import plot_panels

        plot_panels(output, plot)
    note = "" if done else f" (stopped at step {step}/{n_steps}; continue with --resume)"
    plot_note = f" and {plot}" if plot else ""
    print(
        f"wrote {total_frames} frame{'s' if total_frames != 1 else ''} of {case_name} "
        f"(t = {step * dt:.6g} s, {step} step{'s' if step != 1 else ''} of "
        f"dt = {dt:.4g} s) to {output}{plot_note}{note}",
        file=out,
    )
    return {
        "output": output,
        "frames": total_frames,
        "step": step,
        "n_steps": n_steps,
        "dt": dt,
        "complete": done,
        "state": state,
    }


def _cmd_shallow_water(args) -> int:
    settings = resolve_settings(args)
    run_shallow_water(settings, resume=args.resume, max_frames=args.max_frames, quiet=args.quiet)
    return 0


def _cmd_plot(args) -> int:
    from ._plot import plot_panels

    if not os.path.isfile(args.file):
        raise ValueError(f"file {args.file!r} does not exist")
    out = args.output or os.path.splitext(args.file)[0] + ".png"
    _check_plot_path(out)
    plot_panels(args.file, out, frame=args.frame)
    print(f"wrote {out}")
    return 0


# --------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from .solvers.shallow_water._cases import CASES as SW_CASES

    parser = argparse.ArgumentParser(prog="physjax", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"physjax {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    sw = sub.add_parser(
        "shallow-water",
        help="run a rotating shallow-water case",
        description="Run a rotating shallow-water case on the C-grid.",
    )
    add_run_options(sw, list(SW_CASES), "geostrophic-adjustment")
    sw.set_defaults(func=_cmd_shallow_water)

    try:
        from . import _cli_poisson
    except ImportError:
        _cli_poisson = None
    if _cli_poisson is not None:
        _cli_poisson.add_parser(sub)

    pl = sub.add_parser("plot", help="quick-look PNG of a physjax output file")
    pl.add_argument("file", help="a physjax .h5 file")
    pl.add_argument("--output", help="PNG to write (default: next to the file)")
    pl.add_argument("--frame", type=int, default=-1, help="frame index (default: last)")
    pl.set_defaults(func=_cmd_plot)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._memory import tune_cpu_allocator
    from ._runner import SimulationBlewUp

    tune_cpu_allocator()  # reuse large freed buffers; PHYSJAX_NO_ALLOCATOR_TUNING=1 to skip

    try:
        return args.func(args)
    except SimulationBlewUp as e:
        print(f"physjax {args.command}: {e}", file=sys.stderr)
        return 3
    except (ValueError, TypeError) as e:
        print(f"physjax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
