"""The Python examples in README.md and docs/*.md run as written.

Each ```python block is run by a fresh interpreter, as a user pasting it would (the pages
that need a file first get one from the command line). A block that stops running — a
renamed function, a changed signature, a wrong claim about what it returns — fails here.
The command lines of the pages (``physjax …`` and ``python benchmarks/….py …``), their
option tables, the config-file settings they list and their TOML examples are checked
against the parsers, without running them.
"""

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks():
    for page in PAGES:
        for k, match in enumerate(_BLOCK.finditer(page.read_text())):
            yield pytest.param(page, match.group(1), id=f"{page.name}-{k}")


BLOCKS = list(_blocks())


def _run(code, cwd, timeout=600):
    # As a user's fresh interpreter runs them: one CPU device (the suite's simulated four
    # are dropped, so `make_mesh(len(jax.devices()))` is a mesh of one) and XLA's default
    # optimisation and kernel emitters (conftest.py changes both for the rest of the suite;
    # the README's example ran 7x longer at level 0). Simulated devices are not kept even at
    # two: beside the other test worker on a 2-core machine the README's 2000 sharded steps
    # on two of them took 390-430 s instead of 4-7 s alone, 1.1 cores busy the whole time
    # with the main thread in the run's compiled call (the devices' collectives meet between
    # threads).
    # Sharded runs equal to one device are tested in test_shallow_water.py and
    # test_poisson.py.
    flags = os.environ.get("XLA_FLAGS", "")
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
    for fast in os.environ.get("PHYSJAX_TEST_FAST_FLAGS", "").split():
        flags = flags.replace(fast, "")
    flags = " ".join(flags.split())
    env = dict(os.environ, MPLBACKEND="Agg", XLA_FLAGS=flags)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_page_with_examples_is_collected():
    """The block pattern finds the examples (a test that found none would pass vacuously)."""
    names = {p.values[0].name for p in BLOCKS}
    assert {"README.md", "shallow_water.md", "poisson.md", "gradients.md", "output.md"} <= names
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("page, code", BLOCKS)
def test_example_runs(page, code, tmp_path):
    if "sw.h5" in code:  # the output page reads the quick start's file
        made = _run(
            "from physjax.cli import main; main(['shallow-water', '--nx', '16', '--ny', '16',"
            " '--t-end', '3600', '--output', 'sw.h5'])",
            tmp_path,
        )
        assert made.returncode == 0, made.stderr[-2000:]
    if "# 10 frames: sol.ts" in code:  # shallow_water.md: what model.run returns
        code += (
            "\nimport numpy\n"
            "assert sol.states.h.shape == (10, 128, 256), sol.states.h.shape\n"
            "assert numpy.allclose(sol.ts, dt * 100 * numpy.arange(1, 11), rtol=1e-6), sol.ts\n"
            # the gradient the comment gives, and a central difference agrees with it
            "assert -1.0e5 < grad < -0.95e5, grad\n"
            "fd = (kinetic(2e-6) - kinetic(0.0)) / 2e-6\n"
            "assert abs(fd - grad) <= 0.01 * abs(grad), (fd, grad)\n"
        )
    if "# PoissonSolution(u, residual_norm, iterations, converged)" in code:  # poisson.md
        code += (
            "\nimport dataclasses\n"
            "names = [f.name for f in dataclasses.fields(sol)]\n"
            "assert names == ['u', 'residual_norm', 'iterations', 'converged'], names\n"
            "assert sol.u.shape == grid.shape and bool(sol.converged)\n"
        )
    if "lap = pg.laplacian(" in code and "# (4096,)" in code:  # gradients.md's loss
        code += (
            "\nassert pg.laplacian(u, spatial=(0, 1), batched=True)(points).shape == (4096,)\n"
            "assert jax.tree.structure(grads) == jax.tree.structure(u)\n"
        )
    done = _run(code, tmp_path)
    assert done.returncode == 0, f"{page.name} example failed:\n{code}\n{done.stderr[-3000:]}"
    if page.name == "README.md":
        # the example prints its frame times and the mass ratio (conserved to round-off)
        *_, ratio = done.stdout.split()
        assert abs(float(ratio) - 1.0) <= 1e-6, done.stdout
    # and what the other pages' comments say their prints give
    if "initial_guess=u" in code:  # poisson.md's warm start: "[8 6 6 … 6]"
        iterations = [int(k) for k in re.findall(r"\d+", done.stdout)]
        assert iterations[0] == 8 and set(iterations[1:]) == {6}, done.stdout
    if "mass kept" in code:  # poisson.md's implicit diffusion: "0.0314 (π·0.01), as at t = 0"
        assert float(done.stdout.split()[-1]) == pytest.approx(math.pi * 0.01, rel=1e-6)
    if "zeta - ds.zeta" in code:  # output.md: xgcm's vorticity is the stored one to round-off
        assert float(done.stdout.split()[-1]) <= 1e-9, done.stdout  # |zeta| ~ 1e-5 s-1 here


