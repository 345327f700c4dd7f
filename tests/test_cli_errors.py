"""Bad settings of the physjax command: a clear message naming the setting, exit status 2,
and nothing written."""

import json
import os
import re
import sys

import h5py
import numpy as np
import pytest
import xarray as xr

from physjax.cli import main

FAST = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "10", "--quiet"]


def _error(capsys, argv):
    """Exit status and stderr of ``physjax argv``; argparse's own errors exit by SystemExit."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, match",
    [
        # the gravity-wave mode (2, 1) aliases to a uniform state on a 1x1 grid
        (["--case", "gravity-wave", "--n", "1"], "nx >= 3 or ny >= 2"),
        # a walled axis needs two cells (the halo mirrors the face after the wall face)
        (["--case", "zonal-jet", "--n", "1"], "ny=1 is too small: a walled y axis needs ny >= 2"),
        (
            ["--case", "wind-gyre", "--nx", "1", "--ny", "8"],
            "nx=1 is too small: a walled x axis needs nx >= 2",
        ),
        (
            ["--case", "wind-gyre", "--nx", "8", "--ny", "4", "--devices", "4x1"],
            "--devices 4x1: ny=4 split 4 ways leaves 1 cell(s) per device; a walled y axis",
        ),
    ],
)
def test_grids_too_small_for_the_case_are_refused_before_any_file(tmp_path, capsys, extra, match):
    out = tmp_path / "o.h5"
    code, err = _error(
        capsys, ["shallow-water", "--t-end", "3600", "--quiet", "--output", str(out), *extra]
    )
    assert code == 2
    assert match in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "extra, match",
    [
        # a typo in the exponent: the spacing's square underflows, or overflows, in float64
        (["--param", "Lx=1e-300"], "parameter Lx = 1e-300 m over 16 cells gives a spacing"),
        (["--case", "zonal-jet", "--param", "Ly=1e300"], "parameter Ly = 1e+300 m over 16"),
        # in float32, 1/dx**2 of the viscous stencil overflows
        (["--case", "wind-gyre", "--param", "Lx=1e-25"], "beyond the range of float32"),
    ],
)
def test_domain_lengths_whose_spacing_overflows_are_refused(tmp_path, capsys, extra, match):
    out = tmp_path / "o.h5"
    argv = ["shallow-water", "--n", "16", "--t-end", "3600", "--quiet", "--output", str(out)]
    code, err = _error(capsys, [*argv, *extra])
    assert code == 2
    assert match in err
    assert "(--param, or the [parameters] table of --config)" in err
    assert len(err.strip().splitlines()) == 1, err  # no traceback
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "param, match",
    [
        # beyond a 64-bit integer: accepted, then the file's attribute could not be written
        (f"mode_x={2**70}", "parameter mode_x must be an integer between -(2**63 - 1) and"),
        # beyond a float: an OverflowError traceback
        (f"mean_depth={10**400}", "parameter mean_depth must be a finite number, got an int"),
    ],
)
def test_integers_too_large_for_the_parameter_are_refused(tmp_path, capsys, param, match):
    out = tmp_path / "o.h5"
    code, err = _error(capsys, ["shallow-water", *FAST, "--output", str(out), "--param", param])
    assert code == 2
    assert match in err
    assert len(err.strip().splitlines()) == 1, err  # no traceback
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /dev/null and mkfifo")
def test_devices_and_pipes_are_never_replaced_or_opened(tmp_path, capsys):
    """/dev/null used to be replaced by the output file with --overwrite (as the error
    advised), and a named pipe made the run wait for a reader forever."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for path in ("/dev/null", str(pipe)):
        for extra in ([], ["--overwrite"]):
            code, err = _error(capsys, ["shallow-water", *FAST, "--output", path, *extra])
            assert code == 2 and f"--output {path!r} is not a regular file" in err, err
        argv = ["poisson", "--n", "8", "--output", path, "--overwrite"]
        code, err = _error(capsys, argv)
        assert code == 2 and f"--output {path!r} is not a regular file" in err, err
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    code, err = _error(capsys, ["plot", str(pipe)])  # was "does not exist"
    assert code == 2 and f"{str(pipe)!r} is not a regular file" in err
    code, err = _error(capsys, ["shallow-water", "--config", str(pipe)])
    assert code == 2 and f"--config: {str(pipe)!r} is not a regular file" in err
    assert os.listdir(tmp_path) == ["pipe"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and /sys")
@pytest.mark.parametrize(
    "option, path",
    [("--output", "/sys/x.h5"), ("--output", "/proc/x.h5"), ("--plot", "/proc/x.png")],
)
def test_places_that_refuse_files_are_found_before_the_run(tmp_path, capsys, option, path):
    # runs as root too: /proc and /sys refuse new files whatever the permission bits say
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--output", str(out), option, path]
    code, err = _error(capsys, argv)
    assert code == 2
    assert f"{option} {path!r} is not writable" in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "toml, match",
    [
        ('[parameters]\ncoriolis = "abc"\n', "parameter coriolis must be a number"),
        ('[parameters]\nmode_x = "a"\n', "parameter mode_x must be an integer"),
        ("[parameters]\nmode_x = 2.5\n", "parameter mode_x must be an integer"),
        ("[parameters]\nmean_depth = true\n", "parameter mean_depth must be a number"),
        ("[parameters]\ngravity = true\n", "parameter gravity must be a number"),
        ("output = 5\n", "output in"),
        ("plot = 5\n", "plot in"),
        ("devices = 2.5\n", "devices in"),
        ("devices = true\n", "devices in"),
        ("devices = 0\n", "--devices takes a count like 4 or a layout like 2x2"),
        ("devices = [2, -2]\n", "--devices takes a count like 4 or a layout like 2x2"),
        ('t_end = "long"\n', "t_end in"),
        ("nx = 16.0\n", "nx in"),
        ("quiet = 1\n", "quiet in"),
        ("dt = 100.0\ncfl = 0.1\n", "--dt and --cfl exclude each other"),
        ("t-end = 2000.0\nt_end = 4000.0\n", "'t-end' and 't_end' in"),
        # a run setting below [parameters] (where TOML files every key after the header)
        # was an "unknown parameter" of the case; it is pointed to its option
        ("[parameters]\ncoriolis = 1e-4\ndt = 60.0\n", "dt is not a physical parameter here; se"),
        ("[parameters]\nsave-every = 5\n", "set it with --save-every (or save_every at the top"),
        ("[parameters]\nno_cfl_check = true\n", "set it with --no-cfl-check (or no_cfl_check"),
        # a hyphenated key is named as the file spells it (it was named t_end, save_evry)
        ('t-end = "long"\n', "--config: t-end in"),
        ("save-evry = 3\n", "unknown setting(s) ['save-evry'] in"),
    ],
)
def test_config_values_of_the_wrong_type_name_the_setting(tmp_path, capsys, toml, match):
    cfg = tmp_path / "c.toml"
    cfg.write_text('case = "gravity-wave"\n' + toml)
    out = tmp_path / "o.h5"
    code, err = _error(capsys, ["shallow-water", "--config", str(cfg), "--output", str(out)])
    assert code == 2
    assert match in err
    assert "Traceback" not in err
    assert err.count(str(cfg)) <= 1, err  # "dt and cfl" named the file twice
    assert not out.exists()


def test_a_bad_value_from_the_config_file_says_it_came_from_there(tmp_path, capsys):
    """A well-typed but bad value in the config file was reported as '--nx must be a
    positive integer, got -4', an option the user never typed; the message now names the
    file and key, and a value given on the command line is reported as before."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("nx = -4\ndt = -2\n")
    out = tmp_path / "o.h5"
    code, err = _error(capsys, ["shallow-water", "--config", str(cfg), "--output", str(out)])
    assert code == 2
    assert f"--nx must be a positive integer, got -4 (from nx = -4 in --config {str(cfg)!r})" in err
    code, err = _error(
        capsys, ["shallow-water", "--config", str(cfg), "--nx", "0", "--output", str(out)]
    )
    assert code == 2 and err.rstrip().endswith("--nx must be a positive integer, got 0")
    cfg.write_text("nx = -4\n")
    code, err = _error(capsys, ["poisson", "--config", str(cfg), "--output", str(out)])
    assert code == 2 and f"(from nx = -4 in --config {str(cfg)!r})" in err
    assert not out.exists()
    # with --resume the stored run's setting was reported as a --nx the user never typed
    run = tmp_path / "run.h5"
    assert main(["shallow-water", *FAST, "--output", str(run)]) == 0
    cfg.write_text("nx = 24\n")
    code, err = _error(
        capsys, ["shallow-water", "--resume", "--config", str(cfg), "--output", str(run)]
    )
    differs = "--nx 24 differs from the stored 16 (leave it out, or start a new run)"
    assert code == 2 and f"{differs} (from nx = 24 in --config {str(cfg)!r})" in err, err


def test_wrong_parameter_type_on_the_command_line(tmp_path, capsys):
    code, err = _error(
        capsys,
        ["shallow-water", *FAST, "--output", str(tmp_path / "o.h5"), "--param", "coriolis=abc"],
    )
    assert code == 2
    assert "parameter coriolis must be a number (default 0.0001), got 'abc' (str)" in err
    assert "(--param, or the [parameters] table of --config)" in err  # where it came from
    assert list(tmp_path.iterdir()) == []


def test_a_parameter_naming_a_choice_lists_the_choices_and_where_it_came_from(tmp_path, capsys):
    """``--param boundary=sticky`` reached the model's own check, whose message named
    neither the parameter as given nor --param."""
    gyre = ["--case", "wind-gyre", "--n", "8", "--t-end", "3600", "--quiet"]
    argv = ["shallow-water", *gyre, "--output", str(tmp_path / "o.h5")]
    code, err = _error(capsys, [*argv, "--param", "boundary=sticky"])
    assert code == 2
    assert err == (
        "physjax shallow-water: error: parameter boundary must be 'free-slip' or 'no-slip', "
        "got 'sticky' (--param, or the [parameters] table of --config)\n"
    )
    assert list(tmp_path.iterdir()) == []
    assert main([*argv, "--param", "boundary=no-slip"]) == 0


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--devices", "0"], "--devices takes a count like 4 or a layout like 2x2 of positive"),
        (["--devices", "0x2"], "--devices takes a count like 4 or a layout like 2x2 of positive"),
        (["--devices", "1_0"], "--devices takes a count like 4 or a layout like 2x2 of positive"),
        (["--devices", "2x2x1"], r"--devices 2x2x1: a device layout needs 2 positive entries"),
        (["--max-frames", "0"], "--max-frames must be a positive integer, got 0"),
        (["--max-frames", "-3"], "--max-frames must be a positive integer, got -3"),
        (["--dt", "100", "--cfl", "0.1"], "--dt and --cfl exclude each other"),
    ],
)
def test_non_positive_counts_and_conflicting_options(tmp_path, capsys, extra, match):
    code, err = _error(capsys, ["shallow-water", *FAST, "--output", str(tmp_path / "o.h5"), *extra])
    assert code == 2
    assert match in err
    assert len(err.strip().splitlines()) == 1, err  # no usage block (argparse printed one)
    assert list(tmp_path.iterdir()) == []


def test_dt_on_the_command_line_overrides_cfl_from_the_config(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("cfl = 0.1\n")
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--config", str(cfg), "--dt", "360", "--output", str(out)]
    assert main(argv) == 0
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["dt"] == 360.0


@pytest.mark.parametrize("option", ["--dt", "--cfl"])
def test_dt_and_cfl_together_in_the_config_are_refused_whatever_the_command_line(
    tmp_path, capsys, option
):
    """A file holding both was refused alone, but ran (with the option given on the line)
    when --dt or --cfl was also given: one of the file's two values is a mistake."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("dt = 100.0\ncfl = 0.3\n")
    out = tmp_path / "o.h5"
    value = "50" if option == "--dt" else "0.2"
    argv = ["shallow-water", *FAST, "--config", str(cfg), option, value, "--output", str(out)]
    code, err = _error(capsys, argv)
    assert code == 2
    assert "--dt and --cfl exclude each other" in err and f"in --config {str(cfg)!r}" in err
    assert not out.exists()


