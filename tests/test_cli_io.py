"""The physjax command and its NetCDF4 output: format, resume, blow-up, bad input."""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import xarray as xr

from physjax.cli import main

FAST = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "10", "--quiet"]


def _run(tmp_path, *extra, name="out.h5"):
    out = tmp_path / name
    code = main(["shallow-water", *FAST, "--output", str(out), *extra])
    return code, out


def test_output_file_format(tmp_path):
    code, out = _run(tmp_path, "--precision", "float64", "--plot", str(tmp_path / "q.png"))
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete"
        assert ds.attrs["case"] == "gravity-wave"
        assert ds.attrs["physjax_version"]
        assert '"n_steps"' in ds.attrs["configuration"]
        assert ds.attrs["parameter_mean_depth"] == 100.0
        assert ds["h"].dims == ("time", "y", "x")
        assert ds["u"].dims == ("time", "y", "x_f")
        assert ds["v"].dims == ("time", "y_f", "x")
        assert ds["zeta"].dims == ("time", "y_f", "x_f")
        assert ds["h"].dtype == np.float64
        for name in [*ds.data_vars, *ds.coords]:
            assert ds[name].attrs.get("units") is not None, name
            assert ds[name].attrs.get("long_name"), name
        assert ds["x_f"].attrs["c_grid_axis_shift"] == -0.5
        assert ds["x"].attrs["axis"] == "X"
        n = ds.sizes["time"]
        assert ds["step"].values[0] == 0 and ds["time"].values[0] == 0.0
        np.testing.assert_allclose(ds["time"].values[-1], 7200.0, rtol=1e-12)
        assert n == 1 + int(np.ceil(ds["step"].values[-1] / 10))
        # mean depth held by the wave file
        assert abs(float(ds["h"].isel(time=-1).mean()) - 100.0) < 1e-9
    with h5py.File(out, "r") as f:
        assert f["h"].shape[1:] == (16, 16)
        assert f.attrs["status"] in (b"complete", "complete")
    assert (tmp_path / "q.png").stat().st_size > 10_000


def test_resume_equals_uninterrupted_bit_for_bit(tmp_path):
    args = [
        "--case",
        "barotropic-instability",
        "--nx",
        "32",
        "--ny",
        "16",
        "--t-end",
        "20000",
        "--save-every",
        "8",
        "--precision",
        "float64",
        "--quiet",
    ]
    full = tmp_path / "full.h5"
    part = tmp_path / "part.h5"
    assert main(["shallow-water", *args, "--output", str(full)]) == 0
    assert main(["shallow-water", *args, "--output", str(part), "--max-frames", "2"]) == 0
    with xr.open_dataset(part) as ds:
        assert ds.attrs["status"] == "running"
        assert ds.sizes["time"] == 3
    assert main(["shallow-water", "--output", str(part), "--resume", "--quiet"]) == 0
    with xr.open_dataset(full) as a, xr.open_dataset(part) as b:
        assert b.attrs["status"] == "complete"
        assert a.sizes["time"] == b.sizes["time"] > 4
        for name in ("h", "u", "v", "zeta", "time", "step"):
            assert np.array_equal(a[name].values, b[name].values), name


@pytest.mark.multidevice
def test_devices_option_matches_single_device(tmp_path):
    args = [
        "--case",
        "wind-gyre",
        "--n",
        "16",
        "--t-end",
        "200000",
        "--save-every",
        "20",
        "--precision",
        "float64",
        "--quiet",
    ]
    one, four = tmp_path / "one.h5", tmp_path / "four.h5"
    assert main(["shallow-water", *args, "--output", str(one)]) == 0
    assert main(["shallow-water", *args, "--devices", "2x2", "--output", str(four)]) == 0
    with xr.open_dataset(one) as a, xr.open_dataset(four) as b:
        assert b.attrs["status"] == "complete"
        assert float(abs(a["u"] - b["u"]).max()) <= 1e-12
        assert float(abs(b["u"].isel(time=-1)).max()) > 1e-4  # the wind did spin it up