# ------------------------------------------------------------------ command lines of the docs
# The command lines the pages give are checked as cheaply as a user's typo would be found:
# by the parsers alone, without running anything (running them is a matter of minutes).
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _physjax_lines():
    """``physjax …`` command lines of the pages' shell blocks (continuations joined)."""
    for page in PAGES:
        for lang, body in _FENCE.findall(page.read_text()):
            if lang not in ("", "bash", "sh", "console"):
                continue
            for line in body.replace("\\\n", " ").splitlines():
                for part in line.split("&&"):
                    words = shlex.split(part, comments=True)
                    if words and Path(words[0]).name == "physjax":
                        yield pytest.param(words[1:], id=f"{page.name}: {' '.join(words[1:])}")


def _benchmark_lines():
    """``python benchmarks/NAME.py ARGS`` of the pages (code spans, indented and shell
    blocks) and of the benchmark scripts' own docstrings, as (script, args)."""
    sources = [*PAGES, *sorted((ROOT / "benchmarks").glob("*.py"))]
    found = set()
    for source in sources:
        text = re.sub(r"\\+\n", " ", source.read_text())
        shell = [b for lang, b in _FENCE.findall(text) if lang in ("", "bash", "sh", "console")]
        text = _FENCE.sub("", text).replace("``", "`")  # rST's ``code`` in the docstrings
        spans = re.findall(r"`([^`]+)`", text) + re.findall(r"^ {4}(.*)$", text, re.M)
        spans += [line for block in shell for line in block.splitlines()]
        for span in spans:
            span = " ".join(span.split())
            if "[" in span:  # a synopsis ([--quick]), not a command line
                continue
            for m in re.finditer(r"(python )?benchmarks/(\w+)\.py((?: [^ #`)]+)*)", span):
                if m.group(1) or m.group(3).strip():  # a command, not a file named in passing
                    found.add((m.group(2), tuple(shlex.split(m.group(3)))))
    return sorted(found)


PHYSJAX_LINES = list(_physjax_lines())
BENCHMARK_LINES = _benchmark_lines()


def test_command_lines_are_collected():
    commands = {p.values[0][0] for p in PHYSJAX_LINES}
    assert {"shallow-water", "poisson", "plot"} <= commands
    scripts = {script for script, _ in BENCHMARK_LINES}
    assert {"shallow_water", "shallow_water_ab", "poisson", "pinn_laplacian"} <= scripts
    assert "sw_padded_carry" in scripts


@pytest.mark.parametrize("argv", PHYSJAX_LINES)
def test_physjax_command_line_parses(argv, capsys):
    """Every ``physjax …`` line of README.md and docs/ names a command and options that
    exist, with values of the options' types (a renamed option fails here)."""
    from physjax.cli import build_parser

    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"physjax {' '.join(argv)}: exit {e.code}: {capsys.readouterr().err}")
    assert args.command == argv[0]


def _parser_options(command):
    from physjax.cli import build_parser

    sub = build_parser().commands[command]
    return {s for a in sub._actions for s in a.option_strings if s.startswith("--")}