@pytest.mark.parametrize(
    "command, key, match",
    [
        ("shallow-water", "resume = true", "'resume' in .* is an option of the command line "),
        ("shallow-water", "overwrite = true", "give --overwrite there; a run that replaces"),
        ("shallow-water", 'param = "coriolis=0"', "give --param there, or set the parameters"),
        ("shallow-water", 'config = "b.toml"', "'config' in .* command line only: give --config"),
        ("poisson", "overwrite = true", "'overwrite' in .* is an option of the command line "),
        # poisson has no --resume: an unknown key there, with the list of the allowed ones
        ("poisson", "resume = true", r"unknown setting\(s\) \['resume'\] in .*; allowed: case,"),
        ("shallow-water", "resum = true", r"unknown setting\(s\) \['resum'\] in .*; allowed: "),
    ],
)
def test_command_line_options_in_a_config_are_named_as_such(tmp_path, capsys, command, key, match):
    """resume, overwrite, config and param in a config file were "unknown setting(s)", with
    the list of allowed keys, as for a typo; the docs call them command-line only."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(key + "\n")
    out = tmp_path / "o.h5"
    code, err = _error(capsys, [command, "--config", str(cfg), "--output", str(out)])
    assert code == 2
    assert re.search(match, err), err
    assert not out.exists()


def test_config_parameters_take_hyphens_like_param(tmp_path, capsys):
    """``--param jet-speed=2`` and the top-level ``t-end`` read with hyphens; the
    ``[parameters]`` table did not (jet-speed was an unknown parameter)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("case = 'zonal-jet'\n[parameters]\njet-speed = 2.0\n")
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST[2:], "--config", str(cfg), "--output", str(out)]
    assert main(argv) == 0
    with xr.open_dataset(out) as ds:
        assert ds.attrs["parameter_jet_speed"] == 2.0
    cfg.write_text("[parameters]\njet-speed = 2.0\njet_speed = 3.0\n")
    code, err = _error(capsys, ["shallow-water", "--config", str(cfg), "--output", str(out)])
    assert code == 2 and "'jet-speed' and 'jet_speed' in the [parameters] table" in err


def test_config_takes_quiet_max_frames_and_no_cfl_check(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    # dt = 1800 s is over the CFL limit of this grid (~1200 s): no_cfl_check lets it run
    cfg.write_text("quiet = true\nmax_frames = 1\nno_cfl_check = true\ndt = 1800.0\n")
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST[:-3], "--config", str(cfg), "--output", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # quiet: no progress bar
    assert "stopped at step" in captured.out
    with h5py.File(out, "r") as f:
        assert f["time"].shape[0] == 2  # the initial frame and max_frames = 1
        assert json.loads(f.attrs["configuration"])["cfl_check"] is False


def test_resume_of_a_complete_file_still_checks_the_settings(tmp_path, capsys):
    out = tmp_path / "r.h5"
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    before = out.read_bytes()
    resume = ["shallow-water", "--output", str(out), "--resume", "--quiet"]
    code, err = _error(capsys, [*resume, "--n", "32"])
    assert code == 2 and "--n 32 differs from the stored --nx 16 --ny 16" in err
    code, err = _error(capsys, [*resume, "--case", "zonal-jet"])
    assert code == 2 and "--case 'zonal-jet' differs from the stored 'gravity-wave'" in err
    code, err = _error(capsys, [*resume, "--no-cfl-check"])
    assert code == 2 and "--no-cfl-check differs from the stored run" in err
    code, err = _error(capsys, [*resume, "--devices", "0"])  # was "already complete", exit 0
    assert code == 2 and "--devices takes a count like 4 or a layout like 2x2" in err
    assert out.read_bytes() == before
    assert main([*resume, "--case", "gravity-wave"]) == 0
    assert "already complete; nothing to resume" in capsys.readouterr().out
    # --plot with it still draws the last frame, and leaves the file alone
    png = tmp_path / "r.png"
    assert main([*resume, "--plot", str(png)]) == 0
    assert f"drew its last frame to {png}" in capsys.readouterr().out
    assert png.stat().st_size > 10_000 and out.read_bytes() == before
    code, err = _error(capsys, [*resume, "--plot", str(tmp_path / "r.jpg")])
    assert code == 2 and "--plot must name a .png file" in err


def test_resume_of_a_file_of_another_command_is_refused(tmp_path, capsys):
    # a finished physjax poisson file: static fields, its own configuration
    from physjax.grids import CENTRE, Grid
    from physjax.io import NetCDFWriter, Variable

    out = tmp_path / "p.h5"
    grid = Grid((8, 8), (1.0, 1.0))
    writer = NetCDFWriter(
        out,
        grid,
        [Variable("u", CENTRE, "1", "solution", time_dependent=False)],
        attrs={"title": "physjax poisson", "configuration": {"case": "dirichlet", "method": "cg"}},
    )
    writer.write_static({"u": np.zeros(grid.shape)})
    writer.finish()
    code, err = _error(capsys, ["shallow-water", "--output", str(out), "--resume"])
    assert code == 2
    assert "was not written by physjax shallow-water" in err


def test_plot_subcommand_errors(tmp_path, capsys):
    out = tmp_path / "a.h5"
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    with h5py.File(out, "r") as f:
        frames = f["time"].shape[0]
    code, err = _error(capsys, ["plot", str(out), "--frame", "999"])
    assert code == 2 and f"--frame 999 is out of range: {str(out)!r} has {frames} frames" in err
    assert f"(0 to {frames - 1}, or -1 to -{frames} from the last)" in err
    # a file of one frame (a run stopped after its initial state) was offered
    # "(0 to 0, or -1 to -1 from the last)"
    with h5py.File(out, "a") as f:
        f.attrs["n_frames"] = 1
    for frame in ("1", "-2"):
        code, err = _error(capsys, ["plot", str(out), "--frame", frame])
        assert code == 2
        assert err.rstrip().endswith(
            f"--frame {frame} is out of range: {str(out)!r} has 1 frame (0, or -1)"
        )
    assert main(["plot", str(out), "--frame", "-1"]) == 0 and (tmp_path / "a.png").exists()
    (tmp_path / "a.png").unlink()
    text = tmp_path / "notanhdf5.txt"
    text.write_text("hello\n")
    code, err = _error(capsys, ["plot", str(text)])
    assert code == 2 and f"cannot read {str(text)!r} as a NetCDF4/HDF5 file" in err
    folder = tmp_path / "d.png"
    folder.mkdir()
    code, err = _error(capsys, ["plot", str(out), "--output", str(folder)])
    assert code == 2 and f"--output {str(folder)!r} is a directory" in err
    assert "Traceback" not in err
    code, err = _error(capsys, ["plot", str(tmp_path)])
    assert code == 2 and f"file {str(tmp_path)!r} is a directory" in err
    # an empty --output once drew to the default a.png as if none had been given
    code, err = _error(capsys, ["plot", str(out), "--output", ""])
    assert code == 2 and err == "physjax plot: error: --output must name a .png file, got ''\n"
    assert sorted(os.listdir(tmp_path)) == ["a.h5", "d.png", "notanhdf5.txt"]


def test_plot_of_a_file_that_fails_to_read_names_the_file_not_the_picture(
    tmp_path, capsys, monkeypatch
):
    """A read that meets a frame being appended is tried again; one that keeps failing
    names the input file. It used to be reported as the PNG that 'could not be written'."""
    from physjax.io import _reading

    out = tmp_path / "a.h5"
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    calls = []
    load = xr.Dataset.load

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise OSError("Can't synchronously read data (addr overflow)")
        return load(self, *args, **kwargs)

    monkeypatch.setattr(xr.Dataset, "load", flaky)
    opens = []
    open_dataset = xr.open_dataset

    def truncated_once(*args, **kwargs):  # opened in the middle of an append
        opens.append(1)
        if len(opens) == 1:
            raise OSError("Unable to synchronously open file (truncated file: eof = 96)")
        return open_dataset(*args, **kwargs)

    monkeypatch.setattr(xr, "open_dataset", truncated_once)
    assert main(["plot", str(out), "--output", str(tmp_path / "a.png")]) == 0  # third try
    assert len(calls) == 3 and len(opens) == 4 and (tmp_path / "a.png").exists()
    calls.clear()
    monkeypatch.setattr(_reading, "READ_WAIT", 0.2)
    code, err = _error(capsys, ["plot", str(out), "--output", str(tmp_path / "b.png")])
    assert code == 2 and f"cannot read {str(out)!r}: Can't synchronously read" in err
    assert "could not be written" not in err and not (tmp_path / "b.png").exists()


#: What a reader of a file that a running writer holds or extends meets, as h5py raises it.
_TRANSIENT = {
    "locked": lambda: BlockingIOError(
        11, "Unable to synchronously open file (unable to lock file, errno = 11)"
    ),
    "truncated": lambda: OSError(
        "Unable to synchronously open file (truncated file: eof = 96, stored_eof = 2176)"
    ),
    "addr overflow": lambda: OSError(
        "Can't synchronously read data (addr overflow, addr = 3221, size = 2304, eoa = 3221)"
    ),
    "object header": lambda: KeyError(
        "Unable to synchronously open object (bad object header version number)"
    ),
}


@pytest.fixture(scope="module")
def running_file(tmp_path_factory):
    """A shallow-water file, read as if a run were still appending to it."""
    out = tmp_path_factory.mktemp("running") / "a.h5"
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    return out


def _failing(monkeypatch, path, make, times, where="open"):
    """h5py's open of ``path`` (or, ``where="object"``, its open of the variable zeta)
    fails ``times`` times with ``make()``, then works; the count of failures left."""
    left = {"n": times}
    if where == "open":
        init = h5py.File.__init__

        def opening(self, name, *a, **k):
            if isinstance(name, (str, os.PathLike)) and os.fspath(name) == str(path) and left["n"]:
                left["n"] -= 1
                raise make()
            init(self, name, *a, **k)

        monkeypatch.setattr(h5py.File, "__init__", opening)
    else:
        getitem = h5py.Group.__getitem__

        def getting(self, name):
            if isinstance(name, str) and name.strip("/") == "zeta" and left["n"]:
                left["n"] -= 1
                raise make()
            return getitem(self, name)

        monkeypatch.setattr(h5py.Group, "__getitem__", getting)
    return left


@pytest.mark.parametrize(
    "error, where",
    [(e, "open") for e in _TRANSIENT] + [("addr overflow", "object"), ("object header", "object")],
)
def test_plot_and_poisson_rhs_read_again_what_a_running_writer_leaves_half_done(
    running_file, tmp_path, capsys, monkeypatch, error, where
):
    """`physjax plot` and `physjax poisson --rhs` read a file that a run may be extending
    with one retrying reader. plot retried only a lock or 'truncated' met by xarray: the
    check that physjax wrote the file refused a file being extended as not NetCDF4/HDF5
    ('truncated file', 'addr overflow'), and a bad object header stopped it with a KeyError
    traceback; --rhs retried neither an 'addr overflow' on opening nor a bad header."""
    for argv in (
        ["plot", str(running_file), "--output", str(tmp_path / "a.png")],
        ["poisson", "--quiet", "--rhs", f"{running_file}:zeta", "--bc", "periodic",
         "--output", str(tmp_path / "p.h5")],
    ):  # fmt: skip
        left = _failing(monkeypatch, running_file, _TRANSIENT[error], 3, where)
        code, err = _error(capsys, argv)
        assert code == 0, err
        assert left["n"] == 0  # failed three times, then read
    assert (tmp_path / "a.png").exists() and (tmp_path / "p.h5").exists()


@pytest.mark.parametrize("error", list(_TRANSIENT))
def test_a_read_that_keeps_failing_names_the_file(
    running_file, tmp_path, capsys, monkeypatch, error
):
    """An error that lasts past the wait is one line (exit 2) naming the file, from plot
    and from --rhs alike."""
    from physjax.io import _reading

    monkeypatch.setattr(_reading, "READ_WAIT", 0.2)
    shown = repr(str(running_file))
    for argv, prefix in (
        (["plot", str(running_file), "--output", str(tmp_path / "a.png")], "physjax plot: error: "),
        (["poisson", "--quiet", "--rhs", f"{running_file}:zeta", "--bc", "periodic",
          "--output", str(tmp_path / "p.h5")], "physjax poisson: error: --rhs: "),
    ):  # fmt: skip
        _failing(monkeypatch, running_file, _TRANSIENT[error], 10**6)
        code, err = _error(capsys, argv)
        assert code == 2 and err.startswith(prefix) and err.count("\n") == 1, err
        if error == "locked":
            assert f"{shown} is locked by another process and stayed so for 0.2 s" in err, err
        else:
            message = str(_TRANSIENT[error]()).strip("'")
            assert f"cannot read {shown}: {message}; still so after trying for 0.2 s" in err
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "p.h5").exists()


