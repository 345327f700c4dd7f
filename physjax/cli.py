"""The ``physjax`` command: run cases, write NetCDF4 output, draw quick-look plots.

Every run subcommand takes ``--case``, the grid size, ``--t-end``, ``--dt`` or ``--cfl``,
``--save-every``, ``--precision``, ``--devices``, ``--output``, ``--plot`` and
``--config FILE.toml``; settings on the command line override the config file, which
overrides the case's defaults. Bad settings are reported before anything is compiled or
written.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shlex
import signal
import sys
import threading
import tomllib
from typing import Any

import numpy as np

#: The shallow-water cases' names, in the order of ``physjax.solvers.shallow_water.CASES``
#: (a test keeps the two alike): the parser lists them without importing the solvers and jax.
SW_CASE_NAMES = (
    "geostrophic-adjustment",
    "zonal-jet",
    "barotropic-instability",
    "gravity-wave",
    "wind-gyre",
)

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
    "no_cfl_check",
    "max_frames",
    "quiet",
)

#: Options that a config file may not hold: which file, and whether to continue or replace it.
COMMAND_LINE_ONLY = ("resume", "overwrite", "config", "param")

#: The type of each setting a config file may hold ("number": an int or a float, not a bool).
SETTING_TYPES = {
    "case": "string",
    "nx": "integer",
    "ny": "integer",
    "nz": "integer",
    "n": "integer",
    "t_end": "number",
    "dt": "number",
    "cfl": "number",
    "save_every": "integer",
    "precision": "string",
    "devices": "devices",
    "output": "string",
    "plot": "string",
    "cfl_check": "boolean",
    "no_cfl_check": "boolean",
    "max_frames": "integer",
    "quiet": "boolean",
    # physjax poisson
    "rhs": "string",
    "coefficient": "string",
    "shift": "number",
    "frame": "integer",
    "bc": "names",
    "method": "string",
    "lx": "number",
    "ly": "number",
    "lz": "number",
    "rtol": "number",
    "max_iterations": "integer",
    "compatibility": "string",
}
_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number (an integer or a float)",
    "boolean": "true or false",
    "devices": 'a count like 4, or a layout like "2x2" or [2, 2]',
    "names": 'a string like "dirichlet,periodic" or a list of strings',
}

#: Settings that exclude each other: given together in one place they are refused; one on the
#: command line overrides the other from the config file.
EXCLUSIVE = (("dt", "cfl"),)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has_type(value, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return _is_int(value)
    if kind == "number":
        return _is_int(value) or isinstance(value, float)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "names":
        return isinstance(value, str) or (
            isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
        )
    # devices
    if isinstance(value, list):
        return bool(value) and all(_is_int(v) for v in value)
    return _is_int(value) or isinstance(value, str)


# ----------------------------------------------------------------------------- config
def load_config(
    path: str, allowed: tuple[str, ...] = RUN_KEYS, parameters: bool = True
) -> dict[str, Any]:
    """Read a TOML config: top-level run settings and (if `parameters`) a ``[parameters]``
    table; or, from a physjax output file, the settings of the run or solve that wrote it
    (`_settings_of_output`)."""
    if path == "":  # not "no config": a script's --config "$CFG" with CFG unset
        raise ValueError("--config must name a TOML file, got ''")
    if os.path.exists(path) and not os.path.isdir(path) and not os.path.isfile(path):
        raise ValueError(f"--config: {path!r} is not a regular file (a device or pipe)")
    try:
        with open(path, "rb") as f:
            head = f.read(len(_HDF5_SIGNATURE))
            # an output file: the settings stored in it are read, not its data (GBs perhaps)
            text = None if head == _HDF5_SIGNATURE else head + f.read()
    except FileNotFoundError:
        raise ValueError(f"--config: file {path!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"--config: {path!r} is a directory, not a TOML file") from None
    except OSError as e:
        raise ValueError(f"--config: {path!r} cannot be read: {e}") from None
    if text is None:
        raw = _settings_of_output(path, parameters)
    else:
        raw = _parse_toml(path, text, parameters)
    return _checked_config(path, raw, allowed, parameters)


#: The first bytes of an HDF5 file (physjax's NetCDF4 output): ``--config`` reads the
#: settings stored in it.
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

#: Settings of a shallow-water run that ``--config RUN.h5`` takes from its ``configuration``
#: as they are (its dt is taken as it was asked for: ``dt_requested``, or ``cfl``).
_RUN_SETTINGS = ("case", "nx", "ny", "t_end", "save_every", "precision", "devices")


def _settings_of_output(path: str, parameters: bool) -> dict[str, Any]:
    """``--config FILE.h5``: the settings that the physjax run (or solve) which wrote
    ``FILE.h5`` was given, from its ``configuration``, as a TOML file would give them — for
    a new run of the same problem. Not its output or plot names (a new run writes a new
    file), nor a frame limit; and not its state: ``--resume`` continues a run."""
    from .io import read_attrs, read_retrying

    command = "shallow-water" if parameters else "poisson"
    try:
        cfg = read_retrying(path, lambda: read_attrs(path), prefix="--config: ")
    except ValueError as e:
        text = str(e)
        raise ValueError(text if text.startswith("--config") else f"--config: {text}") from None
    cfg = cfg.get("configuration")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("command"), str):
        raise ValueError(
            f"--config: {path!r} is an HDF5 file without a physjax configuration; --config "
            "reads a TOML file, or the output file of a physjax run for its settings"
        )
    if cfg["command"] != command:
        raise ValueError(
            f"--config: {path!r} holds the results of physjax {cfg['command']}, not of "
            f"physjax {command}: give it to physjax {cfg['command']} --config"
        )
    if parameters:
        raw = _run_settings_of(cfg)
        raw["parameters"] = dict(cfg.get("parameters") or {})
        return raw
    return _poisson_settings_of(cfg)


def _replayed(cfg: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """Of the settings a file's run resolved, those its command was given (``given`` in its
    configuration), so that a setting the new command line changes recomputes the defaults
    that followed from it (a solve's tolerance from its precision, a run's frame interval
    from its end time) as it would for a command typed anew; a file written before
    ``given`` was recorded replays every resolved setting."""
    given = cfg.get("given")
    if not isinstance(given, list):
        return resolved
    return {k: v for k, v in resolved.items() if k in given}


def _run_settings_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """`_settings_of_output` of a shallow-water run (without its ``parameters``)."""
    raw = {k: cfg[k] for k in _RUN_SETTINGS if cfg.get(k) is not None}
    if cfg.get("dt_requested") is not None:
        raw["dt"] = cfg["dt_requested"]
    elif cfg.get("cfl") is not None:
        raw["cfl"] = cfg["cfl"]
    elif "cfl" not in cfg and cfg.get("dt") is not None:
        # a file of a version that stored neither (before 2026-12-01): the step it took,
        # which a default --cfl would not give again
        raw["dt"] = cfg["dt"]
    if cfg.get("cfl_check") is not None:
        raw["cfl_check"] = cfg["cfl_check"]
    given = cfg.get("given")
    if isinstance(given, list) and {"dt", "cfl"} & set(given):  # the step, however given
        cfg = {**cfg, "given": [*given, "dt", "cfl"]}
    return _replayed(cfg, raw)


def _poisson_settings_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """`_settings_of_output` of a ``physjax poisson`` file: its problem as the options give
    it. A manufactured case gives its grid (``nx`` … and ``lx`` …); a ``--rhs`` its file and
    frame, the grid following the file again (a length only along the axes where it put
    the first cell at 0: a given length does, the file's coordinates need not)."""
    raw: dict[str, Any] = {
        k: cfg[k]
        for k in ("bc", "method", "compatibility", "shift", "precision", "devices")
        if cfg.get(k) is not None
    }
    if cfg.get("method") != "spectral":  # a direct solve takes no stopping rule
        raw.update({k: cfg[k] for k in ("rtol", "max_iterations") if cfg.get(k) is not None})
    shape, extent = cfg.get("shape") or [], cfg.get("extent") or []
    origin = cfg.get("origin") or [0.0] * len(extent)
    names = ("z", "y", "x")[3 - len(shape) :]
    for key in ("rhs", "coefficient"):
        if cfg.get(key):
            raw[key] = cfg[key]
    raw.update(
        {f"l{n}": e for n, e, o in zip(names, extent, origin) if o == 0 or not cfg.get("rhs")}
    )
    if not cfg.get("rhs"):
        raw["case"] = cfg.get("case")
        raw.update(dict(zip((f"n{n}" for n in names), shape)))  # (--n is stored as nx, ny)
    frame, other = cfg.get("frame"), cfg.get("coefficient_frame", -1)
    # --frame sets the frame of both files: frames that differ were each file's last
    if isinstance(frame, int) and frame >= 0 and other in (-1, None, frame):
        raw["frame"] = frame
    raw = {k: v for k, v in raw.items() if v is not None}
    if cfg.get("rhs") and "case" in (cfg.get("given") or []):
        # a --case given with --rhs set only the default --bc, stored as bc
        raw.setdefault("bc", cfg.get("bc"))
        given = [*cfg["given"], "bc"]
        return _replayed({**cfg, "given": given}, raw)
    return _replayed(cfg, raw)


def _parse_toml(path: str, text: bytes, parameters: bool) -> dict[str, Any]:
    """The settings of a TOML ``--config`` file, read from its bytes."""
    try:
        # a byte-order mark (as some Windows editors save UTF-8) was "Invalid statement (at
        # line 1, column 1)", with nothing to see there
        raw = tomllib.loads(text.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ValueError(f"--config: {path!r} is not UTF-8 text, as TOML must be: {e}") from None
    except tomllib.TOMLDecodeError as e:
        ext = os.path.splitext(path)[1].lower()
        other = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}.get(ext)
        hint = (
            f"; --config reads TOML only, not {other}: write the settings as key = value "
            f'lines (nx = 128, output = "run.h5")'
            + (" and the physical ones under [parameters]" if parameters else "")
            if other
            else ""
        )
        raise ValueError(f"--config: {path!r} is not valid TOML: {e}{hint}") from None
    return raw


def _checked_config(
    path: str, raw: dict[str, Any], allowed: tuple[str, ...], parameters: bool
) -> dict[str, Any]:
    """``--config``'s settings, checked: names, spellings and types."""
    spellings: dict[str, list[str]] = {}
    for k in raw:
        spellings.setdefault(k.replace("-", "_"), []).append(k)
    twice = [names for names in spellings.values() if len(names) > 1]
    if twice:  # t-end and t_end are one setting: TOML would keep both, the last one winning
        raise ValueError(
            f"--config: {' and '.join(repr(n) for n in twice[0])} in {path!r} are one setting "
            f"spelled two ways; give it once"
        )
    written = {k.replace("-", "_"): k for k in raw}  # messages name the key as in the file
    raw = {k.replace("-", "_"): v for k, v in raw.items()}
    unknown = sorted(set(raw) - set(allowed) - ({"parameters"} if parameters else set()))
    # (shallow-water's; poisson, without a [parameters] table, has no --resume or --param)
    line_only = COMMAND_LINE_ONLY if parameters else ("overwrite", "config")
    for key in (k for k in unknown if k in line_only):
        # was refused as a typo, with the list of allowed keys to search for it
        hint = {
            "overwrite": "; a run that replaces data should say so where it is run",
            "param": ", or set the parameters in a [parameters] table of this file",
        }.get(key, "")
        raise ValueError(
            f"--config: {written[key]!r} in {path!r} is an option of the command line only: "
            f"give --{key} there{hint}"
        )
    if unknown:
        raise ValueError(
            f"--config: unknown setting(s) {[written[k] for k in unknown]} in {path!r}; allowed: "
            f"{', '.join(allowed)}" + (" and a [parameters] table" if parameters else "")
        )
    params = raw.get("parameters", {})
    if not isinstance(params, dict):
        raise ValueError(f"--config: 'parameters' in {path!r} must be a table [parameters]")
    if params:  # read like --param: wind-stress is wind_stress
        names = [k.replace("-", "_") for k in params]
        twice = sorted({k for k in params if names.count(k.replace("-", "_")) > 1})
        if twice:
            raise ValueError(
                f"--config: {' and '.join(map(repr, twice))} in the [parameters] table of "
                f"{path!r} are one parameter spelled two ways; give it once"
            )
        raw["parameters"] = dict(zip(names, params.values(), strict=True))
    for key, value in raw.items():
        kind = SETTING_TYPES.get(key)
        if kind is not None and not _has_type(value, kind):
            raise ValueError(
                f"--config: {written.get(key, key)} in {path!r} must be {_TYPE_WORDS[kind]}, "
                f"got {value!r} "
                f"({type(value).__name__})"
            )
    return raw


def resolve_settings(
    args: argparse.Namespace, keys: tuple[str, ...] = RUN_KEYS, parameters: bool = True
) -> dict:
    """Merge command line over config file; ``None`` means not given."""
    settings: dict[str, Any] = {"parameters": {}}
    loaded: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        loaded = load_config(args.config, keys, parameters)
        settings.update(loaded)
        # for error messages: an option's bad value may come from the file, not the line
        args._config_settings = {k: v for k, v in loaded.items() if k != "parameters"}
    for pair in EXCLUSIVE:
        given = [k for k in pair if getattr(args, k, None) is not None]
        # the file's pair is refused whatever the command line says: one of its two values
        # is a mistake, which an option given on the line would otherwise hide
        if len(given) == 2 or all(k in loaded for k in pair):
            a, b = (f"--{k.replace('_', '-')}" for k in pair)
            where = "on the command line" if len(given) == 2 else f"in --config {args.config!r}"
            raise ValueError(
                f"{a} and {b} exclude each other ({a} fixes the step, {b} chooses it as a "
                f"fraction of the stability limit): give one of them, not both {where}"
            )
        for key in given:  # one on the command line overrides the other from the config
            for other in pair:
                if other != key:
                    settings.pop(other, None)
    for key in keys:
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    given_params: dict = {}
    for key, value in getattr(args, "param", None) or []:
        # a second --param of the name (mean-depth or mean_depth) with another value would
        # silently replace the first: one of the two is a mistake, and the run says which
        if key in given_params and not _same_value(given_params[key], value):
            raise ValueError(
                f"parameter {key} (--param) given twice, as {given_params[key]!r} and "
                f"{value!r}: give it once"
            )
        given_params[key] = value
        settings["parameters"][key] = value
    # --n sets nx and ny unless those are given themselves (command line before config);
    # "_given_as" keeps the option the user gave for them, for messages about them.
    n = settings.pop("n", None)
    if n is not None:
        n = _positive_number("--n", n, integer=True)
        for key in ("nx", "ny"):
            if getattr(args, key, None) is None and (args.n is not None or key not in settings):
                settings[key] = n
                settings.setdefault("_given_as", {})[key] = f"--n {n!r}"
    return settings


def _same_value(a, b) -> bool:
    """Two --param values that are the same setting: equal and of the same kind (50 and 50.0
    alike, a number and a bool not)."""
    return (
        type(a) is type(b)
        and a == b
        or (
            isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and not isinstance(a, bool)
            and not isinstance(b, bool)
            and a == b
        )
    )


def _config_hint(args: argparse.Namespace, message: str) -> str:
    """`` (from nx = -4 in --config 'run.toml')`` when ``message`` starts with an option
    (``--nx must be ...``, or ``--resume continues ...; --nx 24 differs ...``) whose value
    came from the config file, else ``''``: the message names the option, which the user
    did not type."""
    m = re.match(r"(?:--resume continues .*?; )?--([a-z][a-z0-9-]*)\b", message)
    from_config = getattr(args, "_config_settings", None) or {}
    if m is None or " in --config " in message:  # it names the file already
        return ""
    key = m.group(1).replace("-", "_")
    if key not in from_config or getattr(args, key, None) is not None:
        return ""
    return f" (from {key} = {from_config[key]!r} in --config {args.config!r})"


def _parse_devices(text: str) -> int | tuple[int, ...]:
    parts = text.strip().lower().split("x")
    value = None
    if all(re.fullmatch(r"[0-9]+", p) for p in parts):  # not int()'s "1_0", "+4"
        value = tuple(int(p) for p in parts) if len(parts) > 1 else int(parts[0])
    parts = value if isinstance(value, tuple) else (value,)
    if value is None or any(p < 1 for p in parts):
        raise argparse.ArgumentTypeError(
            f"--devices takes a count like 4 or a layout like 2x2 of positive integers, "
            f"got {text!r}"
        )
    return value


def _devices_setting(value) -> int | tuple[int, ...]:
    """``--devices`` from the command line or a config file (``4``, ``"2x2"``, ``[2, 2]``):
    a positive count or a layout of positive counts."""
    if value is None:
        return 1
    if isinstance(value, str):
        try:
            return _parse_devices(value)
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None
    parts = value if isinstance(value, (list, tuple)) else (value,)
    if not parts or not all(_is_int(p) and p >= 1 for p in parts):
        raise ValueError(
            f"--devices takes a count like 4 or a layout like 2x2 of positive integers, "
            f"got {value!r}"
        )
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _layout(devices, ndim: int = 2) -> tuple[int, ...]:
    """A ``--devices`` setting as a layout: ``4``, ``"2x2"`` and ``[2, 2]`` are one layout
    (make_mesh's for a count, on a grid of `ndim` axes: 4 is 1x2x2 in 3-D)."""
    from .parallel._mesh import _default_layout

    v = _devices_setting(devices)
    return tuple(v) if isinstance(v, (tuple, list)) else _default_layout(int(v), ndim)


def _check_devices_divide(devices, shape: tuple[int, ...]) -> None:
    """Refuse a ``--devices`` setting that cannot split a grid of `shape` evenly, before
    jax starts: on a CPU the command simulates every device asked for, and a mistyped
    ``--devices 1000000`` took minutes and tens of GiB to be told that it does not divide
    the grid; a layout of the wrong length (``100x100`` for a 3-D grid), 74 s and 1.3 GB to
    be told so by ``make_mesh``, gets its message here."""
    from .grids import Grid

    value = _devices_setting(devices)
    if isinstance(value, (tuple, list)) and len(value) != len(shape):  # make_mesh's words
        axes = "z×y×x" if len(shape) == 3 else "y×x"
        raise ValueError(
            f"--devices {_shown_devices(value)}: a device layout needs {len(shape)} positive "
            f"entries, one per grid axis ({axes}), got {tuple(value)}"
        )
    n = math.prod(value) if isinstance(value, (tuple, list)) else value
    cells = math.prod(shape)
    if n > cells:
        grid = "×".join(map(str, shape))
        raise ValueError(
            f"--devices {_shown_devices(value)}: {n} devices for a grid of {grid} = {cells} "
            f"cells; each device takes a block of at least one cell: give fewer devices or a "
            f"larger grid"
        )
    layout = _layout(value, len(shape))  # (a count's, after the check above: not 10^12)
    names = ("z", "y", "x")[3 - len(shape) :]
    try:  # the grid's own check (no jax backend needed): the split is even
        Grid(shape, (1.0,) * len(shape), dtype="float32").on_mesh(names, layout)
    except ValueError as e:
        raise ValueError(f"--devices {_shown_devices(value)}: {e}") from None


def _shown_devices(devices) -> str:
    return "x".join(str(d) for d in devices) if isinstance(devices, (tuple, list)) else str(devices)


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text or not text.split("=", 1)[0].strip():  # "=9.81" names nothing
        raise argparse.ArgumentTypeError(f"--param takes NAME=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        try:  # numbers TOML does not write but --dt takes: .5, 5., 1.e-4
            parsed = float(value)
        except ValueError:
            parsed = value
    return key.strip().replace("-", "_"), parsed


def setup_jax(precision: str, devices) -> None:
    """Enable float64 and, on a CPU host, simulate the devices asked for. Must run before
    jax initialises its backend."""
    if precision not in ("float32", "float64"):
        raise ValueError(f"--precision must be float32 or float64, got {precision!r}")
    n = math.prod(devices) if isinstance(devices, (tuple, list)) else devices
    n = 1 if n is None else n
    if not _is_int(n) or n < 1:
        raise ValueError(f"--devices must be a positive count or layout, got {devices!r}")
    flags = os.environ.get("XLA_FLAGS", "")
    option = "--xla_force_host_platform_device_count"
    given = re.search(option + r"=([0-9]+)", flags)
    if n > 1 and given is None:
        os.environ["XLA_FLAGS"] = f"{flags} {option}={n}".strip()
    elif n > 1 and int(given.group(1)) < n:  # --devices asks for more: it wins
        os.environ["XLA_FLAGS"] = flags.replace(given.group(0), f"{option}={n}")
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


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def _check_plot_path(
    path: str | None, option: str = "--plot", output: str | None = None, what: str = "output"
) -> None:
    """A writable ``.png`` path that is neither the data file `output` nor any existing
    file other than a PNG (the picture would replace it)."""
    if path is None:
        return
    from .io import check_writable

    if not path.lower().endswith(".png"):
        raise ValueError(f"{option} must name a .png file, got {path!r}")
    if output is not None and _same_file(path, output):
        raise ValueError(
            f"{option} {path!r} is the {what} file itself; the picture would replace the "
            "data: give it its own name"
        )
    if os.path.isfile(path) and not _is_png(path):
        raise ValueError(
            f"{option} {path!r} exists and is not a PNG image: physjax replaces only an "
            "earlier picture, never other data; give another name"
        )
    check_writable(path, option)


def _is_png(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def _check_not_the_config(output: str, config: str | None, overwrite: bool) -> None:
    """A new run (or solve) given the settings of an output file by ``--config`` does not
    replace that file without ``--overwrite`` (a default ``--output`` is the same name when
    the file kept its default name)."""
    if (
        config is not None
        and not overwrite
        and os.path.isfile(output)
        and os.path.isfile(config)
        and os.path.samefile(output, config)
    ):
        raise ValueError(
            f"--output {output!r} is the file that --config reads its settings from: give "
            "the new run another --output (or --overwrite to replace it)"
        )


def _check_output_name(output: str) -> None:
    """The data file is not named like a picture (``physjax plot`` would draw over it)."""
    if output.lower().endswith(".png"):
        raise ValueError(
            f"--output {output!r} names the NetCDF4/HDF5 data file, not a picture; give it "
            "a name like out.h5 and the picture to --plot"
        )


def _write_plot(path: str, plot: str, option: str = "--plot", **kwargs) -> None:
    """Draw the quick-look PNG; a write that fails despite the check names the option."""
    from ._plot import plot_panels

    try:
        plot_panels(path, plot, **kwargs)
    except OSError as e:
        raise ValueError(f"{option} {plot!r} could not be written: {e}") from None


def _plot_written(output: str, plot: str, what: str) -> None:
    """Draw a run's (or solve's) ``--plot`` once its data file is written. A picture that
    cannot be drawn (a full disk, its folder removed during the run) stopped the command with
    only "--plot … could not be written": nothing said that the data was written and whole.
    The error now says so (`what`: the file's state) and how to draw the picture again."""
    again = f"physjax plot {shlex.quote(output)} --output {shlex.quote(plot)}"
    try:
        _write_plot(output, plot)
    except ValueError as e:
        e.add_note(f"{output} is written and kept ({what}); draw the picture again with: {again}")
        raise
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM while drawing: the data is whole
        e.add_note(
            f"{output} is written and kept ({what}); {plot} was not drawn; draw it with: {again}"
        )
        raise


def _record_of(writer, step0: int) -> tuple[int, int]:
    """The whole frames of a stopped run's file and the step of its last (``step0`` when it
    has none), read through the run's own writer, whose file-locking flags an open handle
    of this process must share."""
    frames, last = writer.frames()
    return frames, step0 if last is None else last


#: Seconds between progress-bar updates when stderr is not a terminal (a batch log).
LOG_PROGRESS_SECONDS = 30.0


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _report(text: str, out) -> None:
    """A run's closing line. The file is the record: a stdout that cannot take the line (a
    log on a full disk or over its quota, a pipe whose reader has gone) does not turn a
    finished run into a failed command (what stays buffered is dropped by run_command)."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=out, flush=True)


class _ProgressStream:
    """The stream a run's progress bar writes to (stderr). The bar is a convenience and the
    file the record: where stderr cannot be written — a log on a full disk or over its
    quota, stderr closed (``2>&-``: ``sys.stderr`` is ``None``) — the bar goes quiet for the
    rest of the run instead of stopping it (tqdm itself forgives only a terminal gone away,
    errno 5, and fails on a stderr of ``None``)."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = stream is None

    def write(self, text: str) -> None:
        if not self.broken:
            try:
                self._stream.write(text)
            except (OSError, ValueError):  # ValueError: a closed file
                self.broken = True

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        return _is_terminal(self._stream)

    def __getattr__(self, name):  # encoding, fileno (the terminal's width)
        if name == "_stream":  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self._stream, name)


def _note(text: str) -> None:
    """A line on stderr (a note, a header, a warning) that, like the progress bar, is dropped
    where stderr cannot be written (a full log, ``2>&-``) instead of stopping the command,
    and never goes to stdout in its place (``print(file=None)`` writes there)."""
    stream = _ProgressStream(sys.stderr)
    # From a signal handler (a stop's notice) that interrupted a write to stderr blocked on
    # a full pipe or a paused terminal, the write re-enters the stream's buffer, which
    # raises RuntimeError ("reentrant call"): the notice is dropped, the stop goes on.
    with contextlib.suppress(RuntimeError):
        stream.write(f"{text}\n")
        stream.flush()


#: Signals that end a run at once, keeping its frames: SIGTERM (a batch system's time limit,
#: ``kill``) and SIGHUP (the terminal closed under a run started without ``nohup``).
_TERMINATING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class _StopRequest:
    """While active (in the main thread), a first Ctrl-C (SIGINT) only asks the run to stop
    at the next frame boundary, so that it never lands inside a write; a second one raises
    ``KeyboardInterrupt`` at once. A SIGTERM (a batch system's time limit, ``kill``) or a
    SIGHUP (the terminal closed) stops at once like a second Ctrl-C: what follows a SIGTERM
    is usually a SIGKILL a few seconds later, too soon to finish a frame. Calling the object
    tells whether a stop was asked for."""

    def __init__(self):
        self.requested = False
        self._previous = None
        self._previous_term = None
        self._installed = False
        self._deferred = False

    def defer(self, on: bool) -> None:
        """While on, a SIGTERM, SIGHUP or second Ctrl-C only asks for a stop, as a first
        Ctrl-C does, instead of raising: for the moment between marking a file running and
        the run's own handling of a stop, which then stops at once, recording the file."""
        self._deferred = on

    def __call__(self) -> bool:
        return self.requested

    def shield(self) -> None:
        """Ignore Ctrl-C, SIGTERM and SIGHUP from now until the context ends: the few file
        operations that record an interrupted run must not be cut short themselves."""
        if self._installed:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for signum in _TERMINATING:
                signal.signal(signum, signal.SIG_IGN)

    def _terminate(self, signum, frame):
        # Also asked as a stop at the next frame: an exception raised while Python runs a
        # garbage-collector or weakref callback (jax has some) is dropped, not propagated;
        # `_unraisable` keeps that from printing a traceback.
        self.requested = True
        name = signal.Signals(signum).name
        _note(f"\nterminated ({name}): stopping now")
        if not self._deferred:
            raise KeyboardInterrupt

    def _handle(self, signum, frame):
        if self.requested:
            if not self._deferred:
                raise KeyboardInterrupt
            return
        self.requested = True
        _note("\nstopping after the frame in hand (Ctrl-C again to stop at once)")

    def _unraisable(self, args):
        # The KeyboardInterrupt of a stop that Python could not raise (it landed in a
        # callback) is no error: the run stops at the next frame. Anything else is reported.
        if self.requested and args.exc_type is KeyboardInterrupt:
            return
        self._previous_hook(args)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._previous_term = {s: signal.signal(s, self._terminate) for s in _TERMINATING}
            self._previous_hook = sys.unraisablehook
            sys.unraisablehook = self._unraisable
            self._installed = True
        return self

    def __exit__(self, *exc):
        if self._installed:
            previous = self._previous
            signal.signal(
                signal.SIGINT, signal.default_int_handler if previous is None else previous
            )
            for signum, previous in self._previous_term.items():
                signal.signal(signum, signal.SIG_DFL if previous is None else previous)
            sys.unraisablehook = self._previous_hook
        return False


class _OneFile(argparse.Action):
    """An option given at most once: a second ``--config`` was taken instead of the first,
    which was silently dropped (config files do not layer)."""

    def __call__(self, parser, namespace, values, option_string=None):
        earlier = getattr(namespace, self.dest, None)
        if earlier is not None:
            raise argparse.ArgumentError(
                self,
                f"given twice ({earlier!r} and {values!r}); give one file (options on the "
                "command line override its settings)",
            )
        setattr(namespace, self.dest, values)


def add_run_options(p: argparse.ArgumentParser, cases: list[str], default_case: str) -> None:
    """The options every run subcommand shares."""
    p.add_argument(
        "--case", choices=None, help=f"one of: {', '.join(cases)} (default {default_case})"
    )
    p.add_argument("--nx", type=int, help="cells in x (default: the case's)")
    p.add_argument("--ny", type=int, help="cells in y (default: the case's)")
    p.add_argument(
        "--n", type=int, help="cells in x and y (sets both, except one given by --nx or --ny)"
    )
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
    p.add_argument("--precision", metavar="{float32,float64}", help="float32 (default) or float64")
    p.add_argument(
        "--devices",  # checked with the config file's value, for one-line errors
        help="devices to split the grid over: a count (4) or layout (2x2)",
    )
    p.add_argument("--output", help="NetCDF4/HDF5 output file (default <case>.h5)")
    p.add_argument("--plot", help="quick-look PNG of the last frame")
    p.add_argument(
        "--config",
        action=_OneFile,
        help="TOML file of settings and a [parameters] table, or the .h5 file of an earlier "
        "run, whose settings are rerun",
    )
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
        "--overwrite",
        action="store_true",
        help="replace an existing --output whatever it holds: an unfinished run, a physjax "
        "poisson file, a file physjax did not write (a shallow-water run that ended, complete "
        "or failed, is replaced without it)",
    )
    p.add_argument(
        "--max-frames",
        dest="max_frames",
        type=int,
        help="stop (resumably) after writing this many frames after the first (frame 0, "
        "the initial state, is not counted; on --resume: this many more)",
    )
    p.add_argument(
        "--no-cfl-check",
        dest="cfl_check",
        action="store_false",
        default=None,
        help="run even if --dt exceeds the estimated stability limit",
    )
    p.add_argument("--quiet", action="store_true", default=None, help="no progress bar")


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


#: Settings given with ``--resume`` that may differ from the stored run.
_RESUME_FREE = ("output", "plot", "parameters", "max_frames", "quiet")


def _check_resume_settings(
    given: dict, stored: dict, output: str, defaults: dict, given_as: dict | None = None
) -> None:
    """A run continues with the configuration stored in its file: a setting given with
    ``--resume`` (other than ``--output``, ``--plot``, ``--max-frames``, ``--quiet`` and
    ``--devices``, a new layout) must not differ from it. A ``--dt`` is compared with the
    one asked for when the run began. `given_as` names the option a setting came from
    where it is not its own (``--n 32`` for ``nx`` and ``ny``)."""

    def same(a, b):
        norm = lambda v: list(v) if isinstance(v, (tuple, list)) else v  # noqa: E731
        return norm(a) == norm(b)

    for key, value in given.items():
        if key in _RESUME_FREE or key == "devices" or value is None:
            continue  # another device layout is allowed (see run_shallow_water)
        was = stored.get(key)
        if key == "dt" and stored.get("dt_requested") is not None:
            was = stored["dt_requested"]
        elif key == "dt" and stored.get("cfl") is not None:  # a run that chose its dt
            raise ValueError(
                f"--resume continues {output!r} with the configuration stored in it; "
                f"--dt {value!r} differs from the stored run, which chose dt from --cfl "
                f"{stored['cfl']!r} (leave it out, or start a new run)"
            )
        differs = not same(value, was)
        if key not in stored or differs:
            if key == "cfl_check":
                option = "--no-cfl-check" if not value else "a CFL check"
                was = "the stored run, which checked dt" if was else "the stored --no-cfl-check"
            elif key == "cfl" and was is None:
                option = f"--cfl {value!r}"
                was = (
                    f"the stored run, which was given --dt {stored['dt_requested']!r}"
                    if stored.get("dt_requested") is not None
                    else f"the stored dt {stored.get('dt')!r} (the file records no --cfl)"
                )
            elif key in (given_as or {}):  # --n 32: the stored grid, both sizes
                option = given_as[key]
                was = f"the stored --nx {stored.get('nx')!r} --ny {stored.get('ny')!r}"
            else:
                option = f"--{key.replace('_', '-')} {value!r}"
                was = f"the stored {was!r}" if key in stored else f"the stored run (no {key})"
            raise ValueError(
                f"--resume continues {output!r} with the configuration stored in it; "
                f"{option} differs from {was} (leave it out, or start a new run)"
            )
    stored_params = {**defaults, **(stored.get("parameters") or {})}
    for key, value in (given.get("parameters") or {}).items():
        if key not in stored_params or not same(value, stored_params[key]):
            raise ValueError(
                f"--resume continues {output!r} with the configuration stored in it; "
                f"parameter {key}={value!r} differs from the stored "
                f"{stored_params.get(key, 'default')!r} (leave it out, or start a new run)"
            )


#: Grid-sized arrays a CPU run holds at once, about: the state, the stages and tendencies of a
#: step, the model's fields, the copies written out, the case's float64 set-up.
_FIELDS_IN_MEMORY = 24


def _check_memory(
    nx: int,
    ny: int,
    precision: str,
    nz: int | None = None,
    what: str = "run",
    options: str | None = None,
) -> None:
    """Refuse, before anything is allocated, a grid whose run (or solve) cannot fit in this
    machine's memory (CPU only: on an accelerator the fields live in its own memory).
    `options` names what set the grid's size (default: ``--nx … --ny …``)."""
    import jax

    if jax.default_backend() != "cpu":
        return
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    cells = nx * ny * (nz or 1)
    need = _FIELDS_IN_MEMORY * cells * (4 if precision == "float32" else 8)
    if need > total:
        options = options or f"--nx {nx} --ny {ny}" + (f" --nz {nz}" if nz else "")
        shape = "×".join(str(n) for n in (nz, ny, nx) if n)
        raise ValueError(
            f"{options}: a {precision} {what} of {shape} cells needs about "
            f"{need / 2**30:.3g} GiB of memory, more than this machine's "
            f"{total / 2**30:.3g} GiB; choose a smaller grid"
        )


#: The most steps one run takes: step counts are 32-bit integers when float64 is off.
MAX_STEPS = 2**31 - 1


def _check_step_count(
    steps: float,
    given: str,
    t_end: float,
    hint: str = "raise it or shorten --t-end",
    end: str | None = None,
) -> None:
    """Refuse more steps than a run can count; `steps` may be a ratio that overflowed to
    inf (a --t-end of 1e308, a --dt of 5e-324), which ``math.ceil`` would not take. `end`
    says where an end time not given as --t-end came from."""
    if not steps <= MAX_STEPS:
        end = f"--t-end {t_end:g} s" if end is None else end
        raise ValueError(
            f"{given} takes {steps:.3g} steps to {end}, more than the "
            f"{MAX_STEPS} a run can count; {hint}"
        )


def _default_end(case) -> str:
    """The end time of a run given no --t-end, as the step-count error names it: the case's
    default, and for zonal-jet the coriolis it comes from."""
    text = f"the case's default end time {case.t_end:g} s ("
    if case.name == "zonal-jet":
        f = case.parameters["coriolis"]
        text += f"10 inertial periods, 20*pi/|coriolis| with coriolis = {f:g}; "
    return text + "no --t-end given)"


def _steps(t_end: float, dt: float) -> tuple[int, float]:
    """Steps to reach ``t_end`` with a step of at most ``dt``, and the step that lands the last
    frame exactly on ``t_end``: ``dt`` itself when it divides ``t_end`` (to 1e-9), else
    ``t_end / n`` with ``n = ceil(t_end / dt)``."""
    n = max(1, math.ceil(t_end / dt - 1e-9))
    if abs(n * dt - t_end) <= 1e-9 * t_end:
        return n, dt
    return n, t_end / n


def _check_overwrite(output: str, overwrite: bool, command: str = "shallow-water") -> str | None:
    """A new run replaces an existing ``output`` only if it holds a run of the same
    ``command`` that ended (``complete`` or ``failed: …``), or with ``--overwrite``: an
    unfinished run is what ``--resume`` continues, a file physjax did not write may be
    someone's data, and another command's results are most likely a clash of file names.
    A run replaced without ``--overwrite`` is named on stderr (the default output
    ``<case>.h5`` makes it easy to replace one unawares): the line is returned, to be
    printed when the file is replaced, after every other setting has been checked."""
    from .io import STATUS_COMPLETE, read_attrs

    if overwrite or not os.path.exists(output):
        return None
    try:
        attrs = read_attrs(output)
    except (ValueError, OSError) as e:  # damaged, truncated, not HDF5, or held by a writer
        from .io._reading import locks_unsupported

        if "file signature not found" in str(e):  # not HDF5: not a physjax file
            attrs = {}
        elif locks_unsupported(e):  # not damaged: no file of this file system opens
            raise ValueError(f"--output {output!r}: {e}") from None
        else:
            raise ValueError(
                f"--output {output!r} exists and {_unreadable(e, output)}; it is left as it "
                f"is. Pass --overwrite to replace it, or give another --output"
            ) from None
    status = attrs.get("status") if "physjax_version" in attrs else None
    if not isinstance(status, str):
        raise ValueError(
            f"--output {output!r} exists and is not a physjax output file; pass --overwrite "
            f"to replace it, or give another --output"
        )
    config = attrs.get("configuration")
    stored = config.get("command") if isinstance(config, dict) else None
    if stored is None:  # poisson files written before they recorded their command
        stored = "poisson" if attrs.get("title") == "physjax poisson" else "(unknown)"
    if status != STATUS_COMPLETE and not status.startswith("failed") and stored == "poisson":
        # a solve has no --resume: one still marked running was killed before it ended
        raise ValueError(
            f"--output {output!r} holds an unfinished poisson solve (status {status!r}: it "
            f"was stopped before it ended); pass --overwrite to replace it, or give another "
            f"--output"
        )
    if status != STATUS_COMPLETE and not status.startswith("failed"):
        raise ValueError(
            f"--output {output!r} holds an unfinished {stored} run (status {status!r}); "
            f"continue it with: physjax {stored} --output {shlex.quote(output)} --resume, "
            f"or pass --overwrite to replace it"
        )
    if stored != command:
        raise ValueError(
            f"--output {output!r} holds the results of physjax {stored} (case "
            f"{attrs.get('case', '?')}, {status}); give this {command} run another --output, "
            f"or pass --overwrite to replace them"
        )
    return f"replacing the {stored} run in {output} (case {attrs.get('case', '?')}, {status})"


def _unreadable(e: BaseException, path: str) -> str:
    """Why ``path`` could not be read, from the error of ``read_attrs``: "is locked …" while
    another process writes it, else "cannot be read: it is damaged or truncated (…)"."""
    from .io._reading import error_text

    if isinstance(e, BlockingIOError):
        return "is locked by another process writing it"
    text = error_text(e)
    for prefix in (f"cannot read {path!r} as a NetCDF4/HDF5 file: ", f"cannot read {path!r}: "):
        text = text.removeprefix(prefix)
    return f"cannot be read: it is damaged or truncated ({text})"


def _unresumable(e: BaseException) -> ValueError:
    """The error of ``--resume`` for a file that cannot be read (nothing written to it)."""
    from .io._reading import locks_unsupported

    if locks_unsupported(e):  # not damaged: no file of this file system opens
        return ValueError(f"--resume: {e}")
    return ValueError(
        f"--resume: {e}; the file is damaged or truncated (or not a physjax output file) "
        f"and its run cannot be continued: it is left as it is. Start a new run with another "
        f"--output, or replace it with --overwrite"
    )


#: Settings of a case that the command line sets with options of their own, not --param.
_OPTION_PARAMETERS = {"nx": "--nx", "ny": "--ny", "precision": "--precision", "t_end": "--t-end"}


def _check_parameter_names(params: dict, case_name: str) -> None:
    """Refuse a ``--param`` (or ``[parameters]`` entry) that is a run setting, naming the
    option to give instead, or that is not a parameter of the case, listing those it has."""
    from .solvers.shallow_water import CASES

    for key in params:  # a run setting, e.g. one a config file gives below [parameters]
        if key in _OPTION_PARAMETERS or key in RUN_KEYS:
            option = _OPTION_PARAMETERS.get(key) or (
                "--no-cfl-check" if key.endswith("cfl_check") else f"--{key.replace('_', '-')}"
            )
            raise ValueError(
                f"parameter {key} (--param, or the [parameters] table of --config): {key} is "
                f"not a physical parameter here; set it with {option} (or {key} at the top of "
                "a --config file, above [parameters])"
            )
    defaults = CASES[case_name].defaults
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        allowed = ", ".join(sorted(k for k in defaults if k not in _OPTION_PARAMETERS))
        raise ValueError(
            f"unknown parameter(s) {unknown} (--param, or the [parameters] table of "
            f"--config) for case {case_name!r}; allowed: {allowed}"
        )


def run_shallow_water(
    settings: dict,
    *,
    resume: bool = False,
    overwrite: bool = False,
    max_frames: int | None = None,
    quiet: bool = False,
    no_plot: bool = False,
    out=None,
) -> dict:
    """Run a shallow-water case from resolved settings; returns a summary dict.

    All settings are validated, the case built and ``dt`` checked before the output file is
    created or anything compiled. A Ctrl-C stops the run between frames: the file keeps its
    whole frames and the status ``interrupted: …``, and [`physjax._runner.RunInterrupted`][]
    is raised. The output is locked against a second physjax process for the whole run.
    """
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other: give one of them")
    with contextlib.ExitStack() as held:
        return _run_shallow_water(
            settings,
            held,
            resume=resume,
            overwrite=overwrite,
            max_frames=max_frames,
            quiet=quiet,
            no_plot=no_plot,
            out=out,
        )


def _run_shallow_water(
    settings: dict,
    held: contextlib.ExitStack,
    *,
    resume: bool,
    overwrite: bool,
    max_frames: int | None,
    quiet: bool,
    no_plot: bool,
    out,
) -> dict:
    out = sys.stdout if out is None else out
    settings = dict(settings)
    given_as = settings.pop("_given_as", None) or {}
    config_file = settings.pop("_config_file", None)
    given = sorted(
        k
        for k, v in settings.items()
        if k != "parameters" and v is not None and not k.startswith("_")
    )
    if max_frames is not None:
        max_frames = _positive_number("--max-frames", max_frames, integer=True)
    _devices_setting(settings.get("devices"))  # also where nothing runs (a complete file)
    if no_plot and settings.get("plot") is not None:
        raise ValueError("--plot and --no-plot exclude each other: give one of them")
    plot_stored = False  # the picture is the --plot stored in the file being resumed
    relayout = None  # (the run's layout, the layout it continues on)
    reversion = None  # (the physjax version the run began with, this one), when they differ
    moved_before = False  # an earlier --resume of the file went on on another layout
    recorded = None  # the physical parameters the file records, when resuming
    output = settings.get("output")
    if output == "":
        raise ValueError("--output must name a file, got ''")
    if resume:
        if not output:
            raise ValueError("--resume needs --output naming the file to continue")
        if not os.path.lexists(output):
            raise ValueError(f"--resume: {output!r} does not exist; there is no run to continue")
        if not os.path.exists(output):  # a link to nothing: not "damaged or truncated"
            raise ValueError(
                f"--resume: {output!r} is a symbolic link to {os.readlink(output)!r}, which does "
                f"not exist; there is no run to continue"
            )
        if os.path.exists(output) and not (os.path.isfile(output) or os.path.isdir(output)):
            # a device or socket holds no run; a named pipe, opened, would wait for a writer
            raise ValueError(
                f"--resume: {output!r} is not a regular file (a device, pipe or socket), so "
                f"holds no run to continue; give the run's file as --output"
            )
        from .io import output_lock, read_attrs
        from .solvers.shallow_water import CASES

        held.enter_context(output_lock(output))
        try:  # no physjax run writes it (the lock is held): an error that lasts
            attrs = read_attrs(output)
        except (ValueError, OSError) as e:
            raise _unresumable(e) from None
        stored = attrs.get("configuration")
        if not isinstance(stored, dict) or stored.get("command") != "shallow-water":
            raise ValueError(f"--resume: {output!r} was not written by physjax shallow-water")
        recorded = attrs.get("parameters")
        case = CASES.get(stored.get("case"))
        if case is not None:  # a run setting or an unknown name: as for a new run
            _check_parameter_names(settings.get("parameters") or {}, stored["case"])
        _check_resume_settings(settings, stored, output, case.defaults if case else {}, given_as)
        if attrs.get("status") == "complete":
            plot = settings.get("plot")
            _check_plot_path(plot, output=output)
            if plot:
                _write_plot(output, plot)
            plot_note = f"; drew its last frame to {plot}" if plot else ""
            _report(f"{output} is already complete; nothing to resume{plot_note}", out)
            return {"output": output, "frames": attrs["n_frames"], "resumed": False}
        status = attrs.get("status")
        if isinstance(status, str) and status.startswith("failed"):
            raise ValueError(
                f"--resume: the run in {output!r} failed ({status}); continuing it would "
                f"repeat the same steps and fail again. Start a new run, e.g. with a smaller "
                f"--dt or --cfl"
            )
        given_devices = settings.get("devices")
        plot = settings.get("plot")
        plot_stored = plot is None and not no_plot and stored.get("plot") is not None
        plot = stored.get("plot") if plot_stored else plot
        settings = {**stored, "output": output, "plot": plot}
        moved_before = "where the run began on" in str(attrs.get("history") or "")
        if given_devices is not None and _layout(given_devices) != _layout(stored.get("devices")):
            # Continuing on another machine: the stencils are the same on every layout, but
            # XLA compiles each layout's program on its own, so from here on the frames
            # equal an uninterrupted run's to round-off, not bit for bit. The file says so.
            relayout = (_layout(stored.get("devices")), _layout(given_devices))
            settings["devices"] = given_devices
        from . import __version__

        if attrs.get("physjax_version") not in (None, __version__):
            reversion = (attrs["physjax_version"], __version__)

    # an empty string is not "no setting": it is refused below like any unknown value
    case_name = settings.get("case")
    case_name = "geostrophic-adjustment" if case_name is None else case_name
    if case_name not in SW_CASE_NAMES:  # a mistyped setting is answered before any import
        raise ValueError(
            f"--case: unknown case {case_name!r}; choose one of {', '.join(SW_CASE_NAMES)}"
        )
    precision = settings.get("precision")
    precision = "float32" if precision is None else precision
    devices = _devices_setting(settings.get("devices"))
    kw = {}
    for key in ("nx", "ny"):
        if settings.get(key) is not None:
            kw[key] = _positive_number(f"--{key}", settings[key], integer=True)
    from .io import (
        STATUS_INTERRUPTED,
        STATUS_STOPPED,
        NetCDFWriter,
        OutputSpaceError,
        check_writable,
        output_lock,
        read_attrs,
        read_frame,
    )
    from .solvers.shallow_water import CASES

    shape = CASES[case_name].shape
    _check_devices_divide(devices, (kw.get("ny", shape[0]), kw.get("nx", shape[1])))
    setup_jax(precision, devices)

    import jax
    import jax.numpy as jnp

    from ._runner import RunInterrupted, SimulationBlewUp, _format_time, drive, to_numpy
    from ._runner import _all_finite as all_finite
    from .parallel import make_mesh, shard
    from .solvers.shallow_water import make_case

    params = dict(settings.get("parameters") or {})
    _check_parameter_names(params, case_name)
    _check_memory(
        kw.get("nx", CASES[case_name].shape[1]), kw.get("ny", CASES[case_name].shape[0]), precision
    )
    try:
        case = make_case(case_name, precision=precision, **kw, **params)
    except (TypeError, ValueError) as e:
        text = str(e)
        # the model's own checks name a parameter bare ("gravity must be > 0 …"): one given
        # with --param is named as a parameter, and where it came from, too
        if any(text.startswith(f"{k} ") for k in params):
            text = f"parameter {text}"
        if text.startswith("parameter "):  # name where the value came from
            raise type(e)(f"{text} (--param, or the [parameters] table of --config)") from None
        raise
    model, state = case.model, case.state
    grid = model.grid
    if resume and settings.get("scheme") not in (None, model.scheme):
        # stored, but not an option of the command: a file of another physjax version
        raise ValueError(
            f"--resume: the run in {output!r} was stepped with the time scheme "
            f"{settings['scheme']!r}, and this physjax's shallow-water command steps with "
            f"{model.scheme!r}: continuing it would not give the run's result. The file is "
            f"left as it was; continue it with the physjax that began it"
        )

    if resume and isinstance(recorded, dict):
        # the configuration stores the --param overrides only, the case's defaults filling
        # in the rest: the values the run began with are in its `parameters`
        changed = [
            (k, recorded[k], v)
            for k, v in case.parameters.items()
            if k in recorded and k != "t_end" and recorded[k] != v  # t_end: the run's own
        ]
        if changed:
            listed = ", ".join(f"{k} = {was!r}, where it now has {v!r}" for k, was, v in changed)
            raise ValueError(
                f"--resume: the run in {output!r} began with {listed} (this physjax's "
                f"default for case {case_name!r}, with the run's --param): continuing it would "
                f"not give the run's result. The file is left as it was; continue it with the "
                f"physjax that began it"
            )
    t_end = (
        case.t_end
        if settings.get("t_end") is None
        else _positive_number("--t-end", settings["t_end"])
    )
    end = _default_end(case) if settings.get("t_end") is None else None
    cfl_check = settings.get("cfl_check")
    cfl_check = True if cfl_check is None else bool(cfl_check)
    dt_requested = cfl = None
    if settings.get("dt") is not None:
        dt_requested = _positive_number("--dt", settings["dt"])
        _check_step_count(t_end / dt_requested, f"--dt {dt_requested:g} s", t_end, end=end)
        n_steps, dt = _steps(t_end, dt_requested)
        if cfl_check:  # the step taken: a --dt beyond --t-end is lowered to it
            try:
                model.check_dt(state, dt)
            except ValueError as e:
                if dt == dt_requested:
                    raise
                raise ValueError(
                    f"--dt {dt_requested:g} s, lowered to {dt:.6g} s to end on --t-end "
                    f"{t_end:g} s: {e}"
                ) from None
    else:
        cfl = 0.5 if settings.get("cfl") is None else _positive_number("--cfl", settings["cfl"])
        if cfl > 1:
            raise ValueError(
                f"--cfl must be in (0, 1] (a fraction of the stability limit), got {cfl}"
            )
        ratio = t_end / model.max_stable_dt(state, cfl)
        if not ratio <= MAX_STEPS:  # "raise it" only where --cfl 1 would do
            at_one = t_end / model.max_stable_dt(state, 1.0)
            hint = (
                "raise it (at most 1) or shorten --t-end"
                if at_one <= MAX_STEPS
                else f"shorten --t-end or use fewer cells (--cfl 1 takes {at_one:.3g} steps)"
            )
            _check_step_count(ratio, f"--cfl {cfl:g}", t_end, hint, end=end)
        n_steps = max(1, math.ceil(ratio))
        dt = t_end / n_steps
        if not cfl_check and not resume:  # dt is chosen within the limit: nothing to skip
            _note(
                f"physjax shallow-water: note: --no-cfl-check has no effect without --dt: "
                f"dt is chosen as --cfl {cfl:g} of the stability limit"
            )
    tiny = float(np.finfo(np.dtype(grid.dtype)).tiny)
    if dt < tiny:  # rounds to 0 (or a subnormal, flushed to 0) in the run's precision
        given = "--dt" if dt_requested is not None else "--t-end"
        raise ValueError(
            f"{given} {dt_requested if dt_requested is not None else t_end:g} s gives a step "
            f"of {dt:.3g} s, below the smallest normal {np.dtype(grid.dtype).name} number "
            f"({tiny:.3g}): the run would not advance; lengthen it"
            + (" or use --precision float64" if np.dtype(grid.dtype).itemsize < 8 else "")
        )
    if resume and settings.get("n_steps") is not None:
        # The step and step count the run began with, exactly as stored: files written before
        # a --dt was lowered to land on --t-end ran ceil(t_end / dt) steps of the dt given.
        n_steps, dt = int(settings["n_steps"]), float(settings["dt"])
        dt_requested = settings.get("dt_requested", dt)
        cfl = settings.get("cfl")
    save_every = settings.get("save_every")
    save_every = (
        math.ceil(n_steps / 20)  # at most 20 frames after the initial one, at least 11
        if save_every is None
        else _positive_number("--save-every", save_every, integer=True)
    )

    mesh = None
    if devices != 1:
        n_dev = math.prod(devices) if isinstance(devices, (tuple, list)) else int(devices)
        try:
            mesh = make_mesh(
                tuple(devices) if isinstance(devices, (tuple, list)) else n_dev, ndim=2
            )
            model.check_mesh(mesh)  # the mesh divides the grid, walls keep 2 cells per device
        except ValueError as e:
            hint = ""
            if resume and relayout is None and mesh is None:  # fewer devices than it began on
                hint = (
                    f". The run began on this layout; to continue it on the devices there "
                    f"are, give them: physjax shallow-water --output {shlex.quote(output)} "
                    f"--resume --devices N (the frames then equal an uninterrupted run's to "
                    f"round-off, not bit for bit)"
                )
            raise ValueError(f"--devices {_shown_devices(devices)}: {e}{hint}") from None

    output = output or f"{case_name}.h5"
    _check_output_name(output)
    if not resume:
        _check_not_the_config(output, config_file, overwrite)
    check_writable(output, "--output")
    replacing = None
    if not resume:
        held.enter_context(output_lock(output))
        replacing = _check_overwrite(output, overwrite)
    plot = settings.get("plot")
    try:
        _check_plot_path(plot, output=output)
    except ValueError as e:
        if not (resume and plot_stored):
            raise
        raise ValueError(
            f"{e} (the --plot the run was started with, drawn again on --resume: give another "
            f"--plot, or --no-plot)"
        ) from None
    resolved = {
        "command": "shallow-water",
        # the settings the command was given (command line and --config), which a
        # --config of this file replays
        "given": given,
        "case": case_name,
        "nx": grid.shape[1],
        "ny": grid.shape[0],
        "t_end": t_end,
        "dt": dt,
        "dt_requested": dt_requested,
        "cfl": cfl,  # the fraction of the limit dt was chosen as; None with --dt
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

    @jax.jit
    def healthy(state):  # finite, and a layer thickness that stays positive
        return all_finite(state) & (jnp.min(state.h) > 0)

    def fields_of(state):
        return {
            "h": to_numpy(state.h),
            "u": to_numpy(state.u),
            "v": to_numpy(state.v),
            "zeta": to_numpy(diagnose(state)),
        }

    from tqdm import tqdm

    with _StopRequest() as stop:
        if resume:
            try:
                last = read_frame(output)
            except (ValueError, OSError) as e:
                raise _unresumable(e) from None
            step = float(last["step"])
            if not (0 <= step <= n_steps and step.is_integer()):  # a damaged file
                raise ValueError(
                    f"--resume: the last frame of {output!r} is at step {last['step'].item()!r}, "
                    f"not one of its run's steps (0 to {n_steps}): the file's 'step' variable "
                    f"is damaged; start a new run (--overwrite)"
                )
            try:  # before the file is touched: a frame no run can continue from is refused
                state = model.initial_state(last["h"], last["u"], last["v"])
            except ValueError as e:
                raise ValueError(
                    f"--resume: the last frame of {output!r} (step {int(last['step'])}) is not "
                    f"a state the run can continue from: {e}"
                ) from None
            step0 = int(last["step"])
            history = f"resumed at step {step0} (t = {step0 * dt:.6g} s)"
            if relayout is not None:
                history += (
                    f" on devices {_shown_devices(relayout[1])}, where the run began on "
                    f"{_shown_devices(relayout[0])}: from here the frames equal an "
                    f"uninterrupted run's to round-off, not bit for bit"
                )
            elif moved_before:  # back on the run's own layout after a part on another one
                history += (
                    f" on devices {_shown_devices(_layout(settings.get('devices')))}, the "
                    f"layout the run began on (an earlier part ran on another)"
                )
            if reversion is not None:
                history += (
                    f" with physjax {reversion[1]}, where the run began with {reversion[0]}: "
                    f"from here the frames may differ from an uninterrupted run's"
                )
            frames_before = read_attrs(output)["n_frames"]
            # reopen marks the file running: a signal from here until the run handles a
            # stop itself would leave it so, with no word of it; the stop waits for that
            stop.defer(True)
            writer = NetCDFWriter.reopen(output, grid, variables, history=history)
            if relayout is not None or reversion is not None:
                _note(f"physjax: {output}: {history}")
        else:
            # Frame 0 before the file: its first compile takes a moment, where a SIGTERM or
            # a second Ctrl-C removed the new file after it had replaced an ended run.
            first = fields_of(state)
            bottom = np.zeros(grid.shape) if model.bottom is None else to_numpy(model.bottom)
            if stop():  # a first Ctrl-C while frame 0 was computed: nothing written yet
                kept = "left as it was" if os.path.lexists(output) else "not created"
                raise RunInterrupted(0, 0.0, 0, f" before its initial frame; {output} {kept}")
            if replacing:
                _note(replacing)
            writer = NetCDFWriter(
                output,
                grid,
                variables,
                attrs={
                    "title": f"physjax shallow-water: {case.description}",
                    "case": case_name,
                    # the run's end time, not the case's default
                    "parameters": {**case.parameters, "t_end": t_end},
                    "configuration": resolved,
                },
            )
            try:  # a file stopped before its first frame holds nothing to resume: removed
                writer.write_static({"bottom": bottom})
                writer.append(0.0, 0, first)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(os.path.realpath(writer.path))
                raise
            stop.defer(True)  # as after reopen: a file marked running
            step0 = 0
            frames_before = 1

        def advance(s, t0, n):
            return model.advance(s, t0=t0, dt=dt, n_steps=n, mesh=mesh)

        # The command that continues the run: on the layout this part ran on, where that is
        # not the run's own (a plain --resume went back to the stored one, unannounced).
        again = "--resume"
        if relayout is not None:
            again += f" --devices {_shown_devices(devices)}"
        command = f"physjax shallow-water --output {shlex.quote(output)} {again}"

        bar = tqdm(
            total=n_steps,
            initial=step0,
            # the time reached from the first draw: a resumed run's bar showed its step alone
            # until its first frame (in a batch log, the only line for half a minute)
            postfix=f"t={_format_time(step0 * dt)}",
            unit="step",
            desc=f"shallow-water {case_name}",
            disable=quiet,
            file=_ProgressStream(sys.stderr),
            dynamic_ncols=True,
            # a log file (a batch job's) gets a line every half minute, not ten a second;
            # tqdm's monitor thread also redraws a bar idle for maxinterval (10 s default)
            mininterval=0.1 if _is_terminal(sys.stderr) else LOG_PROGRESS_SECONDS,
            maxinterval=10.0 if _is_terminal(sys.stderr) else LOG_PROGRESS_SECONDS,
            # the clock is read at every frame: tqdm's default learns from the first redraw how
            # many steps make an interval, and a run slowing down after it (a busy node) was
            # not redrawn again until that many steps had passed
            miniters=1,
        )
        try:
            stop.defer(False)  # drive's first check stops a run asked to stop meanwhile
            if mesh is not None:
                state = shard(state, grid, mesh)
            state, step, frames = drive(
                advance,
                state,
                dt=dt,
                step0=step0,
                n_steps=n_steps,
                save_every=save_every,
                # the last frame's time is --t-end itself: n_steps * dt can miss it by an
                # ulp (7 * (7200 / 7) = 7200.000000000001), and ds.sel(time=t_end) with it
                # (files of older versions ran ceil(t_end / dt) steps past t_end: kept)
                on_frame=lambda s, t, k: writer.append(
                    t_end if k == n_steps and abs(t - t_end) <= 1e-9 * t_end else t,
                    k,
                    fields_of(s),
                ),
                progress=bar,
                max_frames=max_frames,
                stop=stop,
                healthy=healthy,
                failure="NaN/Inf or h <= 0",
            )
        except SimulationBlewUp as e:
            stop.defer(True)  # a signal while the file is marked failed left it running
            bar.close()
            writer.finish(f"failed: {e.reason} at step {e.step}, t = {e.time:.6g} s")
            e.frames_written += frames_before
            failed = SimulationBlewUp(e.step, e.time, e.frames_written, output, reason=e.reason)
            if plot and e.frames_written:  # the last good frame: where to look for the cause
                try:
                    _write_plot(output, plot)
                    failed.add_note(f"{plot} shows the last frame written before it")
                except ValueError as err:
                    failed.add_note(f"no plot drawn: {err}")
            elif plot:
                failed.add_note(f"no plot drawn: {output} holds no frame")
            raise failed from None
        except OutputSpaceError as e:
            stop.shield()
            bar.close()
            frames, step = _record_of(writer, step0)
            with contextlib.suppress(OSError):  # a few bytes of attributes, if they fit
                at = f"at step {step}, t = {step * dt:.6g} s"
                writer.finish(f"{STATUS_INTERRUPTED}: {at}: the disk was full")
            raise OutputSpaceError(
                f"{e}. The run stopped at step {step} of {n_steps}; {output} keeps {frames} "
                f"whole frame{'s' if frames != 1 else ''}. Free some space and continue "
                f"with: {command}"
            ) from None
        except (RunInterrupted, KeyboardInterrupt):  # also one before drive took over
            stop.shield()
            bar.close()
            # The file is the record: its last whole frame (a frame cut short is dropped).
            frames, step = _record_of(writer, step0)
            writer.finish(f"{STATUS_INTERRUPTED}: at step {step}, t = {step * dt:.6g} s")
            raise RunInterrupted(
                step,
                step * dt,
                frames,
                f"; {output} keeps {frames} whole frame{'s' if frames != 1 else ''} "
                f"({n_steps - step} of {n_steps} steps to go); continue with: {command}",
            ) from None
        except Exception as e:  # an unforeseen error: the file says where the run stopped
            stop.shield()
            bar.close()
            with contextlib.suppress(Exception):
                frames, step = _record_of(writer, step0)
                writer.finish(
                    f"{STATUS_INTERRUPTED}: at step {step}, t = {step * dt:.6g} s: "
                    f"{type(e).__name__}: {e}"[:500]
                )
                e.add_note(
                    f"physjax: {output} keeps {frames} whole frame{'s' if frames != 1 else ''} "
                    f"(to step {step}); continue with: {command}"
                )
            # a ValueError or TypeError raised here is no user error: main lets it through
            with contextlib.suppress(AttributeError):
                e._physjax_unforeseen = True
            raise
        # The run has ended: a signal now left the file marked running (exit 130, no word
        # of it). Marking it takes a moment, in which Ctrl-C and SIGTERM are ignored; they
        # are heeded again once it is done (the picture, the closing line).
        stop.shield()
        bar.close()
        total_frames = frames_before + frames
        done = step >= n_steps
        if done:
            writer.finish()
        else:  # stopped by --max-frames: say so in the file, which --resume continues
            writer.finish(
                f"{STATUS_STOPPED}: at step {step}, t = {step * dt:.6g} s after --max-frames "
                f"{max_frames}; continue with {again}"
            )
    if plot:
        frames_text = f"{total_frames} frame{'s' if total_frames != 1 else ''}"
        _plot_written(
            output, plot, f"{frames_text}, " + ("complete" if done else f"stopped at step {step}")
        )
    note = "" if done else f" (stopped at step {step}/{n_steps}; continue with {again})"
    if dt_requested is not None and dt != dt_requested:
        note += (
            f"; --dt {dt_requested:g} s was lowered to {dt:.6g} s so that the last frame "
            f"lands on --t-end {t_end:g} s"
        )
    plot_note = f" and {plot}" if plot else ""
    if resume:  # the frames of this call, and the file's total
        wrote = f"{frames} more frame{'s' if frames != 1 else ''} ({total_frames} in the file)"
    else:
        wrote = f"{total_frames} frame{'s' if total_frames != 1 else ''}"
    _report(
        f"wrote {wrote} of {case_name} "
        f"(t = {step * dt:.6g} s, {step} step{'s' if step != 1 else ''} of "
        f"dt = {dt:.6g} s) to {output}{plot_note}{note}",
        out,
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
    no_check = settings.pop("no_cfl_check", None)
    if no_check is not None and args.cfl_check is None:  # from the config file
        if settings.get("cfl_check") is not None and settings["cfl_check"] == no_check:
            raise ValueError("--config: cfl_check and no_cfl_check contradict each other")
        settings["cfl_check"] = not no_check
    max_frames = settings.pop("max_frames", None)
    quiet = bool(settings.pop("quiet", None))
    if args.no_plot and args.plot is None:  # the command line wins over a config's plot
        settings.pop("plot", None)
    settings["_config_file"] = args.config
    run_shallow_water(
        settings,
        resume=args.resume,
        overwrite=args.overwrite,
        max_frames=max_frames,
        quiet=quiet,
        no_plot=args.no_plot,
    )
    return 0


def _cmd_plot(args) -> int:
    if os.path.isdir(args.file):
        raise ValueError(f"file {args.file!r} is a directory; give a physjax output file")
    if not os.path.exists(args.file):
        raise ValueError(f"file {args.file!r} does not exist")
    if not os.path.isfile(args.file):
        raise ValueError(f"{args.file!r} is not a regular file (a device or pipe)")
    from .io import read_attrs, read_retrying

    # a running writer locks the file for a moment, or extends it under the reader
    attrs = read_retrying(args.file, lambda: read_attrs(args.file))
    if "physjax_version" not in attrs:  # its axes and units would be guesses
        raise ValueError(
            f"{args.file!r} was not written by physjax: `physjax plot` draws physjax output "
            "files (xarray's .plot() draws any NetCDF variable)"
        )
    names = None
    if args.vars is not None:
        names = [n.strip() for n in args.vars.split(",")]
        if not all(names):
            raise ValueError(
                f"--vars takes variable names separated by commas, e.g. h,zeta, got {args.vars!r}"
            )
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"--vars names {', '.join(map(repr, doubled))} more than once")
    given = args.output is not None  # an empty --output is refused, not the default
    out = args.output if given else os.path.splitext(args.file)[0] + ".png"
    _check_plot_path(out, "--output" if given else "the default output", args.file, "input")
    _write_plot(args.file, out, "--output", frame=args.frame, names=names)
    _report(f"wrote {out}", sys.stdout)
    return 0


# --------------------------------------------------------------------------------- main
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the message and where to read more, no usage block)
    and whole option names only: a shortened or half-typed option (``--meth``) is refused,
    not taken for the option it begins."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        # Options nobody knows are reported by the sub-command they were given to.
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            command = self.commands.get(getattr(parsed, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="physjax", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"physjax {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    sw = sub.add_parser(
        "shallow-water",
        help="run a rotating shallow-water case",
        description="Run a rotating shallow-water case on the C-grid.",
    )
    add_run_options(sw, list(SW_CASE_NAMES), "geostrophic-adjustment")
    sw.add_argument(
        "--no-plot",
        dest="no_plot",
        action="store_true",
        help="draw no picture (on --resume: not the --plot the run was started with)",
    )
    sw.set_defaults(func=_cmd_shallow_water)

    try:
        from . import _cli_poisson
    except ImportError:
        _cli_poisson = None
    if _cli_poisson is not None:
        _cli_poisson.add_parser(sub)

    pl = sub.add_parser(
        "plot",
        help="quick-look PNG of a physjax output file",
        description="Draw one frame of a physjax output file as a PNG: height anomaly and "
        "relative vorticity for a shallow-water run, solution, residual and error (or f) for "
        "a Poisson solve; a 3-D field at its middle z level.",
    )
    pl.add_argument("file", help="a physjax .h5 file")
    pl.add_argument(
        "--output", help="PNG to write (default: the file's name with .png, run.h5 -> run.png)"
    )
    pl.add_argument("--frame", type=int, default=None, help="frame index (default: last)")
    pl.add_argument(
        "--vars",
        metavar="NAME[,NAME...]",
        help="variables to draw, one panel each, e.g. h,u,v (default: height anomaly and "
        "vorticity of a shallow-water run; u, residual and error or f of a Poisson solve)",
    )
    pl.set_defaults(func=_cmd_plot)
    parser.commands = dict(sub.choices)
    return parser


def _version() -> str:
    from . import __version__

    return __version__


class _Interrupts:
    """For a whole command (in the main thread): SIGTERM (a batch system's time limit,
    ``kill``) and SIGHUP (the terminal closed) end it as Ctrl-C does, so that what it holds
    is released (the output lock, a half-made file) and it exits 130 with one line, instead
    of dying at once. A signal that lands while Python runs a weakref or garbage-collector
    callback (jax has many while it compiles) cannot be raised there: Python would print
    "Exception ignored" and go on as if no stop had been asked for. It is raised again at
    the next opportunity, and [`_stop_if_signalled`][] raises it before a command replaces
    its output (a command that has committed its output first ends as it did). A run's own
    [`_StopRequest`][] takes over while the run steps."""

    _active: list[_Interrupts] = []  # the command's, while it runs in the main thread

    def __init__(self):
        self._installed = False
        self._signum = signal.SIGINT
        self._timer = None
        self.signalled = False

    def _interrupt(self, signum, frame):
        if signum in _TERMINATING and self._signum != signum:
            name = signal.Signals(signum).name
            _note(f"\nterminated ({name}): stopping now")
        self._signum = signum
        self.signalled = True  # read before an output is committed: the raise can be lost
        raise KeyboardInterrupt

    def _unraisable(self, args):
        if issubclass(args.exc_type, KeyboardInterrupt):
            # Signalled again from another thread a moment later: the handler then runs in
            # the main thread out of this hook and the callback (signalled from here, it
            # would run inside this hook, where it cannot raise either), and a sleep or
            # wait of the main thread is cut short as by the first signal.
            self._timer = threading.Timer(0.01, self._signal_again)
            self._timer.start()
            return
        self._previous_hook(args)

    def _signal_again(self):
        if hasattr(signal, "pthread_kill"):
            signal.pthread_kill(threading.main_thread().ident, self._signum)
        else:  # pragma: no cover - Windows
            import _thread

            _thread.interrupt_main(self._signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {
                s: signal.signal(s, self._interrupt) for s in (signal.SIGINT, *_TERMINATING)
            }
            self._previous_hook = sys.unraisablehook
            sys.unraisablehook = self._unraisable
            self._installed = True
            _Interrupts._active.append(self)
        return self

    def __exit__(self, *exc):
        if self._timer is not None:  # a command that ended first ends as it did
            self._timer.cancel()
        if self._installed:
            _Interrupts._active.remove(self)
            for signum, previous in self._previous.items():
                default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
                signal.signal(signum, default if previous is None else previous)
            sys.unraisablehook = self._previous_hook
        return False


def _stop_if_signalled() -> None:
    """Raise ``KeyboardInterrupt`` if the command was signalled (Ctrl-C, SIGTERM, SIGHUP)
    and is still going: the raise was lost. One that lands in a weakref or garbage-collector
    callback is raised again 10 ms later, and a small solve finished its file and replaced
    the output within those 10 ms, exiting 0 as if no signal had come. Called just before an
    output is committed (one check, nothing per step)."""
    if _Interrupts._active and _Interrupts._active[-1].signalled:
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """The ``physjax`` command: run it with `argv` (default ``sys.argv[1:]``) and return its
    exit status (0 done, 1 out of disk space, 2 bad input, 3 the run blew up, 130
    interrupted)."""
    with _Interrupts():
        return _main(argv)


def run_command(argv: list[str] | None = None) -> None:
    """The console script: [`main`][] and exit with its status. An interrupted command
    exits at once (``os._exit``) once its output is flushed: main has released everything
    by then, and an XLA compilation that the interrupt cut short can still be running
    beneath, under which the interpreter's own teardown crashed (a segmentation fault after
    the "interrupted" line, jax 0.10 on CPU)."""
    code = main(argv)
    if code == 130:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            # output that cannot be written (a full disk, a closed pipe) is dropped, not left
            # for the interpreter's exit, which would turn the status into 120
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    sys.exit(code)


def _raised_by(module: str, *names: str) -> tuple[type[BaseException], ...]:
    """The exception classes `names` of physjax's `module` (``"_runner"``), or none if the
    command has not imported it (it cannot have raised them then). ``except`` evaluates
    this only when an exception reaches it, so that a command needing neither the solvers
    nor the output files (``--help``, a bad option, ``plot``) does not import them, and
    jax, for its error handling."""
    loaded = sys.modules.get(f"{__package__}.{module}")
    return () if loaded is None else tuple(getattr(loaded, name) for name in names)


def _main(argv: list[str] | None) -> int:
    try:  # a Ctrl-C while the parser is built: nothing to keep
        parser = build_parser()
        args = parser.parse_args(argv)
        from ._cpu_codegen import tune_cpu_codegen
        from ._memory import tune_cpu_allocator

        tune_cpu_allocator()  # reuse large freed buffers; PHYSJAX_NO_ALLOCATOR_TUNING=1 to skip
        tune_cpu_codegen()  # 512-bit vectors on AMD AVX-512; PHYSJAX_NO_CPU_TUNING=1 to skip
    except KeyboardInterrupt:
        _note("physjax: interrupted")
        return 130

    try:
        return args.func(args)
    except _raised_by("_runner", "SimulationBlewUp") as e:
        notes = "".join(f"\n{note}" for note in getattr(e, "__notes__", ()))  # the plot drawn
        _note(f"physjax {args.command}: {e}{notes}")
        return 3
    except (ValueError, TypeError) as e:
        if getattr(e, "_physjax_unforeseen", False):  # mid-run, a bug: its traceback
            raise
        notes = "".join(f"\n{note}" for note in getattr(e, "__notes__", ()))  # where a run stopped
        _note(f"physjax {args.command}: error: {e}{_config_hint(args, str(e))}{notes}")
        return 2
    except _raised_by("_runner", "RunInterrupted") as e:
        _note(f"physjax {args.command}: {e}")
        return 130
    except _raised_by("io._netcdf", "OutputSpaceError", "OutputRemoved") as e:
        _note(f"physjax {args.command}: error: {e}")
        return 1
    except KeyboardInterrupt as e:
        notes = "".join(f"\n{note}" for note in getattr(e, "__notes__", ()))  # a file kept
        _note(f"physjax {args.command}: interrupted{notes}")
        return 130


if __name__ == "__main__":
    run_command()