@pytest.mark.parametrize(
    "page, command", [("shallow_water.md", "shallow-water"), ("poisson.md", "poisson")]
)
def test_option_tables_match_the_parsers(page, command):
    """The option table of a command's page lists exactly the command's options."""
    text = (ROOT / "docs" / page).read_text()
    documented = set()
    for row in re.findall(r"^\| (`--[^|]*(?:\\\|[^|]*)*)\|", text, re.M):
        documented |= set(re.findall(r"`(--[a-z][a-z-]*)", row))
    assert documented, f"no option table found in {page}"
    options = _parser_options(command) - {"--help"}
    assert documented - options == set(), f"{page} documents options {command} does not have"
    assert options - documented == set(), f"{page} leaves options of {command} out"


def test_config_keys_documented_are_the_accepted_ones():
    """docs/shallow_water.md's list of config-file settings is what load_config accepts."""
    from physjax.cli import RUN_KEYS

    text = (ROOT / "docs" / "shallow_water.md").read_text()
    row = re.search(r"^\| `--config FILE\.toml` \|(.*)$", text, re.M).group(1)
    listed = row.split("settings with underscored names", 1)[1].split("and a `[parameters]`")[0]
    keys = set(re.findall(r"`([a-z_]+)(?: = [a-z]+)?`", listed))
    assert keys == set(RUN_KEYS)


def test_case_parameter_table_is_the_cases_defaults():
    """docs/shallow_water.md's table of case parameters lists every parameter of every
    case, with its default, and nothing a case does not take."""
    from physjax.solvers.shallow_water import CASES

    text = (ROOT / "docs" / "shallow_water.md").read_text()
    header = re.search(r"^\| parameter \| meaning \[units\] \|(.*)\|$", text, re.M)
    cases = re.findall(r"`([a-z-]+)`", header.group(1))
    assert cases == list(CASES)
    rows = text[header.end() :].split("\n\n", 1)[0].strip().splitlines()[1:]  # after |---|
    seen = {name: {} for name in cases}
    for row in rows:
        cells = [c.strip() for c in row.replace("\\|", "¦").strip("|").split("|")]
        names = re.findall(r"`(\w+)`", cells[0])
        for case, cell in zip(cases, cells[2:], strict=True):
            if not cell:
                continue
            values = [v.strip().split(" ")[0].strip('`"') for v in cell.split(",")]
            assert len(values) == len(names), (case, names, cell)
            seen[case].update(zip(names, values))
    for case, spec in CASES.items():
        assert set(seen[case]) == set(spec.defaults), case
        for name, value in seen[case].items():
            default = spec.defaults[name]
            if isinstance(default, str):
                assert value == default, (case, name)
            elif value.startswith("20π/"):  # zonal-jet: ten inertial periods
                assert default == pytest.approx(20 * math.pi / spec.defaults["coriolis"])
            else:
                assert float(value) == pytest.approx(default, rel=1e-12), (case, name)


def test_config_settings_the_command_line_cannot_undo_are_named():
    """A config-file setting whose only option is a one-way flag (--quiet, --no-cfl-check)
    cannot be undone from the command line: the --config row names each as an exception to
    'the command line wins' (it once named quiet alone)."""
    from physjax.cli import RUN_KEYS, build_parser

    text = (ROOT / "docs" / "shallow_water.md").read_text()
    row = re.search(r"^\| `--config FILE\.toml` \|(.*)$", text, re.M).group(1)
    exceptions = row.split("The command line wins over the file", 1)[1]
    sub = build_parser().commands["shallow-water"]
    flags = [a for a in sub._actions if a.nargs == 0 and a.dest in RUN_KEYS]
    assert {a.dest for a in flags} == {"quiet", "cfl_check"}
    for action in flags:
        key = action.option_strings[0][2:].replace("-", "_")  # no_cfl_check, quiet
        assert f"`{key} = true`" in exceptions, key


def _named_objects():
    names = set()
    for page in PAGES:
        names |= set(re.findall(r"\bphysjax(?:\.[A-Za-z_]\w*)+", page.read_text()))
    return sorted(names)


def test_physjax_names_in_the_pages_exist():
    """Every ``physjax.module.name`` the pages mention can be imported (a moved or renamed
    function leaves a stale reference in prose that no example runs)."""
    import importlib

    names = _named_objects()
    assert "physjax.parallel.make_mesh" in names
    missing = []
    for name in names:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                missing.append(name)
            break
    assert missing == []