def test_a_damaged_object_header_is_named_not_a_traceback(
    running_file, tmp_path, capsys, monkeypatch
):
    """A variable whose object header does not read (being rewritten, or damaged) stopped
    plot with a KeyError traceback and --rhs with a RuntimeError one ('Object visitation
    failed'); it is tried again, then named with the file (exit 2)."""
    import shutil

    from physjax.io import _reading

    monkeypatch.setattr(_reading, "READ_WAIT", 0.2)
    bad = tmp_path / "bad.h5"
    shutil.copy(running_file, bad)
    with h5py.File(bad, "r") as f:
        where = h5py.h5o.get_info(f["zeta"].id).addr
    with open(bad, "r+b") as fh:  # the header's version byte and what follows
        fh.seek(where)
        fh.write(b"\xff" * 8)
    for argv in (
        ["plot", str(bad), "--output", str(tmp_path / "a.png")],
        ["poisson", "--quiet", "--rhs", f"{bad}:zeta", "--bc", "periodic",
         "--output", str(tmp_path / "p.h5")],
    ):  # fmt: skip
        code, err = _error(capsys, argv)
        assert code == 2 and err.count("\n") == 1, err
        assert f"cannot read {str(bad)!r}: Unable to synchronously open object (bad object " in err
        assert "if not, the file is damaged" in err
    assert not (tmp_path / "a.png").exists() and not (tmp_path / "p.h5").exists()


def test_output_and_plot_on_the_same_path_are_refused(tmp_path, capsys):
    """The picture would replace the data (it did: exit 0, and only a PNG left)."""
    same = tmp_path / "x.png"
    for command in (["shallow-water", *FAST], ["poisson", "--n", "16", "--quiet"]):
        code, err = _error(capsys, [*command, "--output", str(same), "--plot", str(same)])
        assert code == 2 and f"--output {str(same)!r} names the NetCDF4/HDF5 data file" in err
        assert not same.exists()
    # the same file by another spelling, or through a link
    data = tmp_path / "x.h5"
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.png").symlink_to(data)
    for plot in (tmp_path / "sub" / ".." / "link.png", tmp_path / "link.png"):
        for command in (["shallow-water", *FAST], ["poisson", "--n", "16", "--quiet"]):
            argv = [*command, "--output", str(data), "--plot", str(plot)]
            code, err = _error(capsys, argv)
            assert code == 2 and f"--plot {str(plot)!r} is the output file itself" in err
            assert not data.exists()


def test_config_saved_with_a_byte_order_mark_is_read(tmp_path, capsys):
    """A UTF-8 file saved with a byte-order mark (as some Windows editors do) was refused:
    "is not valid TOML: Invalid statement (at line 1, column 1)", nothing to see there."""
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbfcase = 'no-such-case'\r\n")
    code, err = _error(capsys, ["shallow-water", "--config", str(path), "--output", "o.h5"])
    assert code == 2 and "no-such-case" in err and "not valid TOML" not in err, err


@pytest.mark.parametrize("content", [None, b'case = "gravity-wave\xff"\n'])
def test_config_that_is_a_folder_or_not_utf8_names_config(tmp_path, capsys, content):
    path = tmp_path / "c.toml"
    if content is None:
        path.mkdir()
        match = f"--config: {str(path)!r} is a directory"
    else:
        path.write_bytes(content)
        match = f"--config: {str(path)!r} is not UTF-8 text"
    code, err = _error(capsys, ["shallow-water", "--config", str(path), "--output", "o.h5"])
    assert code == 2 and match in err and "Traceback" not in err


@pytest.mark.parametrize(
    "setting, match",
    [
        ("case", "--case: unknown case ''"),
        ("precision", "--precision must be float32 or float64, got ''"),
        ("output", "--output must name a file, got ''"),
    ],
)
def test_empty_strings_are_refused_not_taken_for_defaults(tmp_path, capsys, setting, match):
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'n = 16\nt_end = 2000.0\n{setting} = ""\n')
    argv = ["shallow-water", "--config", str(cfg), "--quiet"]
    if setting != "output":
        argv += ["--output", str(tmp_path / "o.h5")]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, err = _error(capsys, argv)
        flag, err2 = _error(capsys, ["shallow-water", "--n", "16", f"--{setting}", "", "--quiet"])
    finally:
        os.chdir(cwd)
    # the CLI's own one-line message, from the config file and from the flag alike (not
    # argparse's "invalid choice", nor a default silently taken)
    for status, text in ((code, err), (flag, err2)):
        assert status == 2 and text.startswith(f"physjax shallow-water: error: {match}"), text
        assert text.count("\n") == 1, text
    assert sorted(os.listdir(tmp_path)) == ["e.toml"]


def test_an_empty_config_path_is_refused_not_ignored(tmp_path, capsys):
    # --config "" once ran the case's defaults (a 128² two-day run for shallow-water) into
    # <case>.h5 as if no config had been given
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for command in (["shallow-water", *FAST], ["poisson", "--n", "16", "--quiet"]):
            code, err = _error(capsys, [*command, "--config", ""])
            assert code == 2, err
            assert err == f"physjax {command[0]}: error: --config must name a TOML file, got ''\n"
    finally:
        os.chdir(cwd)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "devices, match",
    [
        # simulated on a CPU before the mesh was checked: 21 GiB and minutes to say this
        ("1000000", "--devices 1000000: 1000000 devices for a grid of 16×16 = 256 cells;"),
        ("3", "--devices 3: the mesh does not divide the grid: ny=16 cannot be split into 3"),
        ("1x32", "--devices 1x32: the mesh does not divide the grid: nx=16 cannot be split"),
        ("4x4x4", "--devices 4x4x4: a device layout needs 2 positive entries, one per grid"),
    ],
)
def test_devices_that_cannot_split_the_grid_are_refused_before_jax_starts(
    tmp_path, capsys, monkeypatch, devices, match
):
    from physjax import cli

    started = []
    monkeypatch.setattr(cli, "setup_jax", lambda *a: started.append(a))
    for resume in ([], ["--resume"]):
        out = tmp_path / "o.h5"
        code, err = _error(
            capsys, ["shallow-water", *FAST, "--output", str(out), "--devices", devices, *resume]
        )
        assert code == 2 and match in err and err.count("\n") == 1, err
        assert started == []  # the devices were never simulated
        if not resume:  # a stopped run, continued on a layout that cannot split it
            assert list(tmp_path.iterdir()) == []
            monkeypatch.undo()
            assert main(["shallow-water", *FAST, "--output", str(out), "--max-frames", "1"]) == 0
            monkeypatch.setattr(cli, "setup_jax", lambda *a: started.append(a))
            before = out.read_bytes()
    assert out.read_bytes() == before


def test_devices_raise_a_smaller_simulated_device_count_already_in_xla_flags(monkeypatch):
    # `physjax … --devices 4` sets the simulated device count; one already in XLA_FLAGS that
    # is too small used to stay and the run stopped with "only 2 available"
    from physjax.cli import setup_jax

    option = "--xla_force_host_platform_device_count"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_cpu_foo=1 {option}=2")
    setup_jax("float32", 4)
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_foo=1 {option}=4"
    monkeypatch.setenv("XLA_FLAGS", f"{option}=8")
    setup_jax("float32", (2, 2))  # more than asked for: left alone
    assert os.environ["XLA_FLAGS"] == f"{option}=8"
    monkeypatch.delenv("XLA_FLAGS")
    setup_jax("float32", 1)
    assert "XLA_FLAGS" not in os.environ


def test_a_folder_given_as_the_picture_is_refused_with_a_picture_name(tmp_path, capsys):
    folder = tmp_path / "d.png"
    folder.mkdir()
    argv = ["shallow-water", *FAST, "--output", str(tmp_path / "x.h5"), "--plot", str(folder)]
    code, err = _error(capsys, argv)
    assert code == 2 and "is a directory; give a file name like out.png" in err
    code, err = _error(capsys, ["shallow-water", *FAST, "--output", str(tmp_path)])
    assert code == 2 and "is a directory; give a file name like out.h5" in err