def test_blow_up_stops_with_step_and_keeps_frames(tmp_path, capsys):
    out = tmp_path / "boom.h5"
    code = main(
        [
            "shallow-water",
            "--case",
            "geostrophic-adjustment",
            "--n",
            "16",
            "--dt",
            "6000",
            "--t-end",
            "6000000",
            "--save-every",
            "5",
            "--no-cfl-check",
            "--quiet",
            "--output",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 3
    assert "blew up (NaN/Inf) at step" in err and "t = " in err
    step = int(err.split("at step ")[1].split(",")[0])
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"].startswith("failed: NaN/Inf at step")
        assert ds.sizes["time"] >= 2
        assert np.isfinite(ds["h"].values).all()
        assert ds["step"].values[-1] < step <= ds["step"].values[-1] + 5


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--nx", "0"], "nx must be a positive integer"),
        (["--n", "-8"], "must be a positive integer"),
        (["--param", "mean_depth=-5"], "mean_depth must be > 0"),
        (["--param", "mean_depth=0"], "mean_depth must be > 0"),
        (["--dt", "1e5"], "breaks the CFL stability limit"),
        (["--dt", "-3"], "--dt must be a finite number > 0"),
        (["--case", "nope"], "unknown case 'nope'"),
        (["--devices", "1x4", "--nx", "30"], "mesh does not divide the grid: nx=30"),
        (["--devices", "64"], "devices=64 requested"),
        (["--precision", "float16"], "--precision must be float32 or float64"),
        (["--cfl", "3"], "--cfl must be in"),
        (["--param", "bogus=1"], "unknown parameter"),
        (["--plot", "x.jpg"], "--plot must name a .png"),
    ],
)
def test_bad_input_clear_error_and_no_file(tmp_path, capsys, extra, match):
    code, out = _run(tmp_path, *extra)
    err = capsys.readouterr().err
    assert code == 2
    assert match in err
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_unwritable_output_and_bad_config(tmp_path, capsys):
    assert main(["shallow-water", *FAST, "--output", str(tmp_path / "no" / "dir" / "x.h5")]) == 2
    assert "does not exist" in capsys.readouterr().err
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if not os.access(ro, os.W_OK):  # root ignores permission bits
            assert main(["shallow-water", *FAST, "--output", str(ro / "x.h5")]) == 2
            assert "not writable" in capsys.readouterr().err
    finally:
        os.chmod(ro, 0o700)
    assert main(["shallow-water", *FAST, "--output", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("case = 'zonal-jet\nnx = 3\n")
    assert main(["shallow-water", "--config", str(bad), "--output", str(tmp_path / "c.h5")]) == 2
    assert "is not valid TOML" in capsys.readouterr().err
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("case = 'zonal-jet'\nresolution = 3\n")
    assert (
        main(["shallow-water", "--config", str(unknown), "--output", str(tmp_path / "c.h5")]) == 2
    )
    assert "unknown setting(s) ['resolution']" in capsys.readouterr().err
    missing = tmp_path / "missing.toml"
    assert main(["shallow-water", "--config", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "c.h5").exists()


def test_config_file_and_command_line_precedence(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        "case = 'zonal-jet'\nnx = 16\nny = 8\nt_end = 3600.0\nprecision = 'float64'\n"
        "[parameters]\njet_speed = 2.0\n"
    )
    out = tmp_path / "jet.h5"
    assert (
        main(["shallow-water", "--config", str(cfg), "--nx", "24", "--output", str(out), "--quiet"])
        == 0
    )
    with xr.open_dataset(out) as ds:
        assert ds.attrs["case"] == "zonal-jet"
        assert ds.sizes["x"] == 24 and ds.sizes["y"] == 8
        assert ds.attrs["parameter_jet_speed"] == 2.0
        assert 1.0 < float(ds["u"].isel(time=0).max()) <= 2.0  # the default jet is 5 m/s


def test_plot_subcommand(tmp_path):
    code, out = _run(tmp_path)
    assert code == 0
    png = tmp_path / "p.png"
    assert main(["plot", str(out), "--output", str(png), "--frame", "0"]) == 0
    assert png.stat().st_size > 10_000


def test_script_wrapper_runs(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "run_shallow_water.py")
    out = tmp_path / "s.h5"
    res = subprocess.run(
        [sys.executable, script, *FAST, "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert f"to {out}" in res.stdout
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete"


def test_cpu_allocator_tuning():
    import platform

    code = "import physjax; print(physjax.tune_cpu_allocator())"
    env = {k: v for k, v in os.environ.items() if k != "PHYSJAX_NO_ALLOCATOR_TUNING"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    expected = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert out.stdout.strip() == str(expected)
    disabled = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PHYSJAX_NO_ALLOCATOR_TUNING": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert disabled.stdout.strip() == "False"


def test_devices_from_config_file(tmp_path, capsys):
    cfg = tmp_path / "d.toml"
    cfg.write_text('case = "gravity-wave"\nn = 16\nt_end = 3600.0\ndevices = "2x2"\n')
    out = tmp_path / "d.h5"
    assert main(["shallow-water", "--config", str(cfg), "--output", str(out), "--quiet"]) == 0
    with xr.open_dataset(out) as ds:
        assert '"devices": [2, 2]' in ds.attrs["configuration"]
    cfg.write_text('devices = "2y2"\n')
    for command in ("shallow-water", "poisson"):
        assert main([command, "--config", str(cfg), "--output", str(tmp_path / "e.h5")]) == 2
        assert "--devices takes a count like 4 or a layout like 2x2" in capsys.readouterr().err
    assert not (tmp_path / "e.h5").exists()


def test_resume_refuses_settings_that_differ_from_the_stored_run(tmp_path, capsys):
    out = tmp_path / "r.h5"
    args = [*FAST, "--save-every", "2", "--param", "amplitude=0.02", "--output", str(out)]
    assert main(["shallow-water", *args, "--max-frames", "2"]) == 0
    with h5py.File(out, "r") as f:
        frames = f["time"].shape[0]
    for extra, match in (
        (["--precision", "float64"], "--precision 'float64' differs from the stored 'float32'"),
        (["--n", "32"], "--nx 32 differs from the stored 16"),
        (["--cfl", "0.3"], "--cfl 0.3 differs from a stored dt"),
        (["--param", "amplitude=0.05"], "parameter amplitude=0.05 differs from the stored 0.02"),
    ):
        code = main(["shallow-water", "--output", str(out), "--resume", "--quiet", *extra])
        assert code == 2
        assert match in capsys.readouterr().err
        with h5py.File(out, "r") as f:
            assert f["time"].shape[0] == frames and f.attrs["status"] == "running"
    # the same settings again (a default parameter spelled out too) continue the run
    code = main(["shallow-water", *args, "--resume", "--param", "gravity=9.81"])
    assert code == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete" and f["time"].shape[0] > frames