def test_toml_examples_load(tmp_path):
    """Each ```toml block (the pages have shallow-water configs only) loads as
    `physjax shallow-water --config` reads it, with parameters its case has."""
    from physjax.cli import load_config
    from physjax.solvers.shallow_water._cases import CASES

    blocks = [b for page in PAGES for lang, b in _FENCE.findall(page.read_text()) if lang == "toml"]
    assert blocks
    for k, block in enumerate(blocks):
        path = tmp_path / f"example{k}.toml"
        path.write_text(block)
        config = load_config(str(path))
        case = config.get("case", "geostrophic-adjustment")
        assert set(config.get("parameters", {})) <= set(CASES[case].defaults), block


_PARSE_ONLY = r"""
import argparse, json, os, runpy, sys
root = os.getcwd()
# as `python benchmarks/NAME.py` starts: the script's folder first on sys.path, not the cwd
sys.path[0] = os.path.join(root, "benchmarks")
path = list(sys.path)

class Parsed(BaseException):
    pass

original = argparse.ArgumentParser.parse_args

def parse_args(self, args=None, namespace=None):
    original(self, args, namespace)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_args
failed = []
for script, argv in json.loads(sys.argv[1]):
    sys.path[:] = path
    for name, module in list(sys.modules.items()):  # each script imports physjax afresh
        if name.split(".")[0] in ("physjax", "shallow_water", "sw_numpy"):
            del sys.modules[name]
    sys.argv = [f"benchmarks/{script}.py", *argv]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        failed.append(f"{script} {argv}: ran without parsing its arguments")
    except Parsed:
        used = sys.modules.get("physjax")
        if used is not None and not used.__file__.startswith(root + os.sep):
            failed.append(f"{script}: imported physjax from {used.__file__}, not the checkout")
    except SystemExit as e:
        failed.append(f"{script} {argv}: exit {e.code}")
    except Exception as e:
        failed.append(f"{script} {argv}: {type(e).__name__}: {e}")
print(json.dumps(failed))
"""


def test_benchmark_command_lines_parse(tmp_path):
    """Every ``python benchmarks/NAME.py …`` line of the docs and of the scripts' own
    docstrings gets past the script's argument parser (stopped there: the benchmarks take
    minutes), and the script measures the physjax of its checkout: another one installed
    (here a decoy on PYTHONPATH, which fails to import) is not taken instead."""
    import json

    decoy = tmp_path / "physjax"
    decoy.mkdir()
    (decoy / "__init__.py").write_text(
        "raise ImportError('an installed physjax, not the checkout')"
    )
    done = subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY, json.dumps(BENCHMARK_LINES)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(tmp_path), PHYSJAX_NO_ALLOCATOR_TUNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [], done.stderr[-3000:]


_SW_BENCHMARK_OUTPUT = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sw_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
# the measurements take minutes: stand-ins of their shapes, the table and the file are real
bench.bandwidth = lambda seconds: {"numpy_GBps": 1.0, "jax_GBps": 1.0, "jax_copy_GBps": 1.0}

def bench_physjax(n, dtype, steps, hlo_path=None):
    if hlo_path is not None:  # as count_fusions writes the compiled program's text
        open(hlo_path, "w").close()
    return 1e-3, {"plain": 1e-3}, 0, 0, 9