@pytest.mark.parametrize(
    "argv, match",
    [
        (["shallow-water", *FAST, "--nxx", "16"], "physjax shallow-water: error: unrecognized arg"),
        (["shallow-water", *FAST, "--param", "gravity"], "--param takes NAME=VALUE, got 'gravity'"),
        # a value without a name was looked up as the parameter '' of the case
        (["shallow-water", *FAST, "--param", "=9.81"], "--param takes NAME=VALUE, got '=9.81'"),
        # a shortened option was taken for the one it begins (--meth ran as --method)
        (["poisson", "--quiet", "--meth", "cg"], "physjax poisson: error: unrecognized arguments"),
        (["shallow-water", *FAST, "--t-en", "7200"], "unrecognized arguments: --t-en 7200"),
        (["plot", "x.h5", "--outptu", "a.png"], "physjax plot: error: unrecognized arguments"),
    ],
)
def test_mistyped_options_one_line_naming_the_command(tmp_path, capsys, monkeypatch, argv, match):
    """argparse printed the usage of the top-level command (or a whole usage block) above its
    error, and accepted any unambiguous beginning of an option name."""
    monkeypatch.chdir(tmp_path)
    code, err = _error(capsys, argv)
    assert code == 2
    assert match in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.rstrip().endswith(f"(see physjax {argv[0]} --help)")
    assert list(tmp_path.iterdir()) == []


def test_config_given_twice_is_refused_not_half_read(tmp_path, capsys, monkeypatch):
    # the second file was taken and the first silently dropped: files do not layer
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.toml").write_text("n = 16\n")
    (tmp_path / "b.toml").write_text("quiet = true\n")
    for command in (["shallow-water", *FAST], ["poisson", "--n", "16", "--quiet"]):
        code, err = _error(capsys, [*command, "--config", "a.toml", "--config", "b.toml"])
        assert code == 2
        assert err.startswith(
            f"physjax {command[0]}: error: argument --config: given twice ('a.toml' and "
            "'b.toml'); give one file"
        ), err
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == ["a.toml", "b.toml"]


def test_resume_of_a_file_that_does_not_exist(tmp_path, capsys):
    """It printed HDF5's open error (errno, flags) instead of saying the file was missing."""
    out = tmp_path / "missing.h5"
    code, err = _error(capsys, ["shallow-water", "--output", str(out), "--resume"])
    assert code == 2
    assert f"--resume: {str(out)!r} does not exist; there is no run to continue" in err
    assert len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []  # no file and no lock left


def test_resume_of_a_named_pipe_or_device_is_refused_without_opening_it(tmp_path, capsys):
    """--resume of a named pipe waited for a writer for ever (HDF5 opened it to read the
    run), and of /dev/null it called the file damaged and suggested --overwrite, which
    refuses it: both are refused at once, as a new run's --output is."""
    import threading

    fifo = tmp_path / "pipe.h5"
    os.mkfifo(fifo)
    for path in (str(fifo), os.devnull):
        argv = ["shallow-water", "--output", path, "--resume", "--quiet"]
        result = []
        thread = threading.Thread(
            target=lambda r, a: r.append(_error(capsys, a)), args=(result, argv), daemon=True
        )
        thread.start()
        thread.join(60)
        assert result, f"--resume --output {path} did not return"
        code, err = result[0]
        assert code == 2
        assert f"--resume: {path!r} is not a regular file (a device, pipe or socket)" in err, err
    assert [p.name for p in tmp_path.iterdir()] == ["pipe.h5"]  # no lock file left


def test_plot_of_non_finite_and_constant_fields(tmp_path, capsys):
    """A field with Inf crashed `physjax plot` (OverflowError in the colour scale) and an
    all-NaN frame gave "cannot convert float NaN to integer"; both now draw, the bad cells
    in grey and counted in the panel's title."""
    from physjax._plot import _colour_scale, _time_text

    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    for name, edit in (
        ("inf", lambda h: h.__setitem__((-1, 5, 5), np.inf)),
        ("nan", lambda h: h.__setitem__(-1, np.nan)),
    ):
        bad = tmp_path / f"{name}.h5"
        bad.write_bytes(run.read_bytes())
        with h5py.File(bad, "a") as f:
            h = f["h"][...]
            edit(h)
            f["h"][...] = h
        assert main(["plot", str(bad), "--output", str(tmp_path / f"{name}.png")]) == 0
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    # the scale: finite values only, symmetric for a signed field on a diverging map
    data = np.array([[-2e-5, 1e-5], [np.inf, np.nan]])
    scaled, vmin, vmax, exponent, note = _colour_scale(data, "RdBu_r")
    assert (vmin, vmax, exponent) == (-2.0, 2.0, -5) and "2 NaN/Inf cells" in note
    assert np.isnan(scaled[1]).all() and scaled[0, 0] == -2.0
    _, vmin, vmax, _, note = _colour_scale(np.array([3.0, 5.0]), "viridis")
    assert (vmin, vmax, note) == (3.0, 5.0, "")
    assert "(constant 0)" in _colour_scale(np.zeros(4), "PuOr_r")[4]
    assert "(no finite value)" in _colour_scale(np.full(4, np.nan), "PuOr_r")[4]
    assert [_time_text(t) for t in (0.0, 12000.0, 86400.0, 172800.0)] == [
        "0 s", "12000 s", "1 day", "2 days"
    ]  # fmt: skip
    # a wind gyre spun up for 3 years was titled "t = 1.16e+03 days"
    long_runs = [_time_text(t) for t in (3.1104e7, 8.64e7, 1e8)]
    assert long_runs == ["360 days", "1000 days", "1157 days"]


def test_plot_colour_bar_of_values_that_share_their_first_digits_is_in_the_field_units():
    """A layer thickness of 1000 m ± 5 mm (``physjax plot --vars h``) had its colour bar
    labelled "h [10³ m]" with matplotlib's offset "1e−6+1" over it: two scalings, a value
    of (1 + 10⁻⁶·tick)·10³ m. The power of ten now stays out of the label where the bar
    needs the offset, which then reads in metres ("+1e3"); a field spread from near zero
    keeps the power in its label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from physjax._plot import _colour_scale

    data = 1000.0 + np.linspace(-0.005, 0.005, 16).reshape(4, 4)
    scaled, vmin, vmax, exponent, _ = _colour_scale(data, "viridis")
    assert exponent == 0 and (vmin, vmax) == pytest.approx((999.995, 1000.005))
    fig, ax = plt.subplots()
    bar = fig.colorbar(ax.pcolormesh(scaled, vmin=vmin, vmax=vmax))
    fig.draw_without_rendering()
    assert bar.ax.yaxis.get_offset_text().get_text().endswith("+1e3")  # metres over the bar
    plt.close(fig)
    assert _colour_scale(np.array([2e3, 5e3]), "viridis")[3] == 3  # 2 to 5 (10³ m)
    assert _colour_scale(np.array([-1e-5, 1e-5]), "RdBu_r")[3] == -5


def test_plot_of_a_file_of_other_variables_centres_a_signed_one_on_zero(tmp_path, drawn_figures):
    """A file written with physjax.io.NetCDFWriter of other variables than a run's drew each
    on viridis from its least to its greatest value: a streamfunction of −1 to 5 m² s⁻¹ had
    no colour for zero, where ``--vars`` of the same file drew it on a diverging scale of
    ±5. Both now draw a signed field so; a field of one sign keeps viridis."""

    from physjax.grids import Grid
    from physjax.io import NetCDFWriter, Variable

    path = str(tmp_path / "m.h5")
    psi = np.linspace(-1.0, 5.0, 32, dtype=np.float32).reshape(4, 8)
    variables = [
        Variable("psi", ("centre", "centre"), "m2 s-1", "streamfunction"),
        Variable("T", ("centre", "centre"), "K", "temperature"),
    ]
    writer = NetCDFWriter(path, Grid((4, 8), (1.0, 2.0)), variables, attrs={"case": "mine"})
    writer.append(0.0, 0, {"psi": psi, "T": 280 + psi})
    writer.finish()
    for vars_ in ([], ["--vars", "psi,T"]):
        assert main(["plot", path, "--output", str(tmp_path / "m.png"), *vars_]) == 0
        streamfunction, temperature = [
            ax.collections[0] for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"
        ]
        assert streamfunction.get_clim() == (-5.0, 5.0) and streamfunction.cmap.name == "RdBu_r"
        assert temperature.get_clim() == (279.0, 285.0) and temperature.cmap.name == "viridis"


def test_plot_of_a_3d_solve_reads_only_the_level_it_draws(tmp_path, monkeypatch, drawn_figures):
    """`physjax plot` of a 3-D solve read every variable whole into memory to draw their
    middle z level (a 128³ float64 solve: 86 MB more than a 16³ one, 2 s longer; 512³
    would take 5 GB). It now reads that level alone, and draws and labels it as before."""
    figures, loaded = drawn_figures, []
    load = xr.Dataset.load
    monkeypatch.setattr(
        xr.Dataset, "load", lambda ds, **kw: loaded.append(dict(ds.sizes)) or load(ds, **kw)
    )
    run = tmp_path / "p.h5"
    args = ["poisson", "--case", "dirichlet", "--n", "4", "--nz", "4", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    loaded.clear()
    assert main(["plot", str(run), "--output", str(tmp_path / "p.png")]) == 0
    assert len(loaded) == 1 and (loaded[0]["z"], loaded[0]["z_f"], loaded[0]["x"]) == (1, 1, 4)
    panels = [ax for ax in figures[-1].axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title().split("\n")[1] for ax in panels] == ["at z = 0.625 m"] * 3
    with xr.open_dataset(run, engine="h5netcdf") as ds:
        middle = ds["u"].isel(z=2).values
    np.testing.assert_allclose(np.asarray(panels[0].collections[0].get_array()), middle)


def test_plot_title_of_a_solve_that_did_not_converge_speaks_of_a_solve(tmp_path, monkeypatch):
    """The picture of a poisson solve that did not converge was titled "the run failed: not
    converged after 2 iterations (…)", as if a time-stepping run had; it now says "the solve
    failed: …"."""
    import matplotlib.figure

    titles = []
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda fig, t, **kw: titles.append(t))
    run = tmp_path / "p.h5"
    assert (
        main(["poisson", "--case", "dirichlet", "--n", "8", "--quiet", "--output", str(run)]) == 0
    )
    failed = "failed: not converged after 2 iterations (relative residual 1.15e-05 > rtol 1e-10)"
    with h5py.File(run, "a") as f:
        f.attrs["status"] = failed
    assert main(["plot", str(run), "--output", str(tmp_path / "p.png")]) == 0
    assert titles == [f"physjax poisson, dirichlet\nthe solve {failed}"]


def test_plot_title_says_when_the_run_did_not_end_as_asked(tmp_path, monkeypatch):
    """Only a failed run was named in the plot's title: an interrupted run, one stopped by
    --max-frames and one still running (or killed without a word) looked complete."""
    import matplotlib.figure

    titles = []
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda fig, t, **kw: titles.append(t))
    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    endings = {
        "complete": None,
        "running": "the run has not finished (status 'running')",
        "interrupted: at step 3, t = 300 s": "the run was interrupted: at step 3, t = 300 s",
        "stopped: at step 3, t = 300 s": "the run was stopped: at step 3, t = 300 s",
        "failed: NaN at step 3": "the run failed: NaN at step 3",
    }
    for status, ending in endings.items():
        with h5py.File(run, "a") as f:
            f.attrs["status"] = status
        titles.clear()
        assert main(["plot", str(run), "--output", str(tmp_path / "w.png")]) == 0
        (title,) = titles
        lines = title.split("\n")
        assert lines[0].startswith("physjax gravity-wave, t = ")
        assert lines[1:] == ([] if ending is None else [ending]), status


@pytest.mark.parametrize("case", ["gravity-wave", "wind-gyre"])
def test_plot_panels_of_centre_and_corner_fields_show_the_same_domain(
    tmp_path, drawn_figures, case
):
    """The vorticity panel (ζ on the cell corners, drawn in cells centred on them) went from
    −Δ/2 to L − Δ/2, half a cell off the height panel beside it (0 to L), with other ticks;
    both now show the domain, a periodic axis drawn to L with its first corner again."""

    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", case, "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run), "--plot", str(tmp_path / "w.png")]) == 0
    with xr.open_dataset(run, engine="h5netcdf") as ds:
        lx, ly = (float(ds.attrs[f"parameter_L{a}"]) / 1e3 for a in "xy")
        periodic = ds["x"].attrs["boundary"] == "periodic"
    height, vorticity = [ax for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"]
    for ax in (height, vorticity):
        assert ax.get_xlim() == pytest.approx((0, lx)) and ax.get_ylim() == pytest.approx((0, ly))
    corners = vorticity.collections[0].get_coordinates()  # the mesh's cell corners
    assert corners[..., 0].max() == pytest.approx(lx + lx / 32 if periodic else lx - lx / 32)


def test_plot_panels_of_a_domain_four_times_as_wide_keep_its_proportions(tmp_path, drawn_figures):
    """Whether a panel kept the domain's proportions (up to 4:1) was judged by the span of
    the field's points, a cell less than the domain at the cell centres: a 3 x 1 m solve of
    48 x 3 cells (centres 2.94 x 0.67 m apart, 4.4:1) had its panels stretched to squares,
    and a 4000 x 1000 km run of 32 x 8 cells drew the height so beside a 4:1 vorticity panel.
    The domain's extent decides now."""

    run = tmp_path / "p.h5"
    args = ["poisson", "--case", "dirichlet", "--nx", "48", "--ny", "3", "--lx", "3", "--quiet"]
    assert main([*args, "--output", str(run), "--plot", str(tmp_path / "p.png")]) == 0
    panels = [ax for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3
    for ax in panels:
        assert ax.get_xlim() == pytest.approx((0, 3)) and ax.get_ylim() == pytest.approx((0, 1))
        assert ax.get_aspect() == 1.0  # "equal": a metre is as long along x as along y


@pytest.mark.parametrize("command", ["shallow-water", "poisson"])
def test_plot_of_a_grid_one_cell_wide_fills_the_domain(tmp_path, drawn_figures, command):
    """A run or solve with --nx 1 (a one-dimensional problem in y) drew blank panels: its one
    column of cells had no width, and the x axis spanned ±5 % of the one coordinate value.
    The column now spans the domain, 0 to Lx, on the centre and the face (corner) panels."""

    run, png = tmp_path / "w.h5", tmp_path / "w.png"
    if command == "shallow-water":
        args = ["shallow-water", "--case", "gravity-wave", "--t-end", "3000"]
    else:
        args = ["poisson", "--case", "dirichlet", "--lx", "2.5"]
    assert main([*args, "--nx", "1", "--ny", "8", "--quiet", "--output", str(run)]) == 0
    assert main(["plot", str(run), "--output", str(png)]) == 0
    with xr.open_dataset(run, engine="h5netcdf") as ds:
        lx, ly = (float(ds.attrs[f"parameter_L{a}"]) for a in "xy")
    scale = 1e3 if max(lx, ly) >= 1e4 else 1.0
    panels = [ax for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == (2 if command == "shallow-water" else 3)
    for ax in panels:
        assert ax.get_xlim() == pytest.approx((0, lx / scale))
        assert ax.get_ylim() == pytest.approx((0, ly / scale))
        corners = ax.collections[0].get_coordinates()  # (ny + 1, 2, 2): one column of cells
        assert corners.shape[1] == 2
        assert corners[..., 0].min() == pytest.approx(0)
        assert corners[..., 0].max() == pytest.approx(lx / scale)


def test_plot_of_named_variables_draws_fields_on_the_faces_and_refuses_1d_ones(tmp_path):
    """Panels of named variables: u on the x faces is drawn on the domain like h; a 1-D or
    scalar variable (step, grid, a coordinate) stopped with "not enough values to unpack (expected
    2, got 0)" and is now refused by name."""
    from physjax._plot import plot_panels

    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    png = tmp_path / "w.png"
    assert plot_panels(run, png, names=["u", "v", "h"]) == str(png) and png.stat().st_size > 10_000
    png.unlink()
    for names, says in (
        (["step"], "cannot draw 'step' (one value in a frame) of"),
        (["h", "x"], "cannot draw 'x' (x in a frame) of"),
    ):
        with pytest.raises(ValueError) as e:
            plot_panels(run, png, names=names)
        assert str(e.value).startswith(says) and "a panel shows a variable of (y, x)" in str(
            e.value
        )
    assert not png.exists()


def test_plot_of_a_height_field_with_one_inf_cell_draws_the_others(tmp_path, monkeypatch):
    """One Inf cell in h (a run blowing up) made the mean Inf, so the whole height-anomaly
    panel was NaN and drawn empty, "(no finite value)"; the mean is now of the finite cells,
    and a panel with no finite value is drawn grey, not in the colour of zero."""
    import physjax._plot as plot

    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    with h5py.File(run, "a") as f:
        h = f["h"][...]
        h[-1, 5, 5] = np.inf
        f["h"][...] = h
    scales, colour_scale = [], plot._colour_scale

    def recording(data, cmap):
        scales.append(colour_scale(data, cmap))
        return scales[-1]

    monkeypatch.setattr(plot, "_colour_scale", recording)
    assert main(["plot", str(run), "--output", str(tmp_path / "w.png")]) == 0
    data, vmin, vmax, exponent, note = scales[0]  # the height anomaly, about 1e-2 m
    assert note == " (1 NaN/Inf cells, in grey)"
    assert np.isfinite(data).sum() == 16 * 16 - 1 and (exponent, vmin) == (-3, -vmax)
    assert np.isnan(colour_scale(np.full((2, 2), np.nan), "RdBu_r")[0]).all()


@pytest.mark.parametrize(
    "argv, says",
    [
        ([], "The physjax command: run cases"),
        (["shallow-water"], "Run a rotating shallow-water case"),
        (["poisson"], "Solve ∇·(a∇u) = f"),
        (["plot"], "Draw one frame of a physjax output file as a PNG"),
    ],
)
def test_every_command_says_what_it_does_in_its_help(capsys, argv, says):
    """`physjax plot --help` had no description, and the top-level help showed the
    docstring's reST markup (``physjax``)."""
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert says in out and "``" not in out


@pytest.mark.parametrize(
    "toml, match",
    [
        ('rtol = "1e-8"\n', "rtol in"),
        ('max-iterations = "ten"\n', "--config: max-iterations in"),
        ("bc = 5\n", "bc in"),
        ('bc = ["dirichlet", 5]\n', "bc in"),
        ('shift = "1"\n', "shift in"),
        ("frame = 1.0\n", "frame in"),
        ('lx = "1 km"\n', "lx in"),
        ("method = 1\n", "method in"),
        ("max_iterations = 10\nmax-iterations = 20\n", "'max_iterations' and 'max-iterations' in"),
    ],
)
def test_poisson_config_values_of_the_wrong_type_name_the_file(tmp_path, capsys, toml, match):
    cfg = tmp_path / "p.toml"
    cfg.write_text(toml)
    out = tmp_path / "o.h5"
    code, err = _error(capsys, ["poisson", "--config", str(cfg), "--output", str(out)])
    assert code == 2 and "Traceback" not in err
    assert match in err and "p.toml" in err, err
    assert not out.exists()


def test_param_takes_the_numbers_that_dt_takes():
    """`--param drag=.5e-6` (or `5.`) was refused as the string '.5e-6', TOML having no such
    floats, while `--dt .5e3` ran."""
    from physjax.cli import _parse_param

    assert _parse_param("drag=.5e-6") == ("drag", 5e-7)
    assert _parse_param("coriolis=-1.e-4") == ("coriolis", -1e-4)
    assert _parse_param("mode_x=3") == ("mode_x", 3)  # TOML's integer stays one
    assert _parse_param("boundary=no-slip") == ("boundary", "no-slip")


def test_plot_vars_draws_the_variables_named(tmp_path, capsys, drawn_figures):
    """`physjax plot --vars` picks the panels (plot_panels' names, which the command had no
    way to give): one per name, in the order given, of a run and of a Poisson solve."""

    run, solve = tmp_path / "w.h5", tmp_path / "p.h5"
    assert main(["shallow-water", *FAST, "--output", str(run)]) == 0
    assert main(["poisson", "--n", "16", "--quiet", "--output", str(solve)]) == 0
    for path, given, drawn in (
        (run, "h,u,v", ["h", "u", "v"]),
        (run, " zeta , h", ["zeta", "h"]),  # spaces around the names, as --bc takes them
        (run, "bottom", ["bottom"]),
        (solve, "f,u_exact", ["f", "u_exact"]),
    ):
        png = tmp_path / "v.png"
        code, err = _error(capsys, ["plot", str(path), "--vars", given, "--output", str(png)])
        assert code == 0, err
        panels = [ax for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"]
        assert [ax.get_title().split(":")[0] for ax in panels] == drawn
        assert png.read_bytes()[:4] == b"\x89PNG"
        png.unlink()
    # without --vars: the height anomaly and vorticity, as before
    assert main(["plot", str(run), "--output", str(tmp_path / "d.png")]) == 0
    titles = [ax.get_title() for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"]
    assert titles == ["height anomaly", "relative vorticity"]


def test_plot_vars_refuses_what_it_cannot_draw_and_lists_what_it_can(tmp_path, capsys):
    """A name the file lacks, or a variable that is not a field of (y, x) (step, grid, a
    coordinate), is refused (exit 2) with the names --vars can take; so is a list with an
    empty or a doubled name. Nothing is written."""
    run = tmp_path / "w.h5"
    assert main(["shallow-water", *FAST, "--output", str(run)]) == 0
    capsys.readouterr()
    can = "variables it can draw: h, u, v, zeta, bottom"
    png = tmp_path / "v.png"
    for given, says in (
        ("hh,u", f"{str(run)!r} has no variable 'hh'; {can}"),
        ("eta,zeta,vort", f"{str(run)!r} has no variable 'eta', 'vort'; {can}"),
        ("step", f"cannot draw 'step' (one value in a frame) of {str(run)!r}"),
        ("h,grid", "cannot draw 'grid' (one value in a frame)"),
        ("x_f", "cannot draw 'x_f' (x_f in a frame)"),
        ("", "--vars takes variable names separated by commas, e.g. h,zeta, got ''"),
        ("h,,u", "--vars takes variable names separated by commas, e.g. h,zeta, got 'h,,u'"),
        ("h,zeta,h", "--vars names 'h' more than once"),
    ):
        code, err = _error(capsys, ["plot", str(run), "--vars", given, "--output", str(png)])
        assert code == 2 and err.count("\n") == 1 and says in err, err
        if "cannot draw" in says:
            assert err.rstrip().endswith(f"a panel shows a variable of (y, x) or (z, y, x); {can}")
    assert not png.exists()


@pytest.mark.parametrize("command", [["shallow-water", "--n", "16"], ["poisson", "--n", "16"]])
def test_an_output_ending_with_a_slash_is_named_a_missing_folder(tmp_path, capsys, command):
    """--output new/ (a folder meant, and none there) said "'new/' is not writable: Is a
    directory"; it now says the name ends with '/' and that the folder does not exist."""
    out = str(tmp_path / "new") + "/"
    code, err = _error(capsys, [*command, "--quiet", "--output", out])
    assert code == 2 and err.count("\n") == 1, err
    assert (
        f"--output {out!r} ends with '/', so names a folder, and folder {out[:-1]!r} does not "
        f"exist; give a file name like out.h5, or create the folder and give "
        f"{out + 'out.h5'!r}" in err
    )
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", [["shallow-water", "--n", "16"], ["poisson", "--n", "16"]])
def test_an_output_ending_with_a_slash_after_a_file_name_says_it_is_a_file(
    tmp_path, capsys, command
):
    """--output run.h5/ where run.h5 is a file said "folder 'run.h5' does not exist", of a
    file that is there; it now says that it is a file, and leaves it as it was."""
    run = tmp_path / "run.h5"
    run.write_bytes(b"data")
    out = str(run) + "/"
    code, err = _error(capsys, [*command, "--quiet", "--output", out])
    assert code == 2 and err.count("\n") == 1, err
    assert "does not exist" not in err, err
    assert f"--output {out!r} ends with '/', so names a folder, but {str(run)!r} is a file" in err
    assert os.listdir(tmp_path) == ["run.h5"] and run.read_bytes() == b"data"


def test_plot_that_fails_partway_keeps_the_earlier_picture(tmp_path):
    """A picture whose write failed partway (a full disk, a file-size limit, Ctrl-C) left the
    PNG an earlier `physjax plot` had drawn truncated; it is now drawn under a hidden name
    beside it and moved into place once whole, so the earlier one stays as it was and no
    temporary file is left."""
    import subprocess

    run, png = tmp_path / "w.h5", tmp_path / "w.png"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run), "--plot", str(png)]) == 0
    before = png.read_bytes()
    assert before.startswith(b"\x89PNG") and len(before) > 10_000

    # a process of its own (the limit is its own), where writes past half the picture fail
    # with EFBIG (SIGXFSZ ignored) instead of killing it
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) // 2}, {len(before) // 2}))\n"
        "from physjax.cli import main\n"
        f"sys.exit(main(['plot', {str(run)!r}, '--output', {str(png)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"--output {str(png)!r} could not be written" in done.stderr
    assert png.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["w.h5", "w.png"]
    # through a symbolic link: the picture lands where it points, the link kept
    link = tmp_path / "link.png"
    link.symlink_to(png)
    png.unlink()
    assert main(["plot", str(run), "--output", str(link)]) == 0
    assert link.is_symlink() and png.read_bytes().startswith(b"\x89PNG")


def test_plot_title_gives_the_time_in_the_file_units(tmp_path, monkeypatch):
    """A file whose time axis is in CF's "seconds since 2000-01-01" was titled
    "t = 10957083333333 days" (xarray made dates of it); the time is now given as stored,
    in seconds, and other units by name. A file without a case attribute was titled
    "physjax , t = …"."""
    import matplotlib.figure

    titles = []
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda fig, t, **kw: titles.append(t))
    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    with h5py.File(run, "r") as f:
        t_end = float(f["time"][-1])
    assert t_end == 3000.0
    endings = {
        "s": "physjax gravity-wave, t = 3000 s",
        "seconds since 2000-01-01": "physjax gravity-wave, t = 3000 s",
        "days since 2000-01-01 00:00": "physjax gravity-wave, t = 3000 days since 2000-01-01 00:00",
        "hours": "physjax gravity-wave, t = 3000 hours",
    }
    for units, title in endings.items():
        with h5py.File(run, "a") as f:
            f["time"].attrs["units"] = units
        titles.clear()
        assert main(["plot", str(run), "--output", str(tmp_path / "w.png")]) == 0
        assert titles == [title], units
    with h5py.File(run, "a") as f:
        f["time"].attrs["units"] = "s"
        del f.attrs["case"]
    titles.clear()
    assert main(["plot", str(run), "--output", str(tmp_path / "w.png")]) == 0
    assert titles == ["physjax, t = 3000 s"]