bench.bench_physjax = bench_physjax
bench.flatness = lambda sizes, dtypes: {d: {n: (1.0, 1.0) for n in sizes} for d in dtypes}
bench.main(["--sizes", "16", "--dtypes", "float32", "--no-numpy", *sys.argv[2:]])
print(json.dumps(sorted(json.load(open("sw.json")))))
"""


def _run_snippet(code, cwd, *argv):
    """Run ``python -c code *argv`` in ``cwd`` (the benchmarks' own allocator setting off)."""
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=cwd,
        env=dict(os.environ, PHYSJAX_NO_ALLOCATOR_TUNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _run_sw_benchmark(cwd, *argv):
    return _run_snippet(
        _SW_BENCHMARK_OUTPUT, cwd, str(ROOT / "benchmarks" / "shallow_water.py"), *argv
    )


def test_shallow_water_benchmark_writes_an_output_named_without_a_folder(tmp_path):
    """``benchmarks/shallow_water.py --output sw.json`` (no folder in the name) writes
    sw.json in the current directory; it used to fail at the very end of the run, in
    ``os.makedirs('')``, and lose every figure measured."""
    import json

    done = _run_sw_benchmark(tmp_path, "--output", "sw.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "wrote sw.json" in done.stdout
    keys = json.loads(done.stdout.splitlines()[-1])
    assert {"device", "bandwidth", "rows", "flatness_ns_best_median"} <= set(keys)


def test_shallow_water_benchmark_makes_its_hlo_folder(tmp_path):
    """``--hlo DIR`` names a folder for the compiled program's text (hlo_N_DTYPE.txt of the
    largest size); one that did not exist yet failed the run when that size came, after
    the smaller ones had been measured. It is made at the start now."""
    done = _run_sw_benchmark(tmp_path, "--output", "sw.json", "--hlo", "new/hlo")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "new" / "hlo" / "hlo_16_float32.txt").is_file()


_SW_BENCHMARK_DEFAULT_OUTPUT = _SW_BENCHMARK_OUTPUT.replace(
    'bench.main(["--sizes", "16", "--dtypes", "float32", "--no-numpy", *sys.argv[2:]])\n'
    'print(json.dumps(sorted(json.load(open("sw.json")))))\n',
    "import os\n"
    "bench.HERE = os.getcwd()  # its results/ folder here, not the checkout's\n"
    "bench.bench_numpy = lambda n, dtype: (2e-3, 0.0)\n"
    "bench.main(sys.argv[2:])\n"
    'print(json.dumps(sorted(os.listdir("results"))))\n',
)


@pytest.mark.parametrize(
    "argv, written",
    [
        (["--sizes", "16", "--dtypes", "float32"], "shallow_water_partial.json"),
        (["--dtypes", "float64"], "shallow_water_partial.json"),
        (["--no-numpy"], "shallow_water_partial.json"),
        ([], "shallow_water.json"),
    ],
)
def test_shallow_water_benchmark_partial_run_keeps_the_full_runs_file(tmp_path, argv, written):
    """``benchmarks/shallow_water.py --sizes 16`` (a try on one small size) wrote its figures
    over benchmarks/results/shallow_water.json, the full run's file that docs/benchmarks.md
    cites, as every run without ``--output`` did; poisson.py and pinn_laplacian.py keep
    their partial runs apart. A partial run now writes shallow_water_partial.json."""
    assert "bench.HERE = os.getcwd()" in _SW_BENCHMARK_DEFAULT_OUTPUT  # the stand-in took
    done = _run_snippet(
        _SW_BENCHMARK_DEFAULT_OUTPUT, tmp_path, str(ROOT / "benchmarks" / "shallow_water.py"), *argv
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    assert json.loads(done.stdout.splitlines()[-1]) == [written], done.stdout


_CARRY_BENCHMARK_FOLDER = r"""
import importlib.util, os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
spec = importlib.util.spec_from_file_location("carry_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


class Measuring(Exception):
    pass


def bandwidth(seconds):  # the first measurement: the run has begun
    raise Measuring


bench.bandwidth = bandwidth
try:
    bench.main(["--sizes", "8", "--output", "new/carry.json"])
except Measuring:
    print("folder made before measuring:", os.path.isdir("new"))
"""


def test_padded_carry_benchmark_makes_its_output_folder_before_measuring(tmp_path):
    """``benchmarks/sw_padded_carry.py --output new/carry.json`` wrote its JSON with a bare
    ``open`` after every size was measured, so a folder that did not exist yet lost the
    whole run; the folder is made first now, as the other benchmarks make theirs."""
    done = _run_snippet(
        _CARRY_BENCHMARK_FOLDER, tmp_path, str(ROOT / "benchmarks" / "sw_padded_carry.py")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "folder made before measuring: True" in done.stdout


_GPU_CHECK_STUB = r'''#!PYTHON
"""Stands in for the interpreter of benchmarks/gpu_check.sh: the benchmarks write the files
they name (as many as they would), anything else runs for real."""
import os, subprocess, sys

args = sys.argv[1:]
script = os.path.basename(args[0]) if args else ""
if script not in ("shallow_water.py", "sw_padded_carry.py", "poisson.py", "run_shallow_water.py"):
    sys.exit(subprocess.call([sys.executable, *args]))
if script == os.environ.get("STUB_HANGS"):  # a step that would outlast the device's limit
    import time

    time.sleep(600)


def value(flag):
    return args[args.index(flag) + 1] if flag in args else None


sizes = []
if "--sizes" in args:
    for word in args[args.index("--sizes") + 1 :]:
        if word.startswith("--"):
            break
        sizes.append(word)
names = [value("--output"), value("--plot")]
if value("--hlo"):
    prefix = "carry_" if script == "sw_padded_carry.py" else "hlo_"
    kinds = ("plain_", "interior_", "readback_") if prefix == "carry_" else ("",)
    largest = sizes if prefix == "carry_" else sizes[-1:]
    folder = value("--hlo")
    names += [os.path.join(folder, f"{prefix}{k}{n}_float32.txt") for k in kinds for n in largest]
for name in filter(None, names):
    open(name, "w").close()
print(script, "done")
'''


def _gpu_check_stub(tmp_path):
    """The stand-in interpreter for benchmarks/gpu_check.sh (skips without bash and tar)."""
    import shutil

    if shutil.which("bash") is None or shutil.which("tar") is None:
        pytest.skip("needs bash and tar")
    stub = tmp_path / "python"
    stub.write_text(_GPU_CHECK_STUB.replace("PYTHON", sys.executable, 1))
    stub.chmod(0o755)
    return stub


def _run_gpu_check(env, timeout):
    """benchmarks/gpu_check.sh run from the checkout with ``env``."""
    return subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_gpu_check_leaves_the_device_tool_at_most_eight_files(tmp_path):
    """The device tool brings back at most 8 files from $OUT; with CARRY=1 and EXTRAS=1 the
    GPU check wrote 16 there (six compiled programs of the padded-carry experiment among
    them), so half of a run's results never came back. Beyond 8 it packs all but its own
    three into one archive."""
    import tarfile

    stub = _gpu_check_stub(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=str(stub), SIZES="16 32", EXTRAS="1")
    done = _run_gpu_check(env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, files
    assert {"gpu_env.log", "shallow_water_gpu.json", "shallow_water_gpu.log"} <= set(files)
    with tarfile.open(out / "gpu_check_files.tar.gz") as tar:
        packed = set(tar.getnames())
    assert {"hlo_32_float32.txt", "carry_readback_32_float32.txt", "sw_gpu.png"} <= packed
    assert {"cli_gpu.log", "poisson_gpu.json", "sw_padded_carry_gpu.json"} <= packed


def test_gpu_check_keeps_within_its_budget_when_a_step_hangs(tmp_path):
    """The extra steps had fixed limits (300 + 120 + 150 s) which, with the benchmark, could
    pass the device tool's 600 s per command, stopping the script before it packed its
    files. Each step now gets what BUDGET leaves: a hanging step is cut short and the
    script still ends in time, its files packed."""
    stub = _gpu_check_stub(tmp_path)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=str(stub), SIZES="16 32", EXTRAS="1")
    env.update(BUDGET="40", STUB_HANGS="sw_padded_carry.py")
    # the hanging step alone had 300 s before: this run would not end
    done = _run_gpu_check(env, timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and "gpu_check_files.tar.gz" in files, files
    import tarfile

    with tarfile.open(out / "gpu_check_files.tar.gz") as tar:
        log = tar.extractfile("sw_padded_carry_gpu.log").read().decode()
    assert "padded carry rc=124" in log, log  # stopped by its share of the budget


def test_gpu_check_stops_at_once_where_jax_finds_no_gpu(tmp_path):
    """Where jax finds no GPU (installed without its CUDA plugin, or no device visible) it
    runs on the CPU, and the GPU check ran its 1024²–4096² benchmark there, spending the
    lent machine's time and writing the CPU's figures as shallow_water_gpu.json/.log. It
    now stops after its environment line, exit status 1, saying so; SIZES (the documented
    dry run) still runs on the CPU (the tests above)."""
    stub = _gpu_check_stub(tmp_path)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("SIZES", "CARRY", "EXTRAS")}
    env.update(OUT=str(out), PYTHON=str(stub), JAX_PLATFORMS="cpu")
    done = _run_gpu_check(env, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "no GPU" in done.stdout and "SIZES=" in done.stdout, done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu_env.log"]
    assert "no GPU" in (out / "gpu_env.log").read_text()


_AB_FUSIONS = r"""
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from physjax.solvers.shallow_water import _blocked

_blocked.CACHE_SYSFS = sys.argv[2]  # a machine with 4 KiB of cache: auto blocks at 128²
import importlib.util

spec = importlib.util.spec_from_file_location("ab", sys.argv[1])
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)
# the timing takes minutes: stand-ins; the fusion count is real
ab.compiled_advance = lambda *a: None
ab.interleaved = lambda fns, rounds, seconds: {v: (1.0, 1.0) for v in fns}
ab.main(["128:float32:auto:auto", "128:float32:0:auto", "--fusions"])
"""


def test_ab_benchmark_counts_no_strips_as_a_plain_step(tmp_path):
    """``shallow_water_ab.py --fusions`` counts the kernels of the plain step; for a variant
    of automatic rows that blocks into strips (on a CPU whose cache the fields outgrow) it
    printed the strips' loop body as "fusions/step" beside the plain step's. Such a variant
    gets no count now."""
    cache = tmp_path / "cache" / "index3"
    cache.mkdir(parents=True)
    for name, text in (("type", "Unified"), ("level", "3"), ("size", "4K")):
        (cache / name).write_text(text + "\n")
    done = _run_snippet(
        _AB_FUSIONS, tmp_path, str(ROOT / "benchmarks" / "shallow_water_ab.py"), str(cache.parent)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if "best" in line}
    assert "fusions/step" not in lines["128:float32:auto:auto"], done.stdout
    assert "fusions/step" in lines["128:float32:0:auto"], done.stdout


_SW_NUMPY_CHECK = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sw_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
_, err = bench.bench_numpy(16, "float64", min_steps=1)  # the real baseline: round-off
print("agrees:", err)
original = bench.sw_numpy.ssprk3


def other_scheme(h, u, v, dt, **kw):  # the same code with gravity 1% off
    return original(h, u, v, dt, **{**kw, "g": 1.01 * kw["g"]})


bench.sw_numpy.ssprk3 = other_scheme
try:
    bench.bench_numpy(16, "float64", min_steps=1)
except RuntimeError as e:
    print("refused:", e)
"""


def test_shallow_water_benchmark_refuses_a_numpy_baseline_that_computes_something_else(
    tmp_path,
):
    """docs/benchmarks.md says the NumPy baseline's first step is checked against physjax's;
    the script only recorded the difference in the JSON (not in the table), so a baseline
    whose scheme had drifted from physjax's was timed and its speed-up reported all the
    same. It now stops, naming the difference, when that exceeds a few ulps."""
    done = _run_snippet(_SW_NUMPY_CHECK, tmp_path, str(ROOT / "benchmarks" / "shallow_water.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "agrees:" in done.stdout
    assert float(done.stdout.split("agrees:")[1].split()[0]) < 1e-15
    assert "refused:" in done.stdout, done.stdout
    assert "sw_numpy.py" in done.stdout.split("refused:")[1]


_SW_TIMEIT_ROUNDS = r"""
import importlib.util, sys, types
spec = importlib.util.spec_from_file_location("sw_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
clock = [0.0]
bench.time = types.SimpleNamespace(perf_counter=lambda: clock[0])
calls = []


def call():  # a call of 0.6 s (1024² float64, 36 steps: 0.87 s in results/shallow_water.json)
    clock[0] += 0.6
    calls.append(clock[0])


bench._timeit(call, 1.0, repeats=1)
print("timed calls:", len(calls) - 2)  # after the warm-up and the probe
"""


def test_shallow_water_benchmark_rounds_last_at_least_a_second(tmp_path):
    """docs/benchmarks.md: the physjax times are medians of 3 rounds, each ≥ 1 s of calls.
    The number of calls per round was int(1 s / one call), so a call of 0.6 s made a round
    of one call, 0.6 s (in the committed AMD run the 1024² float64 rounds were one call of
    0.87 s); it is rounded up now."""
    done = _run_snippet(_SW_TIMEIT_ROUNDS, tmp_path, str(ROOT / "benchmarks" / "shallow_water.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "timed calls: 2" in done.stdout, done.stdout


_PINN_QUICK = r"""
import importlib.util, json, sys, types
spec = importlib.util.spec_from_file_location("pinn_bench", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
children = []


def run(cmd, **kwargs):  # the children measure for minutes: stand-ins that report at once
    children.append(cmd[cmd.index("--child") + 1 :])
    result = {"time_s": 1.0, "temp_bytes": 1, "peak_rss_bytes": 1}
    return types.SimpleNamespace(returncode=0, stdout="RESULT " + json.dumps(result), stderr="")


bench.subprocess.run = run
bench.main(["--output", "quick.json", "--variants", "first_order", *sys.argv[2:]])
print(json.dumps(children))
"""


@pytest.mark.parametrize(
    "argv, depths, dims, ns, repeats",
    [
        (["--quick"], ["4"], ["2"], ["1024"], "2"),
        (["--quick", "--depths", "8", "--dims", "3"], ["8"], ["3"], ["1024"], "2"),
        (["--quick", "--n", "4096", "--repeats", "5"], ["4"], ["2"], ["4096"], "5"),
        (["--depths", "2"], ["2"], ["2", "3"], ["1024", "4096", "16384"], "3"),
    ],
)
def test_pinn_benchmark_quick_takes_the_settings_given(tmp_path, argv, depths, dims, ns, repeats):
    """``benchmarks/pinn_laplacian.py --quick --depths 8`` measured depth 4: ``--quick`` set
    depth, dimension, N and repeats over whatever was given, without a word (the JSON's
    ``command`` then named ``--depths 8`` over rows of depth 4). It now sets only those not
    given."""
    import json

    done = _run_snippet(
        _PINN_QUICK, tmp_path, str(ROOT / "benchmarks" / "pinn_laplacian.py"), *argv
    )
    assert done.returncode == 0, done.stderr[-3000:]
    children = json.loads(done.stdout.splitlines()[-1])
    assert [c[1] for c in children] == [d for d in depths for _ in dims for _ in ns]
    assert {c[2] for c in children} == set(dims) and {c[3] for c in children} == set(ns)
    assert {c[c.index("--repeats") + 1] for c in children} == {repeats}
    rows = json.loads((tmp_path / "quick.json").read_text())["results"]
    assert [str(r["depth"]) for r in rows] == [c[1] for c in children]


_PINN_NO_FOLX = _PINN_QUICK.replace(
    "bench.main([", 'sys.modules["folx"] = None  # not installed\nbench.main(['
).replace('"--variants", "first_order", ', "")


def test_pinn_benchmark_skips_folx_when_it_is_not_installed(tmp_path):
    """folx is an optional comparison, not a dependency: without it every default run of
    ``benchmarks/pinn_laplacian.py`` printed ``folx … FAILED: ModuleNotFoundError: No module
    named 'folx'`` (the child's last stderr line) and stored it as an error. It is now skipped
    without starting a child, and the row says why."""
    import json

    done = _run_snippet(
        _PINN_NO_FOLX,
        tmp_path,
        str(ROOT / "benchmarks" / "pinn_laplacian.py"),
        "--quick",
        "--variants",
        "folx",
        "first_order",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [c[0] for c in json.loads(done.stdout.splitlines()[-1])] == ["first_order"]
    assert "FAILED" not in done.stdout
    assert "skipped: folx is not installed" in done.stdout, done.stdout
    rows = json.loads((tmp_path / "quick.json").read_text())["results"]
    assert [r["variant"] for r in rows] == ["folx", "first_order"]
    assert "folx is not installed" in rows[0]["skipped"] and "error" not in rows[0]