def test_plot_title_shows_a_dollar_of_the_rhs_path_as_written(tmp_path, monkeypatch):
    """A solve of ``--rhs 'a$_$b.nc:f'`` wrote its file but not its picture: matplotlib took
    the text between the two ``$`` of the title for mathematics ("ParseSyntaxException:
    Expected ..."), and ``physjax plot`` of the file failed the same way (``r$1$.nc`` was
    titled "r1.nc", its 1 in italics). Text of the file is now drawn as written."""
    from matplotlib.text import Text

    monkeypatch.chdir(tmp_path)
    x = (np.arange(8) + 0.5) / 8
    f = np.sin(2 * np.pi * x)[None, :] * np.cos(2 * np.pi * x)[:, None]
    rhs = "a$_$b.nc"
    xr.Dataset({"f": (("y", "x"), f)}, coords={"x": x, "y": x}).to_netcdf(rhs, engine="h5netcdf")
    args = ["poisson", "--quiet", "--rhs", f"{rhs}:f", "--bc", "periodic", "--output", "p.h5"]
    assert main([*args, "--plot", "p.png"]) == 0
    assert open("p.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    drawn = []
    monkeypatch.setattr(
        "matplotlib.figure.Figure.suptitle",
        lambda fig, t, **kw: drawn.append(Text(text=t)._preprocess_math(t)),
    )
    assert main(["plot", "p.h5", "--output", "p.png"]) == 0
    assert drawn == [(f"physjax poisson, {rhs}:f", False)]  # plain text, dollars and all


def test_plot_of_a_long_or_bare_png_name_is_written_under_that_name(tmp_path):
    """A picture named to nearly fill the folder's 255-byte limit stopped with "File name
    too long" from its hidden temporary name; a picture named ``.png`` was written to
    ``.png.png`` (matplotlib took the name for an extension alone)."""
    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    long = tmp_path / ("p" * 240 + ".png")
    bare = tmp_path / ".png"
    for png in (long, bare):
        assert main(["plot", str(run), "--output", str(png)]) == 0
        assert png.read_bytes().startswith(b"\x89PNG")
    assert sorted(os.listdir(tmp_path)) == sorted([".png", long.name, "w.h5"])


_TINY = "the run would not advance; lengthen it"


@pytest.mark.parametrize(
    "extra, match",
    [
        (
            ["--t-end", "1e-300"],  # float32, the default
            "--t-end 1e-300 s gives a step of 1e-300 s, below the smallest normal float32 "
            f"number (1.18e-38): {_TINY} or use --precision float64",
        ),
        (
            ["--t-end", "1e-309", "--dt", "1e-310", "--precision", "float64"],
            "--dt 1e-310 s gives a step of 1e-310 s, below the smallest normal float64 "
            f"number (2.23e-308): {_TINY}",
        ),
    ],
)
def test_a_step_below_the_precisions_smallest_number_is_refused(tmp_path, capsys, extra, match):
    """A float32 run to --t-end 1e-300 took one step of dt = 0 (1e-300 rounds to zero; a
    subnormal step is flushed to zero) and reported success with the state unchanged; such
    a step is now refused by name, before anything is written."""
    out = tmp_path / "tiny.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--quiet"]
    code, err = _error(capsys, [*args, *extra, "--output", str(out)])
    assert code == 2 and err == f"physjax shallow-water: error: {match}\n", err
    assert not out.exists()


@pytest.mark.parametrize("command", ["shallow-water", "poisson"])
def test_a_plot_that_cannot_be_drawn_after_the_run_says_the_data_is_kept(
    tmp_path, capsys, monkeypatch, command
):
    """A --plot that fails once the data file is written (a full disk, its folder removed
    during the run) stopped the command with only "--plot … could not be written": nothing
    said that the data was written and whole. A second line now says so, with the command
    that draws the picture again."""
    import errno

    import physjax._plot

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(physjax._plot, "plot_panels", full)
    monkeypatch.chdir(tmp_path)
    if command == "shallow-water":
        args = ["shallow-water", "--case", "gravity-wave", "--n", "8", "--t-end", "600"]
        state = "2 frames, complete"
    else:
        args = ["poisson", "--n", "8"]
        state = "complete"
    code, err = _error(capsys, [*args, "--quiet", "--output", "o.h5", "--plot", "o.png"])
    assert code == 2
    assert err.splitlines() == [
        f"physjax {command}: error: --plot 'o.png' could not be written: [Errno 28] No space "
        "left on device",
        f"o.h5 is written and kept ({state}); draw the picture again with: physjax plot o.h5 "
        "--output o.png",
    ]
    with h5py.File(tmp_path / "o.h5") as f:
        assert f.attrs["status"] == "complete"
    assert sorted(os.listdir(tmp_path)) == ["o.h5"]


def test_no_cfl_check_without_a_dt_gets_a_note(tmp_path, capsys):
    """--no-cfl-check skips the check of a --dt; without one, dt is chosen as --cfl of the
    limit and the option did nothing, in silence. It now gets a note (from the config file
    too), and none where it lets a --dt run."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("no_cfl_check = true\ncfl = 0.25\n")
    note = "physjax shallow-water: note: --no-cfl-check has no effect without --dt: dt is "
    out = ["--output", str(tmp_path / "o.h5"), "--overwrite"]
    for extra, says in (
        (["--no-cfl-check"], "chosen as --cfl 0.5 of the stability limit"),
        (["--config", str(cfg)], "chosen as --cfl 0.25 of the stability limit"),
        (["--no-cfl-check", "--dt", "100"], None),
        ([], None),
    ):
        code, err = _error(capsys, ["shallow-water", *FAST, *out, *extra])
        assert code == 0
        assert err == ("" if says is None else note + says + "\n"), err


def test_a_param_the_model_refuses_in_its_dtype_is_named_as_a_param(tmp_path, capsys):
    """--param gravity=1e-300 (> 0, but 0 in float32) was refused as "gravity must be > 0 in
    the grid's dtype float32 …", the one such message without "parameter" and "--param"; it
    now says both, as the other checks of a parameter do."""
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--output", str(out), "--param", "gravity=1e-300"]
    code, err = _error(capsys, argv)
    assert code == 2
    assert err == (
        "physjax shallow-water: error: parameter gravity must be > 0 in the grid's dtype "
        "float32, got 1e-300, which it holds as 0 (--param, or the [parameters] table of "
        "--config)\n"
    ), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["shallow-water", *FAST], ["poisson", "--n", "8"]])
def test_an_output_through_a_missing_folder_names_that_folder(tmp_path, capsys, command):
    """--output sub/../x.h5 with no folder sub was refused as "'sub/../x.h5' is not
    writable: No such file or directory" (the check of the folder took the path with the
    "sub/.." taken out, which exists); it now names the folder that is missing, or that is
    a file."""
    (tmp_path / "f.h5").write_bytes(b"data")
    for out, says in (
        ("sub/../x.h5", f"passes through folder {str(tmp_path / 'sub')!r}, which does not exist"),
        ("f.h5/../x.h5", f"passes through folder {str(tmp_path / 'f.h5')!r}, which is a file"),
    ):
        code, err = _error(capsys, [*command, "--quiet", "--output", str(tmp_path / out)])
        assert code == 2 and err.count("\n") == 1, err
        assert f"--output {str(tmp_path / out)!r} {says}" in err, err
    assert os.listdir(tmp_path) == ["f.h5"]


def test_resume_through_a_dangling_link_says_the_link_leads_nowhere(tmp_path, capsys):
    """--resume of an --output that is a link to a missing file said "file … does not exist;
    the file is damaged or truncated … replace it with --overwrite"; it now says the link
    leads to a file that does not exist, and leaves the link alone."""
    link = tmp_path / "run.h5"
    link.symlink_to("gone.h5")
    code, err = _error(capsys, ["shallow-water", "--output", str(link), "--resume"])
    assert code == 2
    assert err == (
        f"physjax shallow-water: error: --resume: {str(link)!r} is a symbolic link to "
        "'gone.h5', which does not exist; there is no run to continue\n"
    ), err
    assert os.listdir(tmp_path) == ["run.h5"] and os.readlink(link) == "gone.h5"


@pytest.mark.parametrize(
    "name, text, kind",
    [
        ("r.yaml", "nx: 32\n", "YAML"),
        ("r.yml", "nx: 32\n", "YAML"),
        ("r.json", '{"nx": 32}\n', "JSON"),
    ],
)
def test_a_yaml_or_json_config_is_told_that_config_files_are_toml(
    tmp_path, capsys, name, text, kind
):
    """A --config written in YAML or JSON (named so) got only TOML's parse error ("Expected
    '=' after a key", "Invalid statement"); it is now told that --config reads TOML, and
    how its settings are written."""
    cfg = tmp_path / name
    cfg.write_text(text)
    for command, table in (
        ("shallow-water", " and the physical ones under [parameters]"),
        ("poisson", ""),
    ):
        code, err = _error(capsys, [command, "--config", str(cfg)])
        assert code == 2 and err.count("\n") == 1, err
        assert f"--config: {str(cfg)!r} is not valid TOML: " in err
        assert err.rstrip().endswith(
            f"; --config reads TOML only, not {kind}: write the settings as key = value lines "
            f'(nx = 128, output = "run.h5"){table}'
        ), err
    cfg.write_text("nx: 32\n")  # a .toml file that is not TOML: the parse error alone
    toml = cfg.rename(tmp_path / "r.toml")
    code, err = _error(capsys, ["shallow-water", "--config", str(toml)])
    assert code == 2 and "reads TOML only" not in err and "is not valid TOML" in err
    assert sorted(os.listdir(tmp_path)) == ["r.toml"]


def test_n_help_says_that_nx_and_ny_win_over_it(tmp_path):
    """--help said --n "sets both" nx and ny, but an --nx or --ny given with it wins for its
    axis (docs/shallow_water.md); the help now says so, and that is what a run does."""
    from physjax.cli import build_parser

    parser = build_parser()
    for command in ("shallow-water", "poisson"):
        (n,) = [a for a in parser.commands[command]._actions if a.dest == "n"]
        assert "sets both, except one given by --nx or --ny" in n.help
    out = tmp_path / "o.h5"
    argv = ["shallow-water", "--case", "gravity-wave", "--t-end", "600", "--quiet"]
    assert main([*argv, "--n", "16", "--nx", "8", "--output", str(out)]) == 0
    with h5py.File(out) as f:
        assert f["h"].shape[1:] == (16, 8)


def test_a_param_given_twice_with_two_values_is_refused(tmp_path, capsys):
    # the second --param silently replaced the first (the run took mean_depth = 60): one of
    # the two is a mistake, and which the run used was nowhere said
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--output", str(out), "--no-plot"]
    code, err = _error(capsys, [*argv, "--param", "mean_depth=50", "--param", "mean-depth=60"])
    assert code == 2
    assert "parameter mean_depth (--param) given twice, as 50 and 60: give it once" in err
    assert list(tmp_path.iterdir()) == []
    # the same value twice (50 and 50.0 alike) is one setting
    assert main([*argv, "--param", "mean_depth=50", "--param", "mean_depth=50.0"]) == 0
    with h5py.File(out) as f:
        assert json.loads(f.attrs["parameters"])["mean_depth"] == 50.0


def test_a_grid_too_coarse_for_the_step_or_no_step_is_refused(tmp_path, capsys):
    # --n 1 and --n 2 sampled the step alike in every cell (110 m and 100 m everywhere), and
    # step_height=0 left no step: a uniform state with nothing to adjust, run with exit 0
    from physjax.solvers.shallow_water import make_case

    out = tmp_path / "o.h5"
    argv = ["shallow-water", "--t-end", "600", "--quiet", "--output", str(out)]
    for n, h in (("1", "110"), ("2", "100")):
        code, err = _error(capsys, [*argv, "--n", n])
        assert code == 2
        assert f"grid size nx={n}, ny={n} is too coarse for the geostrophic-adjustment step" in err
        assert f"leaving a uniform h = {h} m with nothing to adjust" in err
    code, err = _error(capsys, [*argv, "--n", "16", "--param", "step_height=0"])
    assert code == 2
    assert "parameter step_height = 0: no step" in err
    assert list(tmp_path.iterdir()) == []
    # three cells across sample the step at two distances: an anomaly to adjust
    case = make_case("geostrophic-adjustment", nx=3, ny=3)
    assert float(case.state.h.max() - case.state.h.min()) > 1.0
    make_case("geostrophic-adjustment", nx=8, ny=8, step_height=-5.0)  # a depression adjusts too


def test_an_absurd_coriolis_for_a_jet_names_it_without_numpy_warnings(tmp_path, capsys):
    # coriolis=1e300 overflowed in the balance's Newton solve: NumPy's RuntimeWarnings (with
    # source lines) came first, and the error blamed the jet alone
    import warnings

    out = tmp_path / "o.h5"
    for case, f in (("zonal-jet", "1e300"), ("barotropic-instability", "1e200")):
        argv = ["shallow-water", "--case", case, "--nx", "16", "--ny", "8", "--quiet"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a RuntimeWarning fails the call
            code, err = _error(capsys, [*argv, "--output", str(out), "--param", f"coriolis={f}"])
        assert code == 2
        assert "RuntimeWarning" not in err
        assert f"too strong for the depth at f = {f.replace('e', 'e+')} s^-1" in err
        assert "weaken the jet, deepen the layer or give a smaller |coriolis|" in err
    assert list(tmp_path.iterdir()) == []


def test_a_step_covering_the_whole_domain_is_refused(tmp_path, capsys):
    # radius 5000 km in the 2000 km domain: every cell was inside the step, the initial state
    # a uniform 110 m with nothing to adjust, and the run went ahead
    from physjax.solvers.shallow_water import make_case

    out = tmp_path / "o.h5"
    argv = ["shallow-water", "--case", "geostrophic-adjustment", "--n", "16", "--t-end", "600"]
    code, err = _error(capsys, [*argv, "--quiet", "--output", str(out), "--param", "radius=5e6"])
    assert code == 2
    assert "parameter radius = 5e+06 m: the step covers the whole 2e+06 x 2e+06 m domain" in err
    assert "radius must be < 1.41421e+06 m" in err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="parameter radius"):
        make_case("geostrophic-adjustment", nx=8, ny=8, Lx=1e6, Ly=1e6, radius=7.1e5)
    # a step reaching into the corners still leaves cells outside it: an anomaly to adjust
    h = np.asarray(make_case("geostrophic-adjustment", nx=16, ny=16, radius=1.3e6).state.h)
    assert np.ptp(h) > 1.0


def test_too_many_steps_to_the_cases_default_end_names_where_it_came_from(tmp_path, capsys):
    # zonal-jet runs 10 inertial periods, 20*pi/|coriolis|: coriolis = 1e-12 makes that
    # 6.3e13 s, and the refusal spoke of a "--t-end 6.28319e+13 s" the user never gave
    out = tmp_path / "o.h5"
    argv = ["shallow-water", "--case", "zonal-jet", "--n", "16", "--quiet", "--output", str(out)]
    code, err = _error(capsys, [*argv, "--param", "coriolis=1e-12"])
    assert code == 2
    assert "--t-end 6.28319e+13" not in err
    assert (
        "steps to the case's default end time 6.28319e+13 s (10 inertial periods, "
        "20*pi/|coriolis| with coriolis = 1e-12; no --t-end given)" in err
    )
    assert list(tmp_path.iterdir()) == []
    # a --t-end given is named as before
    code, err = _error(capsys, [*argv, "--t-end", "1e300"])
    assert code == 2 and "steps to --t-end 1e+300 s" in err


def test_a_stop_lost_in_a_callback_while_a_picture_is_saved_keeps_the_earlier_picture(
    tmp_path, capsys, monkeypatch, signal_in_a_callback
):
    """A Ctrl-C that lands in a weakref callback while `physjax plot` saves its picture
    (matplotlib has such callbacks) is raised again 10 ms later; a picture saved and moved
    into place within those 10 ms replaced the earlier one and the command exited 0, as if
    no signal had come. The stop is now honoured before the picture is moved into place:
    exit 130, the earlier picture kept, no temporary file left."""
    import signal

    from matplotlib.figure import Figure

    from physjax import cli

    run, png = tmp_path / "p.h5", tmp_path / "p.png"
    assert main(["poisson", "--n", "16", "--quiet", "--output", str(run)]) == 0
    assert main(["plot", str(run), "--output", str(png)]) == 0
    capsys.readouterr()
    before = png.read_bytes()
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        original(self, *args, **kwargs)  # the new picture whole, not yet moved into place
        signal_in_a_callback(signal.SIGINT)

    # the timer's signal not yet delivered when the picture is moved into place
    monkeypatch.setattr(cli._Interrupts, "_signal_again", lambda self: None)
    ignored = []  # what Python would print as "Exception ignored in …"
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    monkeypatch.setattr(Figure, "savefig", savefig)
    code = main(["plot", str(run), "--output", str(png)])
    err = capsys.readouterr().err
    assert code == 130 and not ignored, err
    assert err.strip().splitlines()[-1] == "physjax plot: interrupted"
    assert png.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["p.h5", "p.png"]


def test_a_ctrl_c_while_the_allocator_is_tuned_ends_with_one_line(tmp_path, capsys, monkeypatch):
    """Between parsing the command and running it, ``tune_cpu_allocator`` (about 1.4 ms: it
    looks libc up through ldconfig) was outside both of the command's ``try`` blocks: a
    Ctrl-C or SIGTERM there left ``main`` as a ``KeyboardInterrupt`` (a traceback) instead of
    status 130 and one line."""
    from physjax import _memory

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(_memory, "tune_cpu_allocator", interrupted)
    try:
        code = main(["poisson", "--n", "16", "--quiet", "--output", str(tmp_path / "p.h5")])
    except KeyboardInterrupt:
        code = "KeyboardInterrupt raised out of main"
    err = capsys.readouterr().err
    assert code == 130, err
    assert err.strip().splitlines() == ["physjax: interrupted"]
    assert os.listdir(tmp_path) == []


def test_shallow_water_case_names_are_the_registry_s():
    """The parser lists the cases from a plain tuple (no solver import): it must name every
    registered case, in the registry's order."""
    from physjax.cli import SW_CASE_NAMES
    from physjax.solvers.shallow_water import CASES

    assert SW_CASE_NAMES == tuple(CASES)


def test_help_and_bad_options_do_not_import_jax():
    """``physjax --help``, a sub-command's help and an option nobody knows are answered by
    the parser alone: neither jax nor the file libraries are imported (they took ~2 s)."""
    import subprocess

    code = """
import contextlib, io, sys
from physjax.cli import main
for argv in (["--help"], ["--version"], ["shallow-water", "--help"], ["poisson", "--help"],
             ["plot", "--help"], ["shallow-water", "--nxx", "3"], ["poisson", "--nxx", "3"],
             ["plot"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
heavy = ("jax", "equinox", "diffrax", "h5py", "h5netcdf", "xarray", "matplotlib")
print(sorted(m for m in heavy if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_plot_does_not_import_jax(tmp_path):
    """``physjax plot FILE`` reads and draws with h5py, xarray and matplotlib: the output
    module imported the grids, and with them jax (~1.7 s of a ~4 s plot)."""
    import subprocess

    from physjax.grids import Grid
    from physjax.io import NetCDFWriter, Variable

    path = str(tmp_path / "m.h5")
    h = np.linspace(-1.0, 5.0, 32, dtype=np.float32).reshape(4, 8)
    variables = [Variable("h", ("centre", "centre"), "m", "height")]
    writer = NetCDFWriter(path, Grid((4, 8), (1.0, 2.0)), variables, attrs={"case": "mine"})
    writer.append(0.0, 0, {"h": h})
    writer.finish()
    code = f"""
import sys
from physjax.cli import main
assert main(["plot", {path!r}, "--output", {str(tmp_path / "m.png")!r}]) == 0
print(sorted(m for m in ("jax", "equinox", "diffrax") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"  # after the "wrote m.png" line
    assert (tmp_path / "m.png").is_file()


def test_a_bad_shallow_water_setting_is_answered_without_importing_jax():
    """``physjax shallow-water --nx -4`` (or an unknown case, a bad ``--devices``) is
    refused by checks that need no solver: jax and h5py are imported only for a run whose
    settings passed them (the refusal took ~2 s)."""
    import subprocess

    code = """
import contextlib, io, sys
from physjax.cli import main
errors = io.StringIO()
for argv in (["--nx", "-4"], ["--case", "nope"], ["--devices", "0"], ["--max-frames", "0"]):
    with contextlib.redirect_stderr(errors):
        assert main(["shallow-water", *argv]) == 2
heavy = ("jax", "equinox", "diffrax", "h5py", "h5netcdf", "physjax.solvers")
print(sorted(m for m in heavy if m in sys.modules))
print(errors.getvalue(), file=sys.stderr)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert done.stderr.splitlines()[:4] == [
        "physjax shallow-water: error: --nx must be a positive integer, got -4",
        "physjax shallow-water: error: --case: unknown case 'nope'; choose one of "
        "geostrophic-adjustment, zonal-jet, barotropic-instability, gravity-wave, wind-gyre",
        "physjax shallow-water: error: --devices takes a count like 4 or a layout like 2x2 of "
        "positive integers, got '0'",
        "physjax shallow-water: error: --max-frames must be a positive integer, got 0",
    ]


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_non_positive_save_every_is_refused_before_any_file(tmp_path, capsys, value):
    """`--save-every` 0 or negative: exit 2 naming the option, and no file."""
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--output", str(out), "--save-every", value]
    code, err = _error(capsys, argv)
    assert code == 2
    assert f"--save-every must be a positive integer, got {value}" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value, shown", [("0", "0.0"), ("-5", "-5.0")])
def test_a_non_positive_t_end_is_named(tmp_path, capsys, value, shown):
    """A zero or negative `--t-end` is refused as such, before any file."""
    argv = ["shallow-water", *FAST, "--output", str(tmp_path / "o.h5"), "--t-end", value]
    code, err = _error(capsys, argv)
    assert code == 2
    assert f"--t-end must be a finite number > 0, got {shown}" in err
    assert list(tmp_path.iterdir()) == []


def _panels(figure):
    return [ax for ax in figure.axes if ax.get_label() != "<colorbar>"]


def test_plot_frame_draws_the_frame_asked_for(tmp_path, monkeypatch, drawn_figures):
    """`physjax plot --frame K` draws frame K's height anomaly and vorticity."""
    import physjax._plot as plot

    run = tmp_path / "w.h5"
    assert main(["shallow-water", *FAST, "--output", str(run)]) == 0
    drawn, colour_scale = [], plot._colour_scale
    monkeypatch.setattr(
        plot, "_colour_scale", lambda data, cmap: drawn.append(data) or colour_scale(data, cmap)
    )
    with xr.open_dataset(run, engine="h5netcdf", decode_times=False) as ds:
        h, zeta = ds["h"].values, ds["zeta"].values
        assert ds.sizes["time"] >= 3
    ny, nx = h.shape[1:]
    for frame in (0, 1):
        drawn.clear()
        assert (
            main(["plot", str(run), "--frame", str(frame), "--output", str(tmp_path / "p.png")])
            == 0
        )
        anomaly, vorticity = drawn
        np.testing.assert_allclose(anomaly, h[frame] - h[frame].mean(), rtol=0, atol=1e-12)
        np.testing.assert_array_equal(vorticity[:ny, :nx], zeta[frame])
    assert np.abs(h[0] - h[-1]).max() > 1e-4  # the frames differ: the check above can fail


def test_plot_height_anomaly_is_of_the_surface_over_the_bottom(tmp_path, drawn_figures):
    """The height-anomaly panel is of the surface h + b: a lake at rest over a bump is flat."""
    run = tmp_path / "w.h5"
    assert main(["shallow-water", *FAST, "--output", str(run)]) == 0
    with h5py.File(run, "a") as f:
        ny, nx = f["bottom"].shape
        bump = np.zeros((ny, nx))
        bump[4:9, 3:12] = 8.0  # exact in binary: h + b is exactly the depth
        f["bottom"][...] = bump
        h = f["h"][...]
        h[-1] = 100.0 - bump
        f["h"][...] = h
    assert main(["plot", str(run), "--output", str(tmp_path / "p.png")]) == 0
    height = _panels(drawn_figures[-1])[0]
    assert height.get_title() == "height anomaly (constant 0)"
    assert np.asarray(height.collections[0].get_array()).max() == 0
    assert np.asarray(height.collections[0].get_array()).min() == 0


def test_plot_colour_bars_name_the_panels_and_their_units(tmp_path, drawn_figures):
    """The colour bars name each panel's quantity and units."""
    run = tmp_path / "w.h5"
    assert main(["shallow-water", *FAST, "--output", str(run)]) == 0
    assert main(["plot", str(run), "--output", str(tmp_path / "p.png")]) == 0
    # each panel's colour bar is an inset axes of it (_plot._bar_beside)
    bars = [bar.get_ylabel() for ax in _panels(drawn_figures[-1]) for bar in ax.child_axes]
    assert len(bars) == 2, bars
    power = r"(\$10\^\{-?\d+\}\$ )?"
    assert re.fullmatch(rf"height anomaly \[{power}m\]", bars[0]), bars
    assert re.fullmatch(rf"relative vorticity \[{power}s\$\^\{{-1\}}\$\]", bars[1]), bars


def test_cfl_on_the_command_line_overrides_dt_from_the_config(tmp_path):
    """The reverse of the --dt-over-cfl case: a file's dt was kept next to --cfl, and the
    run took the file's fixed step, the --cfl typed on the command line silently ignored."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("dt = 360.0\n")
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--config", str(cfg), "--cfl", "0.25", "--output", str(out)]
    assert main(argv) == 0
    with h5py.File(out, "r") as f:
        config = json.loads(f.attrs["configuration"])
    assert config["cfl"] == 0.25 and config["dt_requested"] is None, config
    assert config["dt"] != 360.0


def test_devices_that_cannot_split_a_non_square_grid_are_refused_before_jax_starts(
    tmp_path, capsys, monkeypatch
):
    """A mesh that cannot split a non-square grid is refused before jax starts, naming ny."""
    from physjax import cli

    started = []
    monkeypatch.setattr(cli, "setup_jax", lambda *a: started.append(a))
    out = tmp_path / "o.h5"
    # 4x1 splits ny = 6 four ways (it does not); the transposed grid, ny = 16, it would
    argv = ["shallow-water", *FAST, "--nx", "16", "--ny", "6", "--devices", "4x1"]
    code, err = _error(capsys, [*argv, "--output", str(out)])
    assert code == 2 and "--devices 4x1: the mesh does not divide the grid" in err, err
    assert "ny=6" in err, err
    assert started == []  # refused before any device was simulated
    assert list(tmp_path.iterdir()) == []


def test_no_plot_on_the_command_line_overrides_the_configs_plot(tmp_path, capsys):
    """docs: --no-plot draws no picture "over a config file's plot (not with --plot)"."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"plot = {str(tmp_path / 'q.png')!r}\n")
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--config", str(cfg), "--output", str(out)]
    assert main([*argv, "--no-plot"]) == 0
    assert not (tmp_path / "q.png").exists()
    with h5py.File(out, "r") as f:
        assert json.loads(f.attrs["configuration"])["plot"] is None
    code, err = _error(capsys, [*argv, "--no-plot", "--plot", str(tmp_path / "r.png")])
    assert code == 2 and "--plot and --no-plot exclude each other" in err


@pytest.mark.parametrize(
    "toml, ok",
    [
        ("cfl_check = true\nno_cfl_check = true\n", False),
        ("cfl_check = false\nno_cfl_check = false\n", False),
        ("cfl_check = false\nno_cfl_check = true\n", True),
    ],
)
def test_config_cfl_check_and_no_cfl_check_must_agree(tmp_path, capsys, toml, ok):
    """A config's cfl_check and no_cfl_check must agree; agreeing, the check is off."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml + "dt = 1800.0\n")  # over this grid's limit (~1200 s)
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST[:-3], "--quiet", "--config", str(cfg), "--output", str(out)]
    code, err = _error(capsys, argv)
    if ok:
        assert code == 0, err
        with h5py.File(out, "r") as f:
            assert json.loads(f.attrs["configuration"])["cfl_check"] is False
    else:
        assert code == 2 and "cfl_check and no_cfl_check contradict each other" in err, err
        assert not out.exists()


@pytest.mark.parametrize(
    "toml, key, got",
    [
        ("save_every = 5.0\n", "save_every", "5.0"),
        ("save-every = 5.0\n", "save-every", "5.0"),
        ("max_frames = 1.0\n", "max_frames", "1.0"),
    ],
)
def test_config_counts_given_as_floats_are_refused(tmp_path, capsys, toml, key, got):
    """Counts in a config given as floats (5.0) are refused as not integers."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('case = "gravity-wave"\n' + toml)
    out = tmp_path / "o.h5"
    code, err = _error(capsys, ["shallow-water", "--config", str(cfg), "--output", str(out)])
    assert code == 2, err
    assert f"--config: {key} in {str(cfg)!r} must be an integer, got {got} (float)" in err, err
    assert not out.exists()
