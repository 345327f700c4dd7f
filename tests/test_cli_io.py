"""The physjax command and its NetCDF4 output: format, resume, blow-up, bad input."""

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from physjax.cli import main
from physjax.io import NetCDFWriter
from physjax.solvers.shallow_water import ShallowWater

FAST = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "10", "--quiet"]


def _meshes_advanced_on(monkeypatch):
    """The list to which every ShallowWater.advance call adds its mesh's shape (or None)."""
    meshes, advance = [], ShallowWater.advance

    def spy(self, *a, mesh=None, **k):
        meshes.append(None if mesh is None else dict(mesh.shape))
        return advance(self, *a, mesh=mesh, **k)

    monkeypatch.setattr(ShallowWater, "advance", spy)
    return meshes


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
        # CF: elapsed seconds stay plain floats (a CF time coordinate, axis "T", would need
        # "units since date"); int64 (step) needs CF-1.9 or later
        assert ds["time"].dtype == np.float64 and ds["time"].attrs["units"] == "s"
        for name in [*ds.data_vars, *ds.coords]:
            if ds[name].attrs.get("axis") == "T" or ds[name].attrs.get("standard_name") == "time":
                assert " since " in ds[name].attrs["units"], name
        cf = ds.attrs["Conventions"].split()[0]
        assert cf.startswith("CF-") and ds["step"].dtype == np.int64
        assert tuple(int(k) for k in cf[3:].split(".")) >= (1, 9)
        # SGRID: nodes (corners) at the low faces x_f, as many cells x, the extra cell beyond
        # the last stored node: padding "high" (xgcm: x_f left of x, shift -0.5)
        topo = ds["grid"].attrs
        assert topo["cf_role"] == "grid_topology" and topo["topology_dimension"] == 2
        assert topo["node_dimensions"] == "x_f y_f"
        assert topo["face_dimensions"] == "x: x_f (padding: high) y: y_f (padding: high)"
        assert topo["face_coordinates"] == "x y" and topo["node_coordinates"] == "x_f y_f"
        dx = float(ds["x"][1] - ds["x"][0])
        assert ds.sizes["x"] == ds.sizes["x_f"] and float(ds["x_f"][0]) == 0.0
        np.testing.assert_allclose(ds["x"].values - ds["x_f"].values, dx / 2, rtol=1e-12)
        locations = {name: ds[name].attrs["location"] for name in ("h", "u", "v", "zeta")}
        assert locations == {"h": "face", "u": "edge1", "v": "edge2", "zeta": "node"}
        assert all(ds[name].attrs["grid"] == "grid" for name in locations)
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


def test_files_are_understood_by_xgcm_and_cf_xarray(tmp_path):
    # The staggering metadata read by the tools a user would reach for: xgcm builds its
    # axes from `axis` and `c_grid_axis_shift` alone, and its own differences of u and v
    # give back the relative vorticity stored at the corners; cf_xarray finds the axes and
    # the SGRID topology variable.
    import cf_xarray  # noqa: F401  (registers the .cf accessor; both are in the test extra)
    import xgcm

    out = tmp_path / "b.h5"
    args = ["--case", "barotropic-instability", "--nx", "32", "--ny", "16", "--t-end", "20000"]
    assert (
        main(["shallow-water", *args, "--precision", "float64", "--quiet", "--output", str(out)])
        == 0
    )
    with xr.open_dataset(out) as ds:
        # the file says which axes wrap (a periodic channel between walls)
        assert [ds[c].attrs["boundary"] for c in ("x", "x_f", "y", "y_f")] == [
            "periodic",
            "periodic",
            "wall",
            "wall",
        ]
        padding = {
            c.upper(): "periodic" if ds[c].attrs["boundary"] == "periodic" else "extend"
            for c in "xy"
        }
        grid = xgcm.Grid(ds, padding=padding)
        assert set(grid.axes) == {"X", "Y"}
        assert grid.axes["X"].coords == {"center": "x", "left": "x_f"}
        assert grid.axes["Y"].coords == {"center": "y", "left": "y_f"}
        dx, dy = float(ds["x"][1] - ds["x"][0]), float(ds["y"][1] - ds["y"][0])
        zeta = grid.diff(ds["v"], "X") / dx - grid.diff(ds["u"], "Y") / dy
        assert zeta.dims == ds["zeta"].dims
        scale = float(abs(ds["zeta"]).max())
        assert scale > 1e-6  # the jet's shear
        # every corner, the walls' included (free slip: zeta = 0 there, and u is extended)
        assert float(abs(zeta - ds["zeta"]).max()) <= 1e-12 * scale
        assert ds.cf.axes == {"X": ["x", "x_f"], "Y": ["y", "y_f"]}
        assert ds.cf["grid_topology"].name == "grid"
    p3 = tmp_path / "p3.h5"
    assert (
        main(
            [
                "poisson",
                "--nz",
                "8",
                "--n",
                "16",
                "--case",
                "neumann",
                "--quiet",
                "--output",
                str(p3),
            ]
        )
        == 0
    )
    with xr.open_dataset(p3) as ds:
        assert {ds[c].attrs["boundary"] for c in ("x", "y", "z", "z_f")} == {"wall"}
        grid = xgcm.Grid(ds, padding="extend")
        assert {name: axis.coords for name, axis in grid.axes.items()} == {
            a.upper(): {"center": a, "left": f"{a}_f"} for a in "zyx"
        }
        assert ds.cf.axes == {"X": ["x", "x_f"], "Y": ["y", "y_f"], "Z": ["z", "z_f"]}
        # CF 4.3: a vertical coordinate not in units of pressure says which way is up
        # (it had no `positive`, and cf_xarray found no vertical coordinate)
        assert {ds[c].attrs.get("positive") for c in ("z", "z_f")} == {"up"}
        assert sorted(ds.cf.coordinates.get("vertical", [])) == ["z", "z_f"]
        assert all("positive" not in ds[c].attrs for c in ("x", "x_f", "y", "y_f"))
    # a right-hand side on a depth axis (increasing downward) gives a z that still does so
    depth = tmp_path / "depth.nc"
    coords = {"depth": ("depth", np.arange(4) + 0.5, {"units": "m", "positive": "down"})}
    f = np.random.default_rng(0).normal(size=(4, 8, 8))
    xr.Dataset({"f": (("depth", "y", "x"), f)}, coords=coords).to_netcdf(depth, engine="h5netcdf")
    for src, positive in ((f"{depth}:f", "down"), (f"{p3}:u", "up")):
        d3 = tmp_path / "d3.h5"
        argv = ["poisson", "--rhs", src, "--bc", "neumann", "--quiet", "--overwrite"]
        assert main([*argv, "--output", str(d3)]) == 0
        with xr.open_dataset(d3) as ds:
            assert {ds[c].attrs["positive"] for c in ("z", "z_f")} == {positive}


def test_resume_equals_uninterrupted_bit_for_bit(tmp_path, capsys):
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
        step = int(ds["step"].values[-1])
        assert ds.attrs["status"] == (
            f"stopped: at step {step}, t = {float(ds['time'][-1]):.6g} s after --max-frames 2; "
            "continue with --resume"
        )
        assert ds.sizes["time"] == 3 and ds.attrs["n_frames"] == 3
    capsys.readouterr()
    assert main(["shallow-water", "--output", str(part), "--resume", "--quiet"]) == 0
    line = capsys.readouterr().out
    with xr.open_dataset(full) as a, xr.open_dataset(part) as b:
        assert b.attrs["status"] == "complete"
        assert a.sizes["time"] == b.sizes["time"] > 4
        n = b.sizes["time"]  # the closing line counted the file's frames as this call's
        assert line.startswith(f"wrote {n - 3} more frames ({n} in the file) of"), line
        for name in ("h", "u", "v", "zeta", "time", "step"):
            assert np.array_equal(a[name].values, b[name].values), name
    # The resumed run starts from the stored frame (not from a recomputation that would
    # give the same bits): a stopped file whose last h is nudged continues from the nudge.
    nudged = tmp_path / "nudged.h5"
    assert main(["shallow-water", *args, "--output", str(nudged), "--max-frames", "2"]) == 0
    with h5py.File(nudged, "a") as f:
        f["h"][2, 8, 16] += 1e-3
    assert main(["shallow-water", "--output", str(nudged), "--resume", "--quiet"]) == 0
    with xr.open_dataset(full) as a, xr.open_dataset(nudged) as b:
        np.testing.assert_array_equal(a["h"].values[:2], b["h"].values[:2])
        diff = np.abs(a["h"].values[3:] - b["h"].values[3:]).max(axis=(1, 2))
        assert (diff > 1e-6).all() and (diff < 1e-2).all(), diff


@pytest.mark.multidevice
def test_devices_option_matches_single_device(tmp_path, monkeypatch):
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
    meshes = _meshes_advanced_on(monkeypatch)
    assert main(["shallow-water", *args, "--devices", "2x2", "--output", str(four)]) == 0
    with xr.open_dataset(one) as a, xr.open_dataset(four) as b:
        assert b.attrs["status"] == "complete"
        assert float(abs(a["u"] - b["u"]).max()) <= 1e-12
        assert float(abs(b["u"].isel(time=-1)).max()) > 1e-4  # the wind did spin it up
    assert meshes and all(m == {"y": 2, "x": 2} for m in meshes)  # split as asked


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
            "1",
            "--no-cfl-check",
            "--quiet",
            "--output",
            str(out),
            "--plot",
            str(tmp_path / "boom.png"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 3
    assert "blew up (NaN/Inf or h <= 0) at step" in err and "t = " in err
    # the picture of the last good frame is drawn (it used to be skipped without a word)
    assert f"{tmp_path / 'boom.png'} shows the last frame written before it" in err
    assert (tmp_path / "boom.png").stat().st_size > 10_000
    assert f"written before it are kept in {out}." in err  # the line names the file
    step = int(err.split("at step ")[1].split(",")[0])
    t = float(err.split("t = ")[1].split(" s;")[0])
    assert t == pytest.approx(step * 6000, rel=1e-6)  # the time of that step (dt = 6000 s)
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"].startswith("failed: NaN/Inf or h <= 0 at step")
        assert ds.sizes["time"] >= 2
        assert np.isfinite(ds["h"].values).all()
        assert ds["h"].values.min() > 0  # a thickness gone negative is a blow-up too
        assert ds["step"].values[-1] == step - 1  # every step saved: the last good one
        kept = ds.sizes["time"]
    assert f"; the {kept} frames written before it are kept in {out}." in err  # not frame(s)
    from physjax._runner import SimulationBlewUp

    one = str(SimulationBlewUp(step=3, time=30.0, frames_written=1, output="r.h5"))
    assert "; the 1 frame written before it is kept in r.h5. Lower dt" in one


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--nx", "0"], "nx must be a positive integer"),
        (["--n", "-8"], "--n must be a positive integer"),
        (["--param", "mean_depth=-5"], "mean_depth must be > 0"),
        (["--param", "mean_depth=0"], "mean_depth must be > 0"),
        (
            ["--dt", "1e5"],
            "--dt 100000 s, lowered to 7200 s to end on --t-end 7200 s: dt=7200 s breaks the CFL",
        ),
        (["--dt", "-3"], "--dt must be a finite number > 0"),
        (["--case", "nope"], "unknown case 'nope'"),
        (["--devices", "1x4", "--nx", "30"], "--devices 1x4: the mesh does not divide the grid"),
        (["--devices", "3"], "--devices 3: the mesh does not divide the grid: ny=16 cannot"),
        (["--devices", "64"], "devices=64 requested"),
        # a step count that overflows to inf: it gave an OverflowError traceback
        (["--t-end", "1e308", "--dt", "0.01"], "--dt 0.01 s takes inf steps"),
        (["--dt", "5e-324"], "takes inf steps to --t-end 7200 s, more than the 2147483647"),
        (["--cfl", "1e-320"], "takes inf steps"),
        (["--output", "run.png"], "names the NetCDF4/HDF5 data file, not a picture"),
        (["--precision", "float16"], "--precision must be float32 or float64"),
        (["--cfl", "3"], "--cfl must be in"),
        (["--param", "bogus=1"], "unknown parameter"),
        (["--plot", "x.jpg"], "--plot must name a .png"),
    ],
)
def test_bad_input_clear_error_and_no_file(tmp_path, capsys, extra, match):
    # The backend starts here, if no earlier test in this process started it: a CLI run
    # that starts it would simulate the 64 devices asked for (as it does for a user).
    assert len(jax.devices()) == 4
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


def test_wide_vectors_are_asked_for_on_amd_processors_with_avx512_only():
    from physjax._cpu_codegen import wide_vectors_pay

    amd = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n"
    assert wide_vectors_pay(amd + amd)  # one block per core
    assert not wide_vectors_pay(amd.replace("avx512f avx512bw", "avx2"))
    assert not wide_vectors_pay(amd.replace("AuthenticAMD", "GenuineIntel"))
    assert not wide_vectors_pay("processor\t: 0\n")


def test_cpu_codegen_tuning_sets_the_flag_before_the_backend_starts_only():
    import platform

    from physjax._cpu_codegen import wide_vectors_pay

    def run(code, **extra):
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PHYSJAX_NO_CPU_TUNING", "XLA_FLAGS", "PHYSJAX_TEST_FAST_FLAGS")
        }
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.split("\n")[:2]

    report = "import os, physjax; print(physjax.tune_cpu_codegen()); "
    report += "print(os.environ.get('XLA_FLAGS'))"
    qualifies = platform.machine() == "x86_64" and sys.platform.startswith("linux")
    if qualifies:
        with open("/proc/cpuinfo") as fh:
            qualifies = wide_vectors_pay(fh.read())
    tuned, flags = run(report)
    assert tuned == str(qualifies)
    assert flags == ("--xla_cpu_prefer_vector_width=512" if qualifies else "None")
    assert run(report, PHYSJAX_NO_CPU_TUNING="1") == ["False", "None"]
    # the user's own setting is kept and reported
    mine = "--xla_cpu_prefer_vector_width=256"
    assert run(report, XLA_FLAGS=mine) == ["False", mine]
    late = "import jax; jax.devices(); " + report
    assert run(late) == ["False", "None"]  # the backend has started: too late, nothing set


def test_the_shallow_water_step_is_bit_identical_with_512_bit_vectors(tmp_path):
    """What docs/benchmarks.md and physjax._cpu_codegen state: the step is elementwise, so
    XLA:CPU's vector width changes no rounding (float32 and float64)."""
    code = (
        "import sys, numpy as np, jax\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "from physjax.solvers.shallow_water import make_case\n"
        "for p in ('float32', 'float64'):\n"
        "    case = make_case('barotropic-instability', nx=64, ny=32, precision=p)\n"
        "    m, s = case.model, case.state\n"
        "    dt = float(m.max_stable_dt(s, cfl=0.5))\n"
        "    out = m.advance(s, t0=0.0, dt=dt, n_steps=30)\n"
        "    np.save(sys.argv[1] + p + '.npy', np.stack([out.h, out.u, out.v]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    for name, flags in (("narrow", "--xla_cpu_prefer_vector_width=256"), ("wide", "")):
        extra = {"XLA_FLAGS": flags or "--xla_cpu_prefer_vector_width=512"}
        subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / name)],
            env={**env, **extra},
            check=True,
            timeout=300,
        )
    for p in ("float32", "float64"):
        narrow = np.load(tmp_path / f"narrow{p}.npy")
        wide = np.load(tmp_path / f"wide{p}.npy")
        assert narrow.dtype == np.dtype(p) and np.array_equal(narrow, wide), p


def test_devices_from_config_file(tmp_path, capsys, monkeypatch):
    meshes = _meshes_advanced_on(monkeypatch)
    cfg = tmp_path / "d.toml"
    cfg.write_text('case = "gravity-wave"\nn = 16\nt_end = 3600.0\ndevices = "2x2"\n')
    out = tmp_path / "d.h5"
    assert main(["shallow-water", "--config", str(cfg), "--output", str(out), "--quiet"]) == 0
    with xr.open_dataset(out) as ds:
        assert '"devices": [2, 2]' in ds.attrs["configuration"]
    # the run itself was split so, not only recorded as asked for
    assert meshes and all(m == {"y": 2, "x": 2} for m in meshes), meshes
    meshes.clear()
    # --resume with the same config (devices spelled "2x2", stored as [2, 2]) continues
    part = tmp_path / "p.h5"
    cfg.write_text(
        f'case = "gravity-wave"\nn = 16\nt_end = 3600.0\nsave_every = 2\ndevices = "2x2"\n'
        f"output = {str(part)!r}\nquiet = true\n"
    )
    assert main(["shallow-water", "--config", str(cfg), "--max-frames", "1"]) == 0
    assert main(["shallow-water", "--config", str(cfg), "--resume"]) == 0
    with xr.open_dataset(part) as ds:
        assert ds.attrs["status"] == "complete"
    assert meshes and all(m == {"y": 2, "x": 2} for m in meshes), meshes
    meshes.clear()
    # 4 devices are make_mesh's 2x2: the same layout, written another way (no remark)
    with h5py.File(part, "a") as f:
        f.attrs["status"] = "interrupted: by hand"
    assert main(["shallow-water", "--output", str(part), "--resume", "--devices", "4"]) == 0
    assert "where the run began on" not in capsys.readouterr().err
    with xr.open_dataset(part) as ds:
        assert "on devices" not in ds.attrs["history"]
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
        frames, status = f["time"].shape[0], f.attrs["status"]
    assert status.startswith("stopped: at step 4,")
    for extra, match in (
        (["--precision", "float64"], "--precision 'float64' differs from the stored 'float32'"),
        # the option given is named: --n, not the --nx (or --ny) it sets
        (["--n", "32"], "--n 32 differs from the stored --nx 16 --ny 16 (leave it out"),
        (["--ny", "32"], "--ny 32 differs from the stored 16"),
        (["--n", "32", "--nx", "16"], "--n 32 differs from the stored --nx 16 --ny 16"),
        (["--cfl", "0.3"], "--cfl 0.3 differs from the stored 0.5"),
        (["--param", "amplitude=0.05"], "parameter amplitude=0.05 differs from the stored 0.02"),
    ):
        code = main(["shallow-water", "--output", str(out), "--resume", "--quiet", *extra])
        assert code == 2
        assert match in capsys.readouterr().err
        with h5py.File(out, "r") as f:
            assert f["time"].shape[0] == frames and f.attrs["status"] == status
    # the same settings again (a default parameter spelled out too) continue the run
    code = main(["shallow-water", *args, "--resume", "--param", "gravity=9.81"])
    assert code == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete" and f["time"].shape[0] > frames


def test_resume_refuses_a_param_that_is_no_parameter_as_a_new_run_does(tmp_path, capsys):
    # a run setting or an unknown name given as --param: not "differs from the stored
    # 'default'", nor a case default (t_end 86400) given as the stored run's own value
    out = tmp_path / "r.h5"
    assert main(["shallow-water", *FAST, "--output", str(out), "--max-frames", "1"]) == 0
    with h5py.File(out, "r") as f:
        frames, status = f["time"].shape[0], f.attrs["status"]
    t_end = FAST[FAST.index("--t-end") + 1]
    for param, match in (
        (f"t_end={t_end}", "t_end is not a physical parameter here; set it with --t-end"),
        ("nx=16", "nx is not a physical parameter here; set it with --nx"),
        ("save_every=2", "save_every is not a physical parameter here; set it with --save-every"),
        ("foo=1", "unknown parameter(s) ['foo'] (--param, or the [parameters] table of"),
    ):
        code = main(["shallow-water", "--output", str(out), "--resume", "--param", param])
        assert code == 2
        err = capsys.readouterr().err
        assert match in err and "differs from the stored" not in err, err
        with h5py.File(out, "r") as f:
            assert f["time"].shape[0] == frames and f.attrs["status"] == status


def test_dt_that_does_not_divide_t_end_lands_on_it(tmp_path, capsys):
    args = ["--case", "gravity-wave", "--n", "16", "--t-end", "1000", "--dt", "300", "--quiet"]
    full, part = tmp_path / "full.h5", tmp_path / "part.h5"
    assert main(["shallow-water", *args, "--output", str(full)]) == 0
    assert "--dt 300 s was lowered to 250 s" in capsys.readouterr().out
    with xr.open_dataset(full) as ds:
        assert list(ds["time"].values) == [0.0, 250.0, 500.0, 750.0, 1000.0]
        assert '"dt": 250.0' in ds.attrs["configuration"]
        assert '"dt_requested": 300.0' in ds.attrs["configuration"]
    # the same command resumed (--dt 300 is what the run asked for) gives the same bits
    assert main(["shallow-water", *args, "--output", str(part), "--max-frames", "2"]) == 0
    assert main(["shallow-water", *args, "--output", str(part), "--resume"]) == 0
    with xr.open_dataset(full) as a, xr.open_dataset(part) as b:
        assert b.attrs["status"] == "complete"
        for name in ("h", "u", "v", "zeta", "time", "step"):
            assert np.array_equal(a[name].values, b[name].values), name
    # a dt that divides t_end is kept as given
    capsys.readouterr()
    dividing = [*args[:-3], "--dt", "250", "--output", str(tmp_path / "d.h5")]
    assert main(["shallow-water", *dividing]) == 0
    assert "lowered" not in capsys.readouterr().out


INTERRUPT_ARGS = [*FAST, "--save-every", "2", "--precision", "float64"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "full.h5"
    assert main(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)]) == 0
    with xr.open_dataset(out) as ds:
        return ds.load()


def _main_catching_interrupt(argv):
    """main(argv), with a KeyboardInterrupt that escapes it turned into a failing value."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        return "KeyboardInterrupt escaped"


def _assert_resume_completes_like(out, reference):
    assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 0
    with xr.open_dataset(out) as b:
        assert b.attrs["status"] == "complete"
        assert b.sizes["time"] == reference.sizes["time"]
        for name in ("h", "u", "v", "zeta", "time", "step"):
            assert np.array_equal(reference[name].values, b[name].values), name


def test_ctrl_c_stops_between_frames_and_resume_continues(
    tmp_path, capsys, monkeypatch, uninterrupted
):
    original = NetCDFWriter.append

    def append_then_ctrl_c(self, time, step, fields):
        n = original(self, time, step, fields)
        if n == 3:
            signal.raise_signal(signal.SIGINT)  # as from a terminal's Ctrl-C
        return n

    monkeypatch.setattr(NetCDFWriter, "append", append_then_ctrl_c)
    out = tmp_path / "i.h5"
    code = _main_catching_interrupt(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 130
    lines = err.strip().splitlines()  # the notice of the first Ctrl-C, then the closing line
    assert len(lines) == 2 and lines[0].startswith("stopping after the frame in hand")
    assert "Traceback" not in err
    assert "interrupted at step 4" in err and f"--output {out} --resume" in err
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted: at step 4, t = 2400 s"
        assert f.attrs["n_frames"] == f["time"].shape[0] == 3
        assert list(f["step"][:]) == [0, 2, 4]
    monkeypatch.undo()
    _assert_resume_completes_like(out, uninterrupted)


def test_second_ctrl_c_while_recording_the_interrupt_is_ignored(
    tmp_path, capsys, monkeypatch, uninterrupted
):
    """The file operations that mark an interrupted run run shielded from Ctrl-C: before, a
    second Ctrl-C there left the status "running" and no --resume hint."""
    append, finish = NetCDFWriter.append, NetCDFWriter.finish

    def append_then_ctrl_c(self, time, step, fields):
        n = append(self, time, step, fields)
        if n == 3:
            signal.raise_signal(signal.SIGINT)
        return n

    def ctrl_c_then_finish(self, *args, **kwargs):
        signal.raise_signal(signal.SIGINT)  # the impatient second Ctrl-C
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(NetCDFWriter, "append", append_then_ctrl_c)
    monkeypatch.setattr(NetCDFWriter, "finish", ctrl_c_then_finish)
    out = tmp_path / "twice.h5"
    code = _main_catching_interrupt(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert f"--output {out} --resume" in err
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted: at step 4, t = 2400 s"
    monkeypatch.undo()
    _assert_resume_completes_like(out, uninterrupted)


def test_resume_keeps_the_stored_step_count_and_dt(tmp_path, uninterrupted):
    """A file whose run took ceil(t_end / dt) steps of a dt that does not divide t_end (as
    files written before dt was lowered to land on t_end do) resumes with exactly that dt
    and step count; recomputing them switched the step half-way through the run."""
    import json

    out = tmp_path / "old.h5"
    assert main(["shallow-water", *INTERRUPT_ARGS, "--max-frames", "2", "--output", str(out)]) == 0
    with h5py.File(out, "a") as f:
        config = json.loads(f.attrs["configuration"])
        config["t_end"] -= 0.4 * config["dt"]  # same step count, no longer a multiple of dt
        config.pop("dt_requested", None)
        f.attrs["configuration"] = json.dumps(config)
    _assert_resume_completes_like(out, uninterrupted)


def test_a_resumed_runs_progress_bar_starts_at_its_step_and_time(tmp_path, capsys):
    """The bar's first draw (in a batch log the only line for half a minute) showed the
    step a resumed run continued from but not its time, which came with the first frame."""
    from physjax._runner import _format_time

    code, out = _run(tmp_path, "--max-frames", "1")
    assert code == 0
    with h5py.File(out) as f:
        step, t = int(f["step"][-1]), float(f["time"][-1])
    capsys.readouterr()
    resume = ["shallow-water", "--output", str(out), "--resume", "--max-frames", "1"]
    assert main(resume) == 0
    draws = [s for s in re.split(r"[\r\n]", capsys.readouterr().err) if "shallow-water" in s]
    assert f" {step}/" in draws[0] and f"t={_format_time(t)}]" in draws[0], draws


def test_ctrl_c_while_starting_exits_130(capsys, monkeypatch):
    import physjax.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert _main_catching_interrupt(["shallow-water"]) == 130
    assert capsys.readouterr().err.strip() == "physjax: interrupted"


def test_interrupt_inside_an_append_keeps_only_whole_frames(
    tmp_path, capsys, monkeypatch, uninterrupted
):
    original = NetCDFWriter.append

    class CutShort(dict):
        """The fields of a frame whose writing is interrupted after two variables."""

        def items(self):
            for i, item in enumerate(super().items()):
                if i == 2:
                    raise KeyboardInterrupt
                yield item

    def append(self, time, step, fields):
        return original(self, time, step, CutShort(fields) if step == 6 else fields)

    monkeypatch.setattr(NetCDFWriter, "append", append)
    out = tmp_path / "c.h5"
    code = _main_catching_interrupt(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert "interrupted at step 4" in err and "keeps 3 whole frames" in err
    with h5py.File(out, "r") as f:
        assert f.attrs["status"].startswith("interrupted: at step 4")
        assert f.attrs["n_frames"] == f["time"].shape[0] == 3
        assert all(np.abs(f[name][-1]).max() > 0 for name in ("h", "u", "v", "zeta"))
    monkeypatch.undo()
    _assert_resume_completes_like(out, uninterrupted)


def test_sigint_to_a_running_command_exits_130_with_one_line(tmp_path):
    out = tmp_path / "s.h5"
    run = [sys.executable, "-m", "physjax.cli", "shallow-water", "--case", "gravity-wave"]
    run += ["--n", "16", "--t-end", "1e8", "--save-every", "1", "--quiet", "--output", str(out)]
    proc = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:
                with h5py.File(out, "r", locking=False) as f:
                    if f.attrs.get("n_frames", 0) >= 3:
                        break
            except OSError:  # not there yet, or in the middle of a write
                pass
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert "Traceback" not in stderr and len(lines) == 2
    assert lines[0].startswith("stopping after the frame in hand")
    assert "interrupted at step" in stderr and "--resume" in stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"].startswith("interrupted: at step")
        assert f.attrs["n_frames"] == f["time"].shape[0] >= 3
        assert f["step"][-1] == f["time"].shape[0] - 1


def test_a_reader_holding_the_file_open_does_not_stop_the_run(tmp_path):
    out = tmp_path / "live.h5"
    assert (
        main(
            ["shallow-water", *FAST, "--save-every", "2", "--output", str(out), "--max-frames", "1"]
        )
        == 0
    )
    hold = (
        "import sys, xarray as xr; ds = xr.open_dataset(sys.argv[1]); "
        "print('open', flush=True); sys.stdin.read()"
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", hold, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "open"
        assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 0
    finally:
        reader.communicate("", timeout=60)
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete"
        assert ds.sizes["time"] == ds.attrs["n_frames"] > 2


@pytest.mark.parametrize("stale_locking", [False, True])
def test_writer_takes_the_flags_of_a_handle_left_open_in_the_process(tmp_path, stale_locking):
    """A handle this process still holds on the file with other locking flags (one an
    interrupt left behind) makes HDF5 refuse an open with different flags; the writer then
    opens with the flags the handle has, and appends and finishes as usual."""
    from physjax.grids import Grid
    from physjax.io import Variable, read_attrs

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "w.h5", g, [Variable("h", ("centre", "centre"), "m", "h")])
    w.append(0.0, 0, {"h": np.zeros(g.shape)})
    w._locking = not stale_locking
    stale = h5py.File(w.path, "a", locking=None if stale_locking else False)
    try:
        with pytest.raises(OSError, match="locking flag values don't match"):
            h5py.File(w.path, "a", locking=None if w._locking else False).close()
        w.append(60.0, 1, {"h": np.ones(g.shape)})
        assert w.frames() == (2, 1)
        w.finish()
        assert w._locking is stale_locking
    finally:
        stale.close()
    attrs = read_attrs(w.path)
    assert attrs["status"] == "complete" and attrs["n_frames"] == 2


def test_an_interrupt_while_the_writer_opens_the_file_leaves_nothing_behind(tmp_path, monkeypatch):
    """A Ctrl-C or SIGTERM that lands while h5netcdf is still reading the file's structure
    leaves neither an HDF5 handle open nor an "Exception ignored" traceback when the
    half-made object is collected; the next append goes on as usual. (Appends write through
    h5py alone: the interrupt lands in the open of frames(), which reads through h5netcdf.)"""
    import gc

    import h5netcdf

    from physjax.grids import Grid
    from physjax.io import Variable, read_frame

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "i.h5", g, [Variable("h", ("centre", "centre"), "m", "h")])
    w.append(0.0, 0, {"h": np.zeros(g.shape)})
    ignored = []
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # before h5netcdf has marked the object open or closed
        m.setattr(h5netcdf.core, "_open_h5py", interrupted)
        with pytest.raises(KeyboardInterrupt):
            w.frames()
    gc.collect()
    assert not ignored
    open_files = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
    assert not [i for i in open_files if i.name == w.path.encode()]
    w.append(60.0, 1, {"h": np.ones(g.shape)})
    assert w.frames() == (2, 1) and read_frame(w.path)["h"].max() == 1.0


def test_reopen_refuses_a_foreign_file_or_another_grid_untouched(tmp_path):
    """Appending checks the file first: a file physjax did not write, or one of another grid,
    is refused and left byte for byte as it was (it used to be marked "running")."""
    from physjax.grids import Grid
    from physjax.io import NetCDFWriter, Variable

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    variables = [Variable("h", ("centre", "centre"), "m", "thickness")]
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["a"] = np.zeros(3)
    before = foreign.read_bytes()
    with pytest.raises(ValueError, match="is not a physjax output file with frames"):
        NetCDFWriter.reopen(foreign, g, variables)
    assert foreign.read_bytes() == before
    mine = tmp_path / "mine.h5"
    w = NetCDFWriter(mine, g, variables)
    w.append(0.0, 0, {"h": np.ones((4, 6))})
    before = mine.read_bytes()
    other = Grid((5, 6), (1.0, 1.0), dtype="float64")
    with pytest.raises(ValueError, match=r"holds a grid of \{'y': 4, 'x': 6\}, not the"):
        NetCDFWriter.reopen(mine, other, variables)
    with pytest.raises(ValueError, match=r"has no variable\(s\) \['u'\]"):
        NetCDFWriter.reopen(mine, g, [*variables, Variable("u", ("centre", "face"), "m", "u")])
    assert mine.read_bytes() == before
    assert NetCDFWriter.reopen(mine, g, variables).append(1.0, 1, {"h": 2 * np.ones((4, 6))}) == 2


def test_read_frame_and_append_errors_name_the_problem(tmp_path):
    from physjax.grids import Grid
    from physjax.io import NetCDFWriter, Variable, read_frame

    text = tmp_path / "notes.txt"
    text.write_text("not hdf5")
    with pytest.raises(ValueError, match="cannot read .* as a NetCDF4/HDF5 file"):
        read_frame(text)
    with pytest.raises(ValueError, match="file .*missing.h5' does not exist"):
        read_frame(tmp_path / "missing.h5")
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["a"] = np.zeros(3)
    with pytest.raises(ValueError, match="has no time axis"):
        read_frame(foreign)
    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "w.h5", g, [Variable("h", ("centre", "centre"), "m", "h")])
    with pytest.raises(ValueError, match=r"field 'h' has shape \(6, 8\), not the grid's \(4, 6\)"):
        w.append(0.0, 0, {"h": np.ones((6, 8))})
    assert w.append(0.0, 0, {"h": np.ones((4, 6))}) == 1  # nothing half-written before
    np.testing.assert_array_equal(read_frame(tmp_path / "w.h5")["h"], np.ones((4, 6)))
    # the range is given as the command line gives it ("has 1 frames" before)
    with pytest.raises(ValueError, match=r"frame 1 is out of range: .* has 1 frame \(0, or -1\)$"):
        read_frame(tmp_path / "w.h5", 1)
    w.append(1.0, 1, {"h": np.zeros((4, 6))})
    with pytest.raises(ValueError, match=r"has 2 frames \(0 to 1, or -1 to -2\)$"):
        read_frame(tmp_path / "w.h5", -3)


def test_read_helpers_name_odd_inputs(tmp_path, capsys):
    """A folder, a malformed attribute, a non-integer frame index and a file locked by its
    writer each get their own message (a folder used to give HDF5's raw open error, a bad
    `configuration` a bare JSON error, a locked file "cannot read ... as NetCDF4/HDF5")."""
    import subprocess
    import sys

    from physjax.io import read_attrs, read_frame

    with pytest.raises(ValueError, match=r"is a directory, not a NetCDF4/HDF5 file"):
        read_attrs(tmp_path)
    with pytest.raises(ValueError, match=r"is a directory, not a NetCDF4/HDF5 file"):
        read_frame(tmp_path)
    run = tmp_path / "run.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run), "--max-frames", "2"]) == 0
    for index in (True, 1.5, "1"):
        with pytest.raises(TypeError, match=r"index must be an integer frame number"):
            read_frame(run, index)
    assert read_frame(run, np.int64(1))["step"] == read_frame(run, 1)["step"]
    # a process holding HDF5's lock (as the writer does during an append): try again later
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import h5py, time; f = h5py.File({str(run)!r}, 'a'); "
         "print('open', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        for read in (read_attrs, read_frame):
            with pytest.raises(BlockingIOError, match=r"is locked by a process writing it"):
                read(run)
    finally:
        holder.kill()
        holder.wait()
    assert read_attrs(run)["n_frames"] == 3
    bad = tmp_path / "bad.h5"
    bad.write_bytes(run.read_bytes())
    with h5py.File(bad, "a") as f:
        f.attrs["configuration"] = "{not json"
    with pytest.raises(ValueError, match=r"bad.h5': the 'configuration' attribute is not valid"):
        read_attrs(bad)
    capsys.readouterr()
    assert main(["shallow-water", "--resume", "--quiet", "--output", str(bad)]) == 2
    assert "'configuration' attribute is not valid JSON" in capsys.readouterr().err
    # altered counts: -1 was read as "-1 frames (0 to -2, or -1 to --1)", 2.5 as 2
    for altered in ("abc", -1, 2.5, True):
        with h5py.File(bad, "a") as f:
            f.attrs["n_frames"] = altered
        count = r"attribute n_frames must be a count of frames \(an integer >= 0\), got"
        with pytest.raises(ValueError, match=rf"bad.h5': {count} {re.escape(repr(altered))};"):
            read_frame(bad)
    with h5py.File(bad, "a") as f:
        f.attrs["n_frames"] = np.array([2], np.int64)  # stored 1-d, as h5netcdf writes it
    assert read_frame(bad)["step"] == read_frame(run, 1)["step"]


def test_resume_with_another_physjax_version_is_noted(tmp_path, capsys):
    """Bit-for-bit equality is a promise of one version: a run continued by another says so
    on stderr and in `history`, as a change of device layout does."""
    import physjax

    run = tmp_path / "run.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(run), "--max-frames", "1"]) == 0
    resume = ["shallow-water", "--resume", "--quiet", "--output", str(run), "--max-frames", "1"]
    capsys.readouterr()
    assert main(resume) == 0  # same version: nothing said
    assert "physjax" not in capsys.readouterr().err
    with h5py.File(run, "a") as f:
        f.attrs["physjax_version"] = "0.0.1"
    assert main(resume) == 0
    note = f"with physjax {physjax.__version__}, where the run began with 0.0.1"
    assert note in capsys.readouterr().err
    with xr.open_dataset(run) as ds:
        assert ds.attrs["n_frames"] == 4  # the first frame, then one more per call
        assert note in ds.attrs["history"] and ds.attrs["history"].count("resumed at") == 2


def test_param_drag_on_a_case_without_it(tmp_path, capsys, monkeypatch):
    """`--param drag=...` on any case (it was an unknown parameter of the geostrophic
    adjustment); the run's model has it, the file records it, and a resume must give the
    same."""
    drags, advance = [], ShallowWater.advance

    def spy(self, *a, **k):
        drags.append(None if self.drag is None else float(self.drag))
        return advance(self, *a, **k)

    monkeypatch.setattr(ShallowWater, "advance", spy)
    out = tmp_path / "d.h5"
    args = ["shallow-water", "--n", "16", "--t-end", "20000", "--quiet", "--output", str(out)]
    assert main([*args, "--param", "drag=1e-5", "--max-frames", "1"]) == 0
    assert drags and drags == pytest.approx([1e-5] * len(drags), rel=1e-6)  # the model ran with it
    with xr.open_dataset(out) as ds:
        assert ds.attrs["parameter_drag"] == 1e-5 and ds.attrs["parameter_viscosity"] == 0.0
    capsys.readouterr()
    resume = ["shallow-water", "--resume", "--quiet", "--output", str(out)]
    assert main([*resume, "--param", "drag=2e-5"]) == 2
    assert "drag" in capsys.readouterr().err
    drags.clear()
    assert main(resume) == 0
    assert drags and drags == pytest.approx([1e-5] * len(drags), rel=1e-6)  # resumed with it
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete"


def test_an_output_that_is_a_dangling_link_is_created_where_it_points(tmp_path):
    """`check_writable` used to probe the link itself and refuse it: "File exists"."""
    link, target = tmp_path / "link.h5", tmp_path / "target.h5"
    link.symlink_to(target)
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000", "--quiet"]
    assert main([*args, "--output", str(link)]) == 0
    assert link.is_symlink() and target.is_file()
    with xr.open_dataset(target) as ds:
        assert ds.attrs["status"] == "complete"
    nowhere = tmp_path / "nowhere.h5"
    nowhere.symlink_to(tmp_path / "missing" / "t.h5")
    with pytest.raises(ValueError, match=r"links to a missing file; .*folder .*missing' does not"):
        from physjax.io import check_writable

        check_writable(nowhere, "--output")


def test_resume_compares_cfl_with_the_stored_one(tmp_path, capsys):
    """The CFL number a run chose its dt with is stored, so `--resume --cfl C` is accepted
    when C is the run's own (it was refused as differing from "a stored dt")."""
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3000"]
    args += ["--save-every", "2", "--quiet"]
    cfl_run, dt_run = tmp_path / "cfl.h5", tmp_path / "dt.h5"
    assert main([*args, "--output", str(cfl_run), "--max-frames", "1"]) == 0
    assert main([*args, "--output", str(dt_run), "--dt", "100", "--max-frames", "1"]) == 0
    capsys.readouterr()
    before = cfl_run.read_bytes()
    resume = ["shallow-water", "--resume", "--quiet", "--output"]
    assert main([*resume, str(cfl_run), "--cfl", "0.4"]) == 2
    assert "--cfl 0.4 differs from the stored 0.5" in capsys.readouterr().err
    assert cfl_run.read_bytes() == before
    assert main([*resume, str(dt_run), "--cfl", "0.5"]) == 2
    assert "which was given --dt 100.0" in capsys.readouterr().err
    with xr.open_dataset(cfl_run) as ds:  # even the very dt the run chose: not what it asked
        chosen = json.loads(ds.attrs["configuration"])["dt"]
    assert main([*resume, str(cfl_run), "--dt", repr(chosen)]) == 2
    assert "which chose dt from --cfl 0.5" in capsys.readouterr().err
    assert cfl_run.read_bytes() == before
    assert main([*resume, str(cfl_run), "--cfl", "0.5"]) == 0
    with xr.open_dataset(cfl_run) as ds, xr.open_dataset(dt_run) as dsdt:
        assert ds.attrs["status"] == "complete" and ds["time"].values[-1] == 3000
        assert json.loads(ds.attrs["configuration"])["cfl"] == 0.5
        assert json.loads(dsdt.attrs["configuration"])["cfl"] is None


def test_default_save_every_gives_at_most_20_frames_and_parameters_record_t_end(tmp_path):
    """35 steps used to give 36 frames (save_every 35 // 20 = 1); the ``parameters``
    attributes recorded the case's default end time, not the run's --t-end."""
    out = tmp_path / "f.h5"
    argv = ["shallow-water", "--n", "32", "--t-end", "20000", "--quiet", "--output", str(out)]
    assert main(argv) == 0
    with xr.open_dataset(out) as ds:
        config = json.loads(ds.attrs["configuration"])
        n_steps, save_every = config["n_steps"], config["save_every"]
        assert n_steps > 20 and save_every == -(-n_steps // 20)
        assert 11 <= ds.sizes["time"] - 1 <= 20
        assert ds.attrs["parameter_t_end"] == 20000.0
        assert json.loads(ds.attrs["parameters"])["t_end"] == 20000.0 == config["t_end"]


def test_progress_bar_shows_the_time_of_the_frame_just_reached():
    """The bar redraws in update(); the time must be set before it (it lagged a frame)."""
    from physjax._runner import _format_time, drive

    class Bar:
        def __init__(self):
            self.postfix, self.n, self.shown = "", 0, []

        def set_postfix_str(self, text, refresh=True):
            self.postfix = text

        def update(self, n):
            self.n += n
            self.shown.append((self.n, self.postfix))

    bar = Bar()
    drive(
        lambda s, t0, n: s + n,
        np.zeros(()),
        dt=60.0,
        step0=0,
        n_steps=10,
        save_every=4,
        on_frame=lambda s, t, k: None,
        progress=bar,
    )
    assert bar.shown == [(k, f"t={_format_time(60.0 * k)}") for k in (4, 8, 10)]


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_sigterm_stops_at_once_and_resume_continues(
    tmp_path, capsys, monkeypatch, uninterrupted, name
):
    """A batch system's time limit (SIGTERM), or the terminal closed under the run (SIGHUP),
    records the run as interrupted, resumable."""
    signum = getattr(signal, name)
    original = NetCDFWriter.append

    def append_then_signal(self, time, step, fields):
        n = original(self, time, step, fields)
        if n == 3:
            signal.raise_signal(signum)
        return n

    monkeypatch.setattr(NetCDFWriter, "append", append_then_signal)
    out = tmp_path / "t.h5"
    before = signal.getsignal(signum)
    code = _main_catching_interrupt(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert err.strip().splitlines()[0] == f"terminated ({name}): stopping now"
    assert signal.getsignal(signum) == before  # restored after the run
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted: at step 4, t = 2400 s"
        assert list(f["step"][:]) == [0, 2, 4]
    monkeypatch.undo()
    _assert_resume_completes_like(out, uninterrupted)


def test_sigterm_inside_a_weakref_callback_stops_at_the_frame_without_a_traceback(
    tmp_path, capsys, monkeypatch, signal_in_a_callback
):
    """Python cannot raise out of a weakref or garbage-collector callback (jax has some): a
    SIGTERM that lands in one used to print an "Exception ignored … KeyboardInterrupt"
    traceback. The run now stops at the frame boundary with the usual record only."""

    original = NetCDFWriter.append

    def append_then_sigterm_in_a_callback(self, time, step, fields):
        n = original(self, time, step, fields)
        if n == 3:
            signal_in_a_callback(signal.SIGTERM)
        return n

    monkeypatch.setattr(NetCDFWriter, "append", append_then_sigterm_in_a_callback)
    ignored = []  # what Python would print as "Exception ignored in …"
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    out = tmp_path / "w.h5"
    code = _main_catching_interrupt(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err and "Exception ignored" not in err, err
    assert err.strip().splitlines()[0] == "terminated (SIGTERM): stopping now"
    assert not ignored
    assert sys.unraisablehook == ignored.append  # restored after the run
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted: at step 4, t = 2400 s"
        assert list(f["step"][:]) == [0, 2, 4]


def test_sigterm_inside_a_close_while_a_reader_held_the_lock(
    tmp_path, capsys, monkeypatch, uninterrupted
):
    """A reader that held the file made the writer drop HDF5's file lock; a SIGTERM that
    then lands inside the close of an append must not leave the file open in the process
    (its record would meet "file locking flag values don't match" and the run end as status
    2 with the file still marked running). (Appends write through h5py alone: the signal
    lands in h5py's close of the append's handle, where it landed in h5netcdf's.)"""
    init = NetCDFWriter.__init__

    def init_unlocked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._locking = False  # as after a reader's lock blocked an append

    close = h5py.File.close
    fired = []

    def close_then_sigterm(self):
        writing = bool(self.id) and self.mode == "r+"
        frames = np.ravel(self.attrs.get("n_frames", [0]))[0] if writing else 0
        close(self)
        if not fired and frames == 3:
            fired.append(True)
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(NetCDFWriter, "__init__", init_unlocked)
    monkeypatch.setattr(h5py.File, "close", close_then_sigterm)
    out = tmp_path / "r.h5"
    code = _main_catching_interrupt(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert fired and code == 130 and "Traceback" not in err, err
    assert "keeps 3 whole frames" in err and "--resume" in err
    monkeypatch.undo()
    open_files = h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)
    assert not [i for i in open_files if i.name == str(out).encode()]
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted: at step 4, t = 2400 s"
        assert list(f["step"][:]) == [0, 2, 4]
    _assert_resume_completes_like(out, uninterrupted)


def test_a_full_disk_stops_the_run_with_whole_frames_and_resume_continues(
    tmp_path, capsys, monkeypatch, uninterrupted
):
    """Free space is checked before each frame; when it runs short the run stops with the
    file whole (HDF5 does not report every failed write, and a file whose metadata could not
    be written no longer opens) and resumable once space is freed."""
    import collections
    import shutil

    usage = collections.namedtuple("usage", "total used free")
    calls = []

    def disk_usage(path):
        calls.append(path)  # the file's creation, then one call per frame
        return usage(1 << 30, 0, (1 << 30) if len(calls) <= 4 else 40_000)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    out = tmp_path / "full.h5"
    code = main(["shallow-water", *INTERRUPT_ARGS, "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert "only 39.1 KiB free on the disk of" in err and "a frame needs 8.0 KiB" in err
    assert "The run stopped at step 4 of 12" in err and "keeps 3 whole frames" in err
    assert f"--output {out} --resume" in err
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "interrupted: at step 4, t = 2400 s: the disk was full"
        assert list(ds["step"].values) == [0, 2, 4]
    monkeypatch.undo()
    _assert_resume_completes_like(out, uninterrupted)


def test_an_unforeseen_error_marks_the_file_and_resume_continues(
    tmp_path, monkeypatch, uninterrupted
):
    """An error no handler expects (here from the writer, at the fourth frame) used to
    leave the file 'running', which a new run then refused; now the status says where the
    run stopped and why, the error carries a note naming the file and --resume, and
    resuming gives the uninterrupted result."""
    from physjax.io import NetCDFWriter

    append, calls = NetCDFWriter.append, []

    def failing(self, *args, **kw):
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("an unexpected failure")
        return append(self, *args, **kw)

    monkeypatch.setattr(NetCDFWriter, "append", failing)
    out = tmp_path / "u.h5"
    with pytest.raises(RuntimeError, match="an unexpected failure") as err:
        main(["shallow-water", *INTERRUPT_ARGS, "--quiet", "--output", str(out)])
    assert f"{out} keeps 3 whole frames (to step 4); continue with: physjax" in str(
        err.value.__notes__
    )
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == (
            "interrupted: at step 4, t = 2400 s: RuntimeError: an unexpected failure"
        )
        assert list(ds["step"].values) == [0, 2, 4]
    monkeypatch.undo()
    _assert_resume_completes_like(out, uninterrupted)


def test_an_unforeseen_value_error_mid_run_keeps_its_traceback(tmp_path, monkeypatch):
    """A ValueError or TypeError from inside the run is a bug, not a bad option: it used to
    end as one 'error:' line with exit status 2, as for a usage error, where the docs
    promise the error's traceback after the file is marked."""
    from physjax.io import NetCDFWriter

    append, calls = NetCDFWriter.append, []

    def failing(self, *args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("an unexpected value")
        return append(self, *args, **kw)

    monkeypatch.setattr(NetCDFWriter, "append", failing)
    out = tmp_path / "v.h5"
    with pytest.raises(ValueError, match="an unexpected value") as err:
        main(["shallow-water", *INTERRUPT_ARGS, "--quiet", "--output", str(out)])
    assert f"{out} keeps 1 whole frame (to step 0); continue with" in str(err.value.__notes__)
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"].endswith("ValueError: an unexpected value")


def test_too_many_steps_and_too_large_a_grid_are_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "n.h5"
    assert main(["shallow-water", "--n", "16", "--dt", "1e-300", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--dt 1e-300 s takes" in err and "more than the 2147483647 a run can count" in err
    assert main(["shallow-water", "--n", "16", "--cfl", "1e-300", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--cfl 1e-300 takes" in err and "; raise it (at most 1) or shorten --t-end" in err
    # a --cfl that cannot be raised enough was told to "raise it" (--cfl 1 too)
    argv = ["shallow-water", "--n", "16", "--cfl", "1", "--t-end", "1e20", "--output", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--cfl 1 takes" in err and "; shorten --t-end or use fewer cells (--cfl 1 takes" in err
    # used to fail allocating 18.6 GiB with a NumPy traceback
    assert main(["shallow-water", "--n", "1000000", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--nx 1000000 --ny 1000000: a float32 run of 1000000×1000000 cells needs about" in err
    assert "choose a smaller grid" in err
    # a case's own end time is set by --t-end, so --param does not offer it
    assert main(["shallow-water", "--param", "foo=1", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown parameter(s) ['foo'] (--param, or the [parameters] table" in err
    assert "t_end" not in err
    assert not out.exists()


def test_a_new_run_replaces_only_an_ended_physjax_run(tmp_path, capsys):
    out = tmp_path / "o.h5"
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    capsys.readouterr()
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0  # complete: replaced
    err = capsys.readouterr().err
    assert f"replacing the shallow-water run in {out} (case gravity-wave, complete)" in err
    assert main(["shallow-water", *FAST, "--max-frames", "1", "--output", str(out)]) == 0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 2  # unfinished: kept
    err = capsys.readouterr().err
    assert (
        f"--output {str(out)!r} holds an unfinished shallow-water run (status 'stopped: at" in err
    )
    assert (
        f"continue it with: physjax shallow-water --output {out} --resume, or pass --overwrite"
        in err
    )
    # a Poisson solve aimed at it points at the shallow-water command that continues it
    assert main(["poisson", "--n", "16", "--output", str(out)]) == 2
    assert "continue it with: physjax shallow-water --output" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert out.read_bytes() == before
    assert main(["shallow-water", *FAST, "--output", str(out), "--resume", "--overwrite"]) == 2
    assert "--resume and --overwrite exclude each other" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["shallow-water", *FAST, "--output", str(out), "--overwrite"]) == 0
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete" and ds.sizes["time"] == 3
    data = tmp_path / "data.h5"  # someone's own file
    data.write_bytes(b"not physjax")
    assert main(["shallow-water", *FAST, "--output", str(data)]) == 2
    assert "exists and is not a physjax output file; pass --overwrite" in capsys.readouterr().err
    assert data.read_bytes() == b"not physjax"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.h5", "o.h5"]  # no lock left


def test_a_users_partial_file_and_a_symlinked_output_are_respected(tmp_path):
    """The writer's temporary file used to be NAME.partial, so a user's file of that name
    was overwritten and removed; and --overwrite through a symbolic link replaced the link
    with a file beside it. Now the temporary name is hidden and unique, and the file lands
    where the link points, under one lock whatever name leads to it."""
    from physjax.io import output_lock

    out = tmp_path / "o.h5"
    mine = tmp_path / "o.h5.partial"
    mine.write_bytes(b"keep me")
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    assert mine.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.h5", "o.h5.partial"]
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "x.h5"
    assert main(["shallow-water", *FAST, "--output", str(target)]) == 0
    link = tmp_path / "y.h5"
    link.symlink_to(target)
    before = target.read_bytes()
    with output_lock(target):  # a run writing the target refuses a writer of the link
        assert main(["shallow-water", *FAST, "--output", str(link), "--overwrite"]) == 2
    assert main(["shallow-water", *FAST, "--max-frames", "1", "--output", str(link),
                 "--overwrite"]) == 0  # fmt: skip
    assert link.is_symlink() and target.read_bytes() != before
    with xr.open_dataset(target) as ds:
        assert ds.attrs["status"].startswith("stopped") and ds.sizes["time"] == 2
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["x.h5"]


def test_a_second_writer_of_the_same_file_is_refused(tmp_path, capsys):
    from physjax.io import output_lock

    out = tmp_path / "w.h5"
    assert main(["shallow-water", *FAST, "--max-frames", "1", "--output", str(out)]) == 0
    before = out.read_bytes()
    with output_lock(out):  # as a run of another process holds it
        # the lock file names its holder: here another process's
        (tmp_path / ".w.h5.lock").write_text("pid 999999 on elsewhere")
        for extra in (["--resume"], ["--overwrite", *FAST]):
            capsys.readouterr()
            assert main(["shallow-water", "--quiet", "--output", str(out), *extra]) == 2
            err = capsys.readouterr().err
            assert f"{str(out)!r} is being written by another physjax process (pid " in err
            assert out.read_bytes() == before
        # a Poisson solve with --overwrite used to replace the running file under its writer
        capsys.readouterr()
        assert main(["poisson", "--n", "16", "--output", str(out), "--overwrite"]) == 2
        assert "is being written by another physjax process" in capsys.readouterr().err
        assert out.read_bytes() == before
    assert main(["shallow-water", "--quiet", "--output", str(out), "--resume"]) == 0


def test_a_lock_file_removed_between_open_and_lock_is_not_taken(tmp_path, monkeypatch):
    """A writer ending removes its lock file. One that opened the file just before that and
    locked it just after held a lock on a file no longer on disk, and a third writer could
    create and lock a new one: two writers of one output. The lock is now kept only if it
    is on the file the name leads to; otherwise the new file's lock is tried."""
    import fcntl

    from physjax.io import OutputLocked, output_lock
    from physjax.io._netcdf import hidden_beside

    out = tmp_path / "r.h5"
    lock = hidden_beside(os.path.realpath(out), ".lock")
    real_flock, held = fcntl.flock, []

    def flock_after_the_holder_left(fd, op):
        if not held:  # between our open and our flock: the holder ends, another writer starts
            os.remove(lock)
            other = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            real_flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.pwrite(other, b"pid 4242 on elsewhere", 0)
            held.append(other)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_the_holder_left)
    with pytest.raises(OutputLocked, match=r"'.*r\.h5' is being written by another physjax "
                       r"process \(pid 4242 on elsewhere\)"):  # fmt: skip
        with output_lock(out):
            pass
    os.close(held[0])  # the other writer ends: the lock is free again
    with output_lock(out):
        assert open(lock).read().startswith(f"pid {os.getpid()} ")
    assert not os.path.exists(lock)


def test_an_output_removed_during_the_run_stops_it_in_one_line(tmp_path, capsys, monkeypatch):
    """A file removed while the run wrote it (rm of a run taken for dead, a scratch purge):
    the next append opened it in mode "a", which created an empty HDF5 file in its place,
    and failed there with a KeyError: 'time' traceback; the empty file was then refused by
    the next run as "not a physjax output file". Now: exit status 1, one line, no file."""
    original = NetCDFWriter.append

    def append(self, time, step, fields):
        if step > 0:
            os.remove(self.path)
        return original(self, time, step, fields)

    monkeypatch.setattr(NetCDFWriter, "append", append)
    code, out = _run(tmp_path)
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"physjax shallow-water: error: {str(out)!r} was removed or moved away while it was "
        "being written, so the run cannot go on: start it again (a file moved elsewhere "
        "continues with --resume under its new name)"
    )
    assert not out.exists()
    monkeypatch.undo()
    assert _run(tmp_path)[0] == 0  # no --overwrite needed


def test_an_output_with_a_long_name_is_written_locked_and_resumed(tmp_path, capsys):
    """The temporary file (``.NAME.<pid>.<hex>.partial``) and the lock (``.NAME.lock``)
    beside an output whose own name fits the folder's limit of 255 bytes could pass it: an
    --output of 240 characters stopped with 'cannot write …: [Errno 36] File name too long'
    (after the first compile), and its lock was silently not taken. Both names are now
    shortened with a digest of NAME."""
    from physjax.io import output_lock

    out = tmp_path / ("r" * 237 + ".h5")
    assert main(["shallow-water", *FAST, "--max-frames", "1", "--output", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # nothing left beside it
    before = out.read_bytes()
    with output_lock(out):  # as a run of another process holds it
        from physjax.io._reading import hidden_beside

        with open(hidden_beside(str(out), ".lock"), "w") as lock:  # the holder it names
            lock.write("pid 999999 on elsewhere")
        capsys.readouterr()
        assert main(["shallow-water", "--quiet", "--output", str(out), "--resume"]) == 2
        assert "is being written by another physjax process" in capsys.readouterr().err
        assert out.read_bytes() == before
    assert main(["shallow-water", "--quiet", "--output", str(out), "--resume"]) == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete"


def test_resume_refuses_a_failed_run_and_leaves_it_as_it_was(tmp_path, capsys):
    out = tmp_path / "f.h5"
    blow_up = ["--n", "16", "--t-end", "200000", "--dt", "5000", "--no-cfl-check"]
    assert main(["shallow-water", *blow_up, "--quiet", "--output", str(out)]) == 3
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: the run in {str(out)!r} failed (failed: NaN/Inf or h <= 0 at step" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize(
    "variable, value, match",
    [
        ("h", np.nan, "(step 4) is not a state the run can continue from: h must be finite"),
        # a damaged step: -5 made the run stop with a traceback and 'interrupted: …' in the
        # file; 99 (past the run's 12 steps) marked it complete at 't = 59400 s'
        ("step", -5, "is at step -5, not one of its run's steps (0 to 12): the file's 'step'"),
        ("step", 99, "is at step 99, not one of its run's steps (0 to 12)"),
    ],
)
def test_resume_refuses_a_last_frame_it_cannot_continue(tmp_path, capsys, variable, value, match):
    out = tmp_path / "d.h5"
    argv = ["shallow-water", *FAST, "--save-every", "2", "--output", str(out)]
    assert main([*argv, "--max-frames", "2"]) == 0
    with h5py.File(out, "a") as f:
        if variable == "step":
            f["step"][-1] = value
        else:
            f[variable][-1, 3, 3] = value
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"physjax shallow-water: error: --resume: the last frame of {str(out)!r}")
    assert match in err and err.count("\n") == 1
    assert out.read_bytes() == before


@pytest.mark.parametrize("began, then, shown", [("2x2", "1", "1x1"), ("1", "4x1", "4x1")])
def test_resume_continues_on_another_device_layout(
    tmp_path, capsys, monkeypatch, began, then, shown
):
    """A run begun on one layout goes on on another (a 4-GPU job resumed on one GPU): the
    result equals the uninterrupted run to round-off, the file's history and stderr say
    where it changed, and the stored configuration keeps the layout it began with."""
    args = ["--case", "barotropic-instability", "--nx", "32", "--ny", "16", "--t-end", "21600"]
    args += ["--save-every", "4", "--precision", "float64", "--quiet"]
    whole, part = tmp_path / "whole.h5", tmp_path / "part.h5"
    assert main(["shallow-water", *args, "--devices", began, "--output", str(whole)]) == 0
    assert main(["shallow-water", *args, "--devices", began, "--output", str(part),
                 "--max-frames", "2"]) == 0  # fmt: skip
    capsys.readouterr()
    resume = ["--output", str(part), "--resume", "--devices", then, "--quiet"]
    meshes = _meshes_advanced_on(monkeypatch)
    assert main(["shallow-water", *resume]) == 0
    # the rest of the run went on on the new layout, not only said so
    expected = None if then == "1" else {"y": 4, "x": 1}
    assert meshes and all(m == expected for m in meshes), meshes
    err = capsys.readouterr().err
    assert "resumed at step 8 (t = " in err
    was = "2x2" if began == "2x2" else "1x1"
    assert f"on devices {shown}, where the run began on {was}: from here the frames" in err
    with xr.open_dataset(whole) as a, xr.open_dataset(part) as b:
        assert b.attrs["status"] == "complete" and a.sizes["time"] == b.sizes["time"] > 3
        assert "history" not in a.attrs
        assert b.attrs["history"].count("\n") == 0 and b.attrs["history"].endswith(
            "not bit for bit"
        )
        stored = json.loads(b.attrs["configuration"])["devices"]
        assert stored == ([2, 2] if began == "2x2" else 1)
        for name in ("h", "u", "v"):
            scale = float(abs(a[name]).max())
            np.testing.assert_allclose(b[name].values, a[name].values, rtol=0, atol=1e-12 * scale)
        np.testing.assert_array_equal(b.step.values, a.step.values)


@pytest.mark.multidevice
def test_a_part_run_on_another_layout_says_how_to_go_on_there(tmp_path, capsys):
    """A run begun on 2x2 and stopped again after a part resumed on one device said
    `continue with --resume`, which went back to 2x2 (where a one-GPU machine has no such
    layout), and the history of that part did not say the layout had changed again."""
    out = tmp_path / "d.h5"
    assert main(["shallow-water", *FAST, "--save-every", "2", "--devices", "2x2",
                 "--max-frames", "1", "--output", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    resume = ["shallow-water", "--output", str(out), "--resume", "--quiet", "--max-frames", "1"]
    assert main([*resume, "--devices", "1"]) == 0
    assert capsys.readouterr().out.endswith("continue with --resume --devices 1)\n")
    with h5py.File(out) as f:
        assert f.attrs["status"].endswith("; continue with --resume --devices 1")
    assert main(resume) == 0  # back on the layout stored, which the history now says
    with h5py.File(out) as f:
        last = f.attrs["history"].splitlines()[-1]
    assert last.endswith("on devices 2x2, the layout the run began on (an earlier part ran "
                         "on another)"), last  # fmt: skip


def test_resume_on_a_layout_there_are_not_devices_for_says_how_to_go_on(tmp_path, capsys):
    out = tmp_path / "big.h5"
    assert main(["shallow-water", *FAST, "--devices", "2x2", "--max-frames", "1",
                 "--output", str(out)]) == 0  # fmt: skip
    with h5py.File(out, "a") as f:  # as if the run had asked for more devices than there are
        config = json.loads(f.attrs["configuration"])
        f.attrs["configuration"] = json.dumps({**config, "devices": [4, 4]})
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", "--output", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--devices 4x4:" in err and "--resume --devices N" in err
    assert out.read_bytes() == before


def test_resume_takes_a_one_device_layout_as_one_device(tmp_path):
    out = tmp_path / "d.h5"
    assert main(["shallow-water", *FAST, "--max-frames", "2", "--output", str(out)]) == 0
    assert main(["shallow-water", "--output", str(out), "--resume", "--devices", "1x1"]) == 0
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete"


@pytest.mark.parametrize(
    "key, option", [("nx", "--nx"), ("precision", "--precision"), ("t_end", "--t-end")]
)
def test_param_refuses_settings_with_options_of_their_own(tmp_path, capsys, key, option):
    value = "'float64'" if key == "precision" else "10"
    assert (
        main(
            [
                "shallow-water",
                *FAST,
                "--param",
                f"{key}={value}",
                "--output",
                str(tmp_path / "p.h5"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"parameter {key} (--param, or the [parameters] table of --config): {key} is not a "
        f"physical parameter here; set it with {option}"
    ) in err
    assert not (tmp_path / "p.h5").exists()


def test_writer_checks_every_field_before_writing_a_byte(tmp_path):
    """physjax.io used from Python: a complex field failed half-way through a frame (the
    file then showed a phantom partial frame), write_static overwrote every frame of a
    time-dependent variable, unknown names were dropped, a file without a time axis gave a
    bare KeyError, doubled names collapsed, and reopen took a variable on other dims."""
    from physjax.grids import CENTRE, X_FACE, Grid
    from physjax.io import Variable

    grid = Grid((4, 6), (4e3, 6e3), dtype="float64")
    a, b = Variable("a", CENTRE, "m", "A"), Variable("b", CENTRE, "m", "B")
    s = Variable("s", CENTRE, "m", "S", False)
    path = tmp_path / "w.nc"
    w = NetCDFWriter(path, grid, [a, b, s])
    w.write_static({"s": np.ones(grid.shape)})
    w.append(0.0, 0, {"a": np.zeros(grid.shape), "b": np.zeros(grid.shape)})
    before = path.read_bytes()
    one = np.ones(grid.shape)
    for fields, match in [
        ({"a": one, "b": one * 1j}, "field 'b' must be real and numeric, got dtype complex128"),
        ({"a": one, "b": np.full(grid.shape, "x")}, "field 'b' must be real and numeric"),
        ({"a": one, "b": one, "typo": one}, "field 'typo' is not one of the variables"),
        ({"a": one, "b": one, "s": one}, "field 's' is not time-dependent: write it with"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            w.append(1.0, 1, fields)
    for time_, step, match in [(np.nan, 1, "time must be a finite"), (1.0, 2.7, "step must be")]:
        with pytest.raises(ValueError, match=match):
            w.append(time_, step, {"a": one, "b": one})
    with pytest.raises(ValueError, match="field 'a' is time-dependent: write it with append"):
        w.write_static({"a": one})
    with pytest.raises(ValueError, match=re.escape("field 's' has shape (6, 4)")):
        w.write_static({"s": np.ones((6, 4))})
    assert path.read_bytes() == before  # nothing written by any of them
    with xr.load_dataset(path) as ds:
        assert ds.sizes["time"] == 1 and float(ds["a"].max()) == 0.0
    with pytest.raises(ValueError, match=re.escape("'a' in") + ".*lies on"):
        NetCDFWriter.reopen(path, grid, [Variable("a", X_FACE, "m", "A"), b])
    with pytest.raises(ValueError, match=re.escape("name(s) ['a'] are given more than once")):
        NetCDFWriter(tmp_path / "d.nc", grid, [a, Variable("a", X_FACE, "m", "A")])
    static = NetCDFWriter(tmp_path / "st.nc", grid, [s])
    with pytest.raises(ValueError, match="has no time axis"):
        static.append(0.0, 0, {})


def test_a_value_beyond_float32_is_refused_not_stored_as_inf(tmp_path):
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable

    grid = Grid((4, 6), (4e3, 6e3), dtype="float32")
    path = tmp_path / "w.nc"
    w = NetCDFWriter(path, grid, [Variable("a", CENTRE, "m", "A")])
    big = np.ones(grid.shape)  # float64
    big[2, 3] = -1e300
    with pytest.raises(
        ValueError,
        match=re.escape(
            "field 'a' holds -1e+300 at index (2, 3), beyond the range of the file's float32"
        ),
    ):
        w.append(0.0, 0, {"a": big})
    big[2, 3] = 3e38  # within float32's range: stored
    big[0, 0] = np.inf  # a value already infinite is kept as it is
    w.append(0.0, 0, {"a": big})
    with xr.load_dataset(path) as ds:
        assert ds.sizes["time"] == 1 and ds["a"].dtype == np.float32
        assert float(ds["a"][0, 2, 3]) == pytest.approx(3e38, rel=1e-6)
        assert np.isinf(ds["a"][0, 0, 0]) and np.isfinite(ds["a"][0, 1:]).all()


@pytest.mark.parametrize("code", [0, 2, 130])
def test_console_command_exits_at_once_only_when_interrupted(monkeypatch, code):
    """The console script exits with main's status; after an interrupt it skips the
    interpreter's teardown (os._exit), under which an XLA compilation cut short by the
    interrupt crashed it."""
    import physjax.cli as cli

    exits = []

    def os_exit(status):
        exits.append(status)
        raise SystemExit("os._exit")

    monkeypatch.setattr(cli, "main", lambda argv=None: code)
    monkeypatch.setattr(os, "_exit", os_exit)
    with pytest.raises(SystemExit) as stopped:
        cli.run_command(["plot"])
    assert exits == ([130] if code == 130 else [])
    assert stopped.value.code == ("os._exit" if code == 130 else code)


def test_no_picture_is_drawn_over_data(tmp_path, capsys):
    """`physjax plot FILE` writes FILE's name with .png: a data file named like a picture
    was replaced by its own picture, and a --plot/--output path linking to another data file
    replaced that one, with exit 0. An existing file is now replaced only if it is a PNG."""
    code, run = _run(tmp_path, "--max-frames", "1", name="run.h5")
    assert code == 0
    data = run.read_bytes()
    disguised = tmp_path / "data.png"  # an HDF5 file with a picture's name
    disguised.write_bytes(data)
    other = tmp_path / "other.h5"
    other.write_bytes(data)
    link = tmp_path / "link.png"
    link.symlink_to(other)
    capsys.readouterr()
    assert main(["plot", str(disguised)]) == 2
    assert "is the input file itself" in capsys.readouterr().err
    assert main(["plot", str(run), "--output", str(link)]) == 2
    assert "exists and is not a PNG image" in capsys.readouterr().err
    code, new = _run(tmp_path, "--plot", str(link), name="new.h5")
    assert code == 2 and "exists and is not a PNG image" in capsys.readouterr().err
    assert not new.exists()
    assert disguised.read_bytes() == other.read_bytes() == data
    # an earlier picture is replaced as before
    picture = tmp_path / "run.png"
    assert main(["plot", str(run)]) == 0 and picture.read_bytes()[:4] == b"\x89PNG"
    before = picture.stat().st_mtime_ns
    assert main(["plot", str(run), "--frame", "0"]) == 0
    assert picture.stat().st_mtime_ns >= before
    # a file physjax did not write is not drawn with made-up axes and units
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as f:
        f["h"] = np.ones((3, 16, 16))
    capsys.readouterr()
    assert main(["plot", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert "was not written by physjax" in err and "Warning" not in err
    assert not (tmp_path / "foreign.png").exists()


def test_replacing_notice_only_when_the_file_is_replaced(tmp_path, capsys):
    """The line naming a replaced run came before the checks of the other settings, so a
    command refused for its --plot said it was replacing a file it then left alone."""
    code, out = _run(tmp_path)
    assert code == 0
    before = out.read_bytes()
    capsys.readouterr()
    code, _ = _run(tmp_path, "--plot", str(tmp_path / "p.jpg"))  # refused after the check
    err = capsys.readouterr().err
    assert code == 2 and "replacing the" not in err and len(err.strip().splitlines()) == 1, err
    assert out.read_bytes() == before
    assert _run(tmp_path)[0] == 0
    assert "replacing the shallow-water run in" in capsys.readouterr().err


def test_last_frame_lands_exactly_on_t_end(tmp_path):
    """7200 s in 7 steps of 7200/7 s: 7 * (7200 / 7) is 7200.000000000001, and the last
    frame's time was that, so ds.sel(time=7200.0) failed."""
    code, out = _run(tmp_path, "--dt", "1100", "--save-every", "1")
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert ds.attrs["n_frames"] == 8 and float(ds.time[-1]) == 7200.0
        assert float(ds.h.sel(time=7200.0).max()) > 0
        assert float(ds.time[-2]) == 6 * (7200 / 7)  # the others stay step * dt


def test_progress_in_a_log_is_drawn_every_half_minute(tmp_path, capsys, monkeypatch):
    """A batch job's log (stderr not a terminal) got ten bar refreshes a second; now one per
    LOG_PROGRESS_SECONDS, plus the first and the last."""
    original = NetCDFWriter.append

    def slow_append(self, *args):
        time.sleep(0.02)  # 60 frames: a run of over a second, whatever the machine
        return original(self, *args)

    monkeypatch.setattr(NetCDFWriter, "append", slow_append)
    out = tmp_path / "log.h5"
    args = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "1"]
    assert main(["shallow-water", *args, "--dt", "120", "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert "60/60" in err
    assert err.count("\r") <= 3, err.count("\r")


def test_progress_in_a_log_is_not_redrawn_by_tqdms_monitor_between_half_minutes(
    tmp_path, monkeypatch
):
    """tqdm's monitor thread redraws a bar whose last redraw is maxinterval old (10 s by
    default), whatever its mininterval: a batch log got a line at 30 s and then every 10 s
    (30, 50, 60, 70 s in a 70 s bar), not every LOG_PROGRESS_SECONDS. The bar of a log now
    waits that long for the monitor too (a run of minutes is needed to see the lines
    themselves: the bar's settings are checked)."""
    import tqdm

    from physjax.cli import LOG_PROGRESS_SECONDS

    bars = []

    class Recorded(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    args = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "10"]
    assert main(["shallow-water", *args, "--output", str(tmp_path / "m.h5")]) == 0
    (bar,) = bars
    assert bar.mininterval == LOG_PROGRESS_SECONDS
    assert bar.maxinterval >= LOG_PROGRESS_SECONDS


def test_a_progress_bar_that_cannot_be_written_does_not_stop_the_run(
    tmp_path, monkeypatch, unwritable_stderr
):
    """The progress bar is written to stderr; where that failed (a log on a full disk,
    ENOSPC; stderr closed, None) the run stopped with an OSError or AttributeError, its file
    left 'running' with frame 0 alone. The bar now goes quiet and the run ends complete."""
    monkeypatch.setattr(sys, "stderr", unwritable_stderr)
    out = tmp_path / "bar.h5"
    args = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "10"]
    assert main(["shallow-water", *args, "--output", str(out)]) == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete"
        assert f.attrs["n_frames"] == f["time"].shape[0] == 3  # steps 0, 10 and 12


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_finished_run_whose_log_is_full_exits_0(tmp_path):
    """A batch job logging stdout and stderr to a full disk: the run's file was complete,
    but its closing line failed with an OSError traceback (exit status 1; 120 where the
    line stayed buffered to the interpreter's exit), so the job was reported failed. The
    line is now dropped and the command exits 0."""
    out = tmp_path / "full.h5"
    args = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "10"]
    with open("/dev/full", "w") as full:
        res = subprocess.run(
            [sys.executable, "-m", "physjax.cli", "shallow-water", *args, "--output", str(out)],
            stdout=full,
            stderr=full,
            timeout=300,
        )
    assert res.returncode == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete"
        assert f.attrs["n_frames"] == 3


def test_writer_stores_numpy_and_jax_numbers_as_numbers(tmp_path):
    """A model's parameters are 0-d JAX arrays, step counts often NumPy integers: JSON
    cannot write either, and they used to be stored as text ("9.81" in `parameters`, the
    JSON string '"9.81"' in `parameter_gravity`, "5" for an np.int64 in `configuration`)."""
    import jax.numpy as jnp

    from physjax.grids import Grid
    from physjax.io import Variable, read_attrs

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    params = {"gravity": jnp.asarray(9.81), "n": np.int64(3), "x": np.array([1.5, 2.0])}
    w = NetCDFWriter(
        tmp_path / "p.h5",
        g,
        [Variable("h", ("centre", "centre"), "m", "h")],
        attrs={"parameters": params, "configuration": {"n_steps": np.int64(5)}},
    )
    attrs = read_attrs(w.path)
    assert attrs["parameters"] == {"gravity": 9.81, "n": 3, "x": [1.5, 2.0]}
    assert attrs["configuration"] == {"n_steps": 5}
    assert attrs["parameter_gravity"] == 9.81 and attrs["parameter_n"] == 3
    assert json.loads(attrs["parameter_x"]) == [1.5, 2.0]
    # the writer's own attributes are refused before a file is made: attrs={"status": "x"}
    # marked a new file "x" instead of running, and a resume then refused it
    for key in ("status", "n_frames", "parameter_gravity"):
        with pytest.raises(ValueError, match=rf"attrs: \['{key}'\] are written by physjax"):
            NetCDFWriter(
                tmp_path / "q.h5",
                g,
                [Variable("h", ("centre", "centre"), "m", "h")],
                attrs={key: "x"},
            )
    assert not (tmp_path / "q.h5").exists()


def test_a_run_stopped_before_its_first_frame_leaves_no_file(tmp_path, monkeypatch):
    """A SIGTERM (or second Ctrl-C) while frame 0 was computed (the first compile) left a
    file marked running with no frame: a new run refused it as unfinished and said to
    --resume it, and --resume refused it as holding no frame."""
    written = NetCDFWriter.write_static

    def interrupted(self, *args, **kwargs):
        written(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(NetCDFWriter, "write_static", interrupted)
    code, out = _run(tmp_path)
    assert code == 130
    assert not out.exists()
    monkeypatch.undo()
    assert _run(tmp_path)[0] == 0  # no --overwrite needed


def test_a_run_stopped_while_computing_frame_0_keeps_the_ended_run_it_would_replace(
    tmp_path, capsys, monkeypatch
):
    """A new run replaces an ended one at the same --output: the file was created (over the
    old one) before frame 0 was computed, whose first compile takes a moment, and a SIGTERM
    or second Ctrl-C there removed the new file too, leaving neither run. Frame 0 is now
    computed first: the old run stays as it was."""
    code, out = _run(tmp_path)
    assert code == 0
    before = out.read_bytes()
    capsys.readouterr()

    def stopped(self, state):
        raise KeyboardInterrupt  # a SIGTERM while frame 0's vorticity compiles

    monkeypatch.setattr(ShallowWater, "relative_vorticity", stopped)
    code, out = _run(tmp_path)
    assert code == 130
    assert out.read_bytes() == before
    assert "replacing" not in capsys.readouterr().err  # nothing was replaced


def test_a_first_ctrl_c_while_computing_frame_0_keeps_the_ended_run_it_would_replace(
    tmp_path, capsys, monkeypatch
):
    """A first Ctrl-C while frame 0 was computed (its first compile) only asked the run to
    stop after the frame in hand: the new file was made over the ended run all the same,
    marked interrupted at step 0 with the initial frame alone, and the old run was lost.
    A stop asked before the file is made now leaves the old run as it was (as a second
    Ctrl-C or a SIGTERM there does), and makes no file where there was none."""
    code, out = _run(tmp_path)
    assert code == 0
    before = out.read_bytes()
    capsys.readouterr()
    computed = ShallowWater.relative_vorticity

    def ctrl_c(self, state):  # the first Ctrl-C lands while frame 0's vorticity compiles
        os.kill(os.getpid(), signal.SIGINT)
        return computed(self, state)

    monkeypatch.setattr(ShallowWater, "relative_vorticity", ctrl_c)
    code, out = _run(tmp_path)
    assert code == 130
    assert out.read_bytes() == before
    err = capsys.readouterr().err
    assert "replacing" not in err
    assert err.rstrip().endswith(f"before its initial frame; {out} left as it was")
    code, new = _run(tmp_path, name="new.h5")
    assert code == 130 and not new.exists()
    assert capsys.readouterr().err.rstrip().endswith(f"{new} not created")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_drawing_the_plot_says_the_data_is_kept(
    tmp_path, capsys, monkeypatch, signum
):
    """A Ctrl-C or SIGTERM while the --plot picture was drawn, the run's file already
    complete, ended with the bare line "physjax shallow-water: interrupted": nothing named
    the output, said that it was whole, or how to get the picture. The line now says so."""
    import physjax._plot

    drawn = physjax._plot.plot_panels

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signum)
        return drawn(*args, **kwargs)

    monkeypatch.setattr(physjax._plot, "plot_panels", interrupted)
    png = tmp_path / "p.png"
    code, out = _run(tmp_path, "--plot", str(png))
    assert code == 130
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete" and f.attrs["n_frames"] == 3
    assert not png.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out.h5"]
    err = capsys.readouterr().err
    assert err.rstrip().endswith(
        f"physjax shallow-water: interrupted\n{out} is written and kept (3 frames, complete); "
        f"{png} was not drawn; draw it with: physjax plot {out} --output {png}"
    )


@pytest.mark.parametrize("extra", [(), ("--max-frames", "1")])
def test_a_sigterm_while_the_ended_run_is_marked_leaves_no_running_file(
    tmp_path, capsys, monkeypatch, extra
):
    """A SIGTERM (or Ctrl-C) after the last frame, while the file was marked complete (or
    stopped by --max-frames), left it marked 'running', as if a process still wrote it, and
    the command exited 130 with the bare line "interrupted"; a new run then refused it as
    unfinished. Marking the ended run is now not cut short."""
    finish = NetCDFWriter.finish

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(NetCDFWriter, "finish", signalled)
    code, out = _run(tmp_path, *extra)
    assert code == 0
    with h5py.File(out, "r") as f:
        status = f.attrs["status"]
    assert status == "complete" if not extra else status.startswith("stopped: at step 10")
    assert capsys.readouterr().out.startswith("wrote ")


@pytest.mark.parametrize("resume", [False, True])
def test_a_sigterm_just_after_the_file_is_marked_running_is_recorded(
    tmp_path, capsys, monkeypatch, resume
):
    """A SIGTERM (or second Ctrl-C) just after the file was marked running (--resume's
    reopen; a new run's frame 0, then the progress bar made) and before the run handled a
    stop itself left the file marked 'running', as if a process still wrote it, and the
    command exited 130 with the bare line "interrupted" (no --resume line); a new run then
    refused the file. The stop now waits for the run, which records it at once."""
    import tqdm

    if resume:
        code, out = _run(tmp_path, "--save-every", "2", "--max-frames", "2")
        assert code == 0
    capsys.readouterr()
    reopen = NetCDFWriter.reopen.__func__

    def reopened(cls, *args, **kwargs):
        writer = reopen(cls, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return writer

    class Signalled(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)

    if resume:
        monkeypatch.setattr(NetCDFWriter, "reopen", classmethod(reopened))
        code = main(["shallow-water", "--output", str(out), "--resume", "--quiet"])
    else:
        monkeypatch.setattr(tqdm, "tqdm", Signalled)
        code, out = _run(tmp_path, "--save-every", "2")
    assert code == 130
    step, frames = (4, 3) if resume else (0, 1)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == f"interrupted: at step {step}, t = {600 * step} s"
        assert f.attrs["n_frames"] == frames
    err = capsys.readouterr().err
    assert err.rstrip().endswith(f"continue with: physjax shallow-water --output {out} --resume")
    monkeypatch.undo()
    assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 0


def test_a_sigterm_while_a_blown_up_run_is_marked_failed(tmp_path, capsys, monkeypatch):
    """A SIGTERM (or second Ctrl-C) while a run that blew up was marked failed left its file
    marked 'running' (as if a process still wrote it; a new run refused it) and the command
    exited 130 with the bare line "interrupted". The file is now marked failed and the
    command ends as a blow-up does (exit 3, naming the step)."""
    finish = NetCDFWriter.finish

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(NetCDFWriter, "finish", signalled)
    args = ["--case", "geostrophic-adjustment", "--n", "16", "--dt", "6000", "--t-end"]
    args += ["6000000", "--save-every", "1", "--no-cfl-check", "--quiet"]
    out = tmp_path / "boom.h5"
    assert main(["shallow-water", *args, "--output", str(out)]) == 3
    assert "blew up (NaN/Inf or h <= 0) at step" in capsys.readouterr().err
    with h5py.File(out, "r") as f:
        assert f.attrs["status"].startswith("failed: NaN/Inf or h <= 0 at step")


def test_resume_refuses_a_run_stepped_with_another_time_scheme(tmp_path, capsys):
    """The configuration stores the run's time scheme, but --resume never read it: a file
    whose run was stepped with rk4 (another physjax version's) was continued with ssprk3
    without a word, its frames no longer those of the run. It is now refused, the file
    untouched."""
    code, out = _run(tmp_path, "--save-every", "2", "--max-frames", "1")
    assert code == 0
    with h5py.File(out, "r+") as f:
        configuration = json.loads(f.attrs["configuration"])
        assert configuration["scheme"] == "ssprk3"
        f.attrs["configuration"] = json.dumps({**configuration, "scheme": "rk4"})
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "was stepped with the time scheme 'rk4'" in err and "steps with 'ssprk3'" in err
    assert out.read_bytes() == before


def test_resume_refuses_a_run_begun_with_other_parameters_than_its_case_gives(tmp_path, capsys):
    """The configuration stores only the --param overrides; the case's defaults fill in the
    rest, and the values the run began with are in the file's `parameters`. --resume rebuilt
    the case from this physjax's defaults without reading them: a file whose run began with
    another mean_depth (another physjax version's default, 200 m for the 100 m here) was
    continued with 100 m, exit 0, its new frames another run's. It is now refused, naming
    the parameter, the file untouched; an unchanged file and a run's own --param and
    --t-end still resume."""
    code, out = _run(tmp_path, "--save-every", "2", "--max-frames", "1")
    assert code == 0
    code, own = _run(
        tmp_path, "--save-every", "2", "--max-frames", "1", "--param", "mean_depth=150",
        name="own.h5",
    )  # fmt: skip
    assert code == 0
    with h5py.File(out, "r+") as f:
        parameters = json.loads(f.attrs["parameters"])
        assert parameters["mean_depth"] == 100.0 and parameters["t_end"] == 7200.0
        f.attrs["parameters"] = json.dumps({**parameters, "mean_depth": 200.0})
        f.attrs["parameter_mean_depth"] = 200.0
    before = out.read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", "--output", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "began with mean_depth = 200.0, where it now has 100.0" in err, err
    assert out.read_bytes() == before
    assert main(["shallow-water", "--output", str(own), "--resume", "--quiet"]) == 0
    with xr.open_dataset(own) as ds:
        assert ds.attrs["status"] == "complete" and ds.attrs["parameter_mean_depth"] == 150.0
        assert float(ds["time"][-1]) == 7200.0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_a_stderr_write_is_blocked_is_no_error(monkeypatch, signum):
    """A Ctrl-C or SIGTERM while a write to stderr was blocked (the progress bar on a paused
    terminal, a pipe nobody reads) ran the handler inside that write, and its notice,
    written to the same stream, raised RuntimeError ("reentrant call inside
    BufferedWriter") out of the bar's write: the run ended as an unforeseen error with a
    traceback. The notice is now dropped there and the stop goes on as asked."""
    import threading

    from physjax.cli import _StopRequest

    r, w = os.pipe()
    stream = open(w, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", stream)

    def signal_then_drain():
        time.sleep(0.5)  # the write below is blocked on the full pipe by now
        os.kill(os.getpid(), signum)
        time.sleep(0.2)
        while os.read(r, 1 << 16):
            pass

    drain = threading.Thread(target=signal_then_drain, daemon=True)
    drain.start()
    try:
        with _StopRequest() as stop:
            try:
                stream.write("x" * 300_000 + "\n")  # a pipe holds 64 KiB
                raised = None
            except BaseException as e:
                raised = type(e)
    finally:
        stream.close()
        drain.join()
    assert stop.requested
    assert raised is (None if signum == signal.SIGINT else KeyboardInterrupt)


def test_resume_with_no_plot_draws_no_picture_where_the_run_had_one(tmp_path, capsys, monkeypatch):
    """A run started with --plot drew it again on every --resume: a resume from another
    folder, where the stored relative path leads nowhere, could only go on with a new
    --plot. --no-plot leaves the picture out."""
    began, elsewhere = tmp_path / "began", tmp_path / "elsewhere"
    (began / "figs").mkdir(parents=True)
    elsewhere.mkdir()
    out = tmp_path / "r.h5"
    monkeypatch.chdir(began)
    assert main(["shallow-water", *FAST, "--save-every", "2", "--output", str(out),
                 "--plot", "figs/a.png", "--max-frames", "1"]) == 0  # fmt: skip
    (began / "figs" / "a.png").unlink()
    monkeypatch.chdir(elsewhere)
    before = out.read_bytes()
    capsys.readouterr()
    resume = ["shallow-water", "--output", str(out), "--resume", "--quiet"]
    assert main(resume) == 2
    err = capsys.readouterr().err
    assert "--plot 'figs/a.png': folder" in err
    assert "(the --plot the run was started with, drawn again on --resume: give another " in err
    assert err.rstrip().endswith("--plot, or --no-plot)")
    assert out.read_bytes() == before
    assert main([*resume, "--no-plot", "--plot", "b.png"]) == 2
    assert "--plot and --no-plot exclude each other" in capsys.readouterr().err
    assert main([*resume, "--no-plot"]) == 0
    assert capsys.readouterr().out.startswith("wrote 5 more frames (7 in the file) of")
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete" and ds.sizes["time"] == 7
    assert list(elsewhere.iterdir()) == [] and list((began / "figs").iterdir()) == []


def _damaged_copies(out, tmp_path):
    """Copies of the physjax file ``out``: an object header overwritten, the root group's
    header zeroed, and the file cut in half."""
    data = out.read_bytes()
    with h5py.File(out, "r") as f:
        header = h5py.h5o.get_info(f["time"].id).addr
        root = h5py.h5o.get_info(f.id).addr
    copies = {}
    for name, start, filler in (("header", header, b"\xff"), ("root", root, b"\x00")):
        d = bytearray(data)
        d[start : start + 40] = filler * 40
        copies[name] = bytes(d)
    copies["truncated"] = data[: len(data) // 2]
    paths = []
    for name, content in copies.items():
        p = tmp_path / f"damaged {name}.h5"  # a space in the name, too
        p.write_bytes(content)
        paths.append(p)
    return paths


def test_a_damaged_file_is_neither_resumed_nor_replaced_and_says_so(tmp_path, capsys):
    """--resume of a damaged or truncated file, and a new run whose --output is one, stop
    with one line naming the file and what to do (exit 2), the file untouched. A damaged
    object header used to escape as a traceback (h5py's KeyError; a damaged root group
    also printed "Exception ignored … AttributeError" from h5netcdf's cleanup)."""
    import gc

    code, out = _run(tmp_path, "--max-frames", "1")
    assert code == 0
    for path in _damaged_copies(out, tmp_path):
        before = path.read_bytes()
        capsys.readouterr()
        argv = ["shallow-water", *FAST, "--output", str(path)]
        assert main([*argv, "--resume"]) == 2
        gc.collect()
        err = capsys.readouterr().err
        assert err.startswith(f"physjax shallow-water: error: --resume: cannot read {str(path)!r}")
        assert "the file is damaged or truncated" in err
        assert "it is left as it is. Start a new run with another --output, or replace it" in err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert main(argv) == 2
        gc.collect()
        err = capsys.readouterr().err
        assert err.startswith(
            f"physjax shallow-water: error: --output {str(path)!r} exists and cannot be read: "
            "it is damaged or truncated ("
        )
        assert err.rstrip().endswith("Pass --overwrite to replace it, or give another --output")
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert main(["poisson", "--n", "16", "--quiet", "--output", str(path)]) == 2
        gc.collect()
        err = capsys.readouterr().err
        assert err.startswith(
            f"physjax poisson: error: --output {str(path)!r} exists and cannot be read: "
        )
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".lock")]


def test_python_m_physjax_is_the_command():
    """``python -m physjax`` stopped with "No module named physjax.__main__"; it is now the
    ``physjax`` command, with its exit status."""
    res = subprocess.run(
        [sys.executable, "-m", "physjax", "shallow-water", "--n", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and res.stderr.startswith("physjax shallow-water: error: "), res
    assert "--n" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(
        [sys.executable, "-m", "physjax", "--help"], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0 and res.stdout.startswith("usage: physjax "), res


def test_finish_refuses_the_writers_own_attributes(tmp_path):
    """finish(**attrs) stored any attribute, the writer's own too: finish(n_frames=1) on a
    file of 2 frames left n_frames = 1, and every reader (read_frame, xarray sliced by
    n_frames as docs/output.md shows, a resume) then lost the last frame. They are now
    refused, as the constructor's attrs are, and the file is left as it was."""
    from physjax.grids import Grid
    from physjax.io import Variable, read_attrs

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "f.h5", g, [Variable("h", ("centre", "centre"), "m", "h")])
    for k in range(2):
        w.append(float(k), k, {"h": np.full(g.shape, k)})
    for key in ("n_frames", "physjax_version", "Conventions", "parameter_g"):
        with pytest.raises(ValueError, match=rf"finish: \['{key}'\] are written by physjax"):
            w.finish(**{key: 1})
    attrs = read_attrs(w.path)
    assert attrs["status"] == "running" and attrs["n_frames"] == 2
    w.finish(iterations=3)
    with h5py.File(w.path, "r") as f:
        assert int(f.attrs["n_frames"][0]) == 2 and f.attrs["status"] == "complete"
        assert f.attrs["physjax_version"] != 1 and f.attrs["iterations"] == 3


def test_finish_stores_parameters_and_configuration_as_the_new_file_does(tmp_path):
    """finish(configuration="text") stored the text as it was, where the constructor stores
    JSON: read_attrs (and physjax plot) then refused the file as "not valid JSON".
    finish(parameters=...) replaced the JSON but left the parameter_<name> copies of the
    old ones, which a caller could not mend (finish refuses parameter_* names)."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    g = Grid((2, 3), (2.0, 3.0), dtype="float64")
    attrs = {"parameters": {"a": 1, "b": 2}, "configuration": "oops"}
    w = NetCDFWriter(tmp_path / "f.h5", g, [Variable("h", CENTRE, "m", "h")], attrs=attrs)
    w.append(0.0, 0, {"h": np.zeros(g.shape)})
    w.finish(configuration="oops", parameters={"a": 2, "c": np.float32(0.5)})
    stored = read_attrs(w.path)
    assert stored["configuration"] == "oops"
    assert stored["parameters"] == {"a": 2, "c": 0.5}
    copies = {k: v for k, v in stored.items() if k.startswith("parameter_")}
    assert copies == {"parameter_a": 2, "parameter_c": 0.5}
    w.finish(configuration={"nx": 2})  # without parameters, the copies stay
    stored = read_attrs(w.path)
    assert stored["configuration"] == {"nx": 2} and stored["parameter_a"] == 2
    with pytest.raises(TypeError, match=r"finish\['parameters'\] must be a mapping"):
        w.finish(parameters=[1, 2])
    assert read_attrs(w.path)["parameters"] == {"a": 2, "c": 0.5}


def test_a_read_met_mid_append_points_to_read_retrying(tmp_path):
    """Reading a file a run was appending to raised, about half the time, "cannot read
    'live.h5': Can't synchronously read data (addr overflow ...)", a ValueError the
    docstrings gave only for damaged files: a caller retrying on BlockingIOError alone
    crashed. The message now says to read through read_retrying, which passes it; a
    lasting error does not get the hint."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_retrying
    from physjax.io._netcdf import _reading

    g = Grid((2, 3), (2.0, 3.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "f.h5", g, [Variable("h", CENTRE, "m", "h")])
    w.append(0.0, 0, {"h": np.ones(g.shape)})
    mid_append = "Can't synchronously read data (addr overflow, address = 9, eoa = 8)"
    hint = r"addr overflow.*\); a file a run is still writing can be read in the middle of"
    with pytest.raises(ValueError, match=rf"^cannot read .*{hint} an append: read it through"):
        with _reading(w.path):
            raise OSError(mid_append)
    with pytest.raises(ValueError) as lasting:
        with _reading(w.path):
            raise OSError("Can't synchronously read data (required filter 'lzf' is not registered)")
    assert "read_retrying" not in str(lasting.value)
    calls = []

    def read():
        calls.append(1)
        with _reading(w.path) as f:
            if len(calls) == 1:
                raise OSError(mid_append)
            return float(f["h"][0, 0, 0])

    assert read_retrying(w.path, read) == 1.0 and len(calls) == 2


def test_masked_cells_of_a_masked_array_are_stored_as_nan(tmp_path):
    """A NumPy masked array (a land mask; what netCDF4 and xarray's to_masked_array give)
    lost its mask on the way into the file: the masked cells were stored as whatever lay
    under the mask (1e20 here, a netCDF fill value), as valid data. They are now stored as
    NaN, in append and write_static, for float and integer arrays."""
    import xarray as xr

    from physjax.grids import Grid
    from physjax.io import Variable, read_frame

    g = Grid((4, 6), (1.0, 1.0), dtype="float32")
    centre = ("centre", "centre")
    variables = [Variable("h", centre, "m", "h"), Variable("b", centre, "m", "b", False)]
    w = NetCDFWriter(tmp_path / "m.h5", g, variables)
    land = np.zeros(g.shape, bool)
    land[1, 2] = land[3, 5] = True
    h = np.ma.masked_array(np.where(land, 1e20, np.arange(24.0).reshape(g.shape)), land)
    w.append(0.0, 0, {"h": h})
    w.write_static({"b": np.ma.masked_array(np.ones(g.shape, int), land)})
    w.append(1.0, 1, {"h": np.ma.masked_array(np.ones(g.shape))})  # nothing masked
    w.finish()
    first = read_frame(w.path, 0)["h"]
    assert np.isnan(first[land]).all()
    assert np.array_equal(first[~land], np.arange(24.0).reshape(g.shape)[~land])
    with xr.open_dataset(w.path) as ds:
        assert np.isnan(ds.b.values[land]).all() and (ds.b.values[~land] == 1).all()
        assert (ds.h.values[1] == 1).all()


def test_reopen_refuses_a_grid_other_than_the_files(tmp_path):
    """NetCDFWriter.reopen compared only the grid's shape with the file's: a grid of another
    extent or origin, other boundaries or another precision went on appending frames under
    the file's coordinates and boundary attributes (float64 values stored as float32). It
    now refuses them before writing anything; the file's own grid still resumes."""
    from physjax.grids import Grid
    from physjax.io import Variable, read_attrs

    variables = [Variable("h", ("centre", "centre"), "m", "h")]
    g = Grid((4, 6), (1.0, 2.0), periodic=(False, True), dtype="float64")
    w = NetCDFWriter(tmp_path / "r.h5", g, variables)
    w.append(0.0, 0, {"h": np.ones(g.shape)})
    w.finish()
    others = [
        (Grid((4, 6), (100.0, 2.0), periodic=(False, True), dtype="float64"), "y cell centres"),
        (Grid((4, 6), (1.0, 2.0), (False, True), (0.0, 5.0), "float64"), "x cell centres"),
        (Grid((4, 6), (1.0, 2.0), periodic=True, dtype="float64"), "y axis of .* is wall"),
        (Grid((4, 6), (1.0, 2.0), periodic=(False, True), dtype="float32"), "stored as float64"),
    ]
    for other, message in others:
        with pytest.raises(ValueError, match=f"cannot resume: .*{message}"):
            NetCDFWriter.reopen(w.path, other, variables)
    assert read_attrs(w.path)["status"] == "complete"
    again = NetCDFWriter.reopen(w.path, g, variables)
    assert again.append(1.0, 1, {"h": np.zeros(g.shape)}) == 2


def test_finish_refuses_a_time_independent_variable_never_written(tmp_path):
    """A time-independent variable (Variable(..., time_dependent=False)) never given to
    write_static was marked complete all the same and read back as zeros (HDF5's fill),
    a flat bottom or a zero field like any other. finish() now refuses to mark such a file
    complete, naming the variable; a failed or interrupted run is still recorded as such."""
    from physjax.grids import Grid
    from physjax.io import Variable, read_attrs

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    centre = ("centre", "centre")
    variables = [Variable("h", centre, "m", "h"), Variable("b", centre, "m", "bottom", False)]
    w = NetCDFWriter(tmp_path / "s.h5", g, variables)
    w.append(0.0, 0, {"h": np.ones(g.shape)})
    with pytest.raises(ValueError, match=r"variable\(s\) \['b'\] of .* were never written"):
        w.finish()
    assert read_attrs(w.path)["status"] == "running"
    w.write_static({"b": np.zeros(g.shape)})  # zeros written are data
    w.finish()
    assert read_attrs(w.path)["status"] == "complete"
    failed = NetCDFWriter(tmp_path / "f.h5", g, variables)
    failed.finish("failed: NaN at step 0")
    assert read_attrs(failed.path)["status"] == "failed: NaN at step 0"


def test_a_replacing_note_that_cannot_be_written_does_not_stop_the_run(
    tmp_path, monkeypatch, capsys, unwritable_stderr
):
    """A run over an earlier finished run says on stderr that it replaces it; where that
    could not be written (a log on a full disk) the run stopped there with an OSError
    traceback, the earlier run's file left as it was and no new one, and with stderr closed
    (2>&-) the note went to stdout. It is now dropped, as the progress bar is."""
    out = tmp_path / "again.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "3600"]
    assert main([*args, "--output", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sys, "stderr", unwritable_stderr)
    assert main([*args, "--save-every", "1", "--output", str(out)]) == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete" and f.attrs["n_frames"] == 7  # the new run's
    assert capsys.readouterr().out.startswith("wrote 7 frames")  # the closing line alone


def test_append_refuses_a_frame_that_does_not_go_forward(tmp_path):
    """append() accepted a frame at an earlier (or the same) time or step than the last
    one: the file's time axis then went backwards, and xarray's selection by time
    (``ds.sel(time=...)``) failed on the non-monotonic index. It is refused now, naming
    the last frame, with nothing written; finish() refuses a status that is not text."""
    from physjax.grids import Grid
    from physjax.io import Variable, read_attrs

    g = Grid((4, 6), (1.0, 1.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "b.h5", g, [Variable("h", ("centre", "centre"), "m", "h")])
    assert w.append(5.0, 5, {"h": np.ones(g.shape)}) == 1
    for t, step in [(1.0, 1), (5.0, 5), (6.0, 5), (5.0, 6)]:
        with pytest.raises(ValueError, match=r"frame 1 must come after .*t = 5 s, step 5"):
            w.append(t, step, {"h": np.zeros(g.shape)})
    assert w.frames() == (1, 5)
    assert w.append(6.0, 6, {"h": np.zeros(g.shape)}) == 2
    with pytest.raises(ValueError, match="status must be a non-empty string, got 5"):
        w.finish(status=5)
    assert read_attrs(w.path)["status"] == "running"
    w.finish()
    with xr.open_dataset(w.path) as ds:
        assert ds.sel(time=6.0)["h"].values.sum() == 0


@pytest.mark.parametrize("name", ["run_shallow_water.py", "solve_poisson.py"])
def test_scripts_with_a_shebang_can_be_run_by_their_path(name):
    """scripts/*.py begin with ``#!/usr/bin/env python`` but were stored without the
    executable bit: ``scripts/run_shallow_water.py --n 32`` failed with "Permission
    denied". Each is now executable, and its shebang and entry point are the command's."""
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", name)
    with open(script) as f:
        text = f.read()
    assert text.startswith("#!/usr/bin/env python\n")
    assert "from physjax.cli import run_command" in text
    assert os.access(script, os.X_OK), f"scripts/{name} is not executable"


def test_writer_takes_its_variables_from_any_iterable(tmp_path):
    """variables given as a generator were used up by the check for doubled names, and the
    writer made a file of no variables (its append then said it had no time axis)."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_frame

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "gen.nc"
    w = NetCDFWriter(path, grid, (Variable(n, CENTRE, "m", n) for n in ("h", "q")))
    assert list(w.variables) == ["h", "q"]
    w.append(0.0, 0, {"h": np.ones(grid.shape), "q": np.full(grid.shape, 2.0)})
    frame = read_frame(path)
    assert float(frame["h"].sum()) == 12.0 and float(frame["q"].sum()) == 24.0


def test_attributes_hdf5_cannot_store_are_refused_before_anything_is_written(tmp_path):
    """An attribute h5py cannot store failed deep in h5py, naming neither the attribute nor
    the argument ("VLEN strings do not support embedded NULLs", "Object dtype dtype('O') has
    no native HDF5 equivalent" for an int beyond int64, a RuntimeError for an empty name),
    and finish() had by then written the status and the attributes before it."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    h = [Variable("h", CENTRE, "m", "H")]
    for attrs, match in [
        ({"note": "a\x00b"}, "attrs: attribute 'note' holds a NUL character"),
        ({"": 1}, "attrs: attribute names must be non-empty strings, got ''"),
        (
            {"parameters": {"g": "9\x00"}},
            "attrs['parameters']: attribute 'parameter_g' holds a NUL",
        ),
        ({"title": "t\x00"}, "attrs: attribute 'title' holds a NUL"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            NetCDFWriter(tmp_path / "bad.nc", grid, h, attrs=attrs)
    assert os.listdir(tmp_path) == []
    path = tmp_path / "w.nc"
    w = NetCDFWriter(path, grid, h, attrs={"parameters": {"big": 2**80}, "seed": -(2**70)})
    assert read_attrs(path)["parameter_big"] == str(2**80)  # exact, as text
    assert read_attrs(path)["parameters"] == {"big": 2**80}
    assert read_attrs(path)["seed"] == str(-(2**70))
    w.append(0.0, 0, {"h": np.zeros(grid.shape)})
    before = path.read_bytes()
    with pytest.raises(ValueError, match=re.escape("finish: attribute 'note' holds a NUL")):
        w.finish("failed: x", a=1, note="a\x00b")
    assert path.read_bytes() == before  # neither the status nor `a` written
    assert read_attrs(path)["status"] == "running" and "a" not in read_attrs(path)
    w.finish(big=2**64)
    assert read_attrs(path)["big"] == str(2**64) and read_attrs(path)["status"] == "complete"


def test_a_finished_writer_appends_nothing(tmp_path):
    """append after finish() added a frame to a file marked complete, which went on saying
    so (and a run that then crashed left a 'complete' file short of its frames)."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "f.nc"
    w = NetCDFWriter(
        path, grid, [Variable("h", CENTRE, "m", "H"), Variable("b", CENTRE, "m", "B", False)]
    )
    w.write_static({"b": np.zeros(grid.shape)})
    w.append(0.0, 0, {"h": np.zeros(grid.shape)})
    w.finish()
    before = path.read_bytes()
    with pytest.raises(
        ValueError, match=re.escape("append: ") + ".*has been finished \\(status 'complete'\\)"
    ):
        w.append(1.0, 1, {"h": np.ones(grid.shape)})
    with pytest.raises(ValueError, match=re.escape("write_static: ") + ".*has been finished"):
        w.write_static({"b": np.ones(grid.shape)})
    assert path.read_bytes() == before
    assert read_attrs(path)["n_frames"] == 1
    w.finish("failed: checked afterwards")  # a second finish changes the status
    assert read_attrs(path)["status"] == "failed: checked afterwards"
    with pytest.raises(ValueError, match="status 'failed: checked afterwards'"):
        w.append(1.0, 1, {"h": np.ones(grid.shape)})
    w2 = NetCDFWriter.reopen(path, grid, list(w.variables.values()))
    assert w2.append(1.0, 1, {"h": np.ones(grid.shape)}) == 2


def test_writer_arguments_of_the_wrong_kind_are_named(tmp_path):
    """A grid, variable, attrs or parameters of the wrong kind failed with an AttributeError
    naming none of them ("'list' object has no attribute 'items'")."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable

    grid = Grid((3, 4), (3e3, 4e3))
    h = Variable("h", CENTRE, "m", "H")
    path = tmp_path / "w.nc"
    for args, kwargs, match in [
        ((None, [h]), {}, "grid must be a physjax.grids.Grid, got NoneType"),
        ((grid, ["h"]), {}, "variables must be physjax.io.Variable objects, got str 'h'"),
        ((grid, h), {}, "variables must be a sequence of physjax.io.Variable, got Variable"),
        ((grid, [h]), {"attrs": [("case", "x")]}, "attrs must be a mapping"),
        ((grid, [h]), {"attrs": {"parameters": [1.0]}}, "attrs['parameters'] must be a mapping"),
    ]:
        with pytest.raises(TypeError, match=re.escape(match)):
            NetCDFWriter(path, *args, **kwargs)
    assert not path.exists()


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_bfloat16_and_other_jax_dtypes_are_written_exactly(tmp_path, precision):
    """A bfloat16 field (JAX's mixed precision), NumPy dtype kind "V", was refused as "must
    be real and numeric, got dtype bfloat16"; float32 holds each of its values exactly."""
    import jax.numpy as jnp

    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_frame

    grid = Grid((3, 4), (3e3, 4e3), dtype=precision)
    path = tmp_path / "b.nc"
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")])
    h = jnp.linspace(-3.3, 1e30, 12, dtype=jnp.bfloat16).reshape(grid.shape)
    w.append(0.0, 0, {"h": h})
    w.append(1.0, 1, {"h": jnp.full(grid.shape, -7, jnp.int4)})
    got = read_frame(path, 0)["h"]
    assert got.dtype == np.dtype(precision)
    np.testing.assert_array_equal(got, np.asarray(h, dtype=np.float32))
    assert float(got[0, 0]) == float(jnp.bfloat16(-3.3)) == -3.296875
    assert float(read_frame(path, 1)["h"].sum()) == -84.0
    with pytest.raises(ValueError, match="must be real and numeric, got dtype"):
        w.append(2.0, 2, {"h": np.zeros(grid.shape, dtype="V4")})


def test_append_refuses_a_time_or_step_given_as_text(tmp_path):
    """time "1.0" and step "3" went through float() and int() and were stored as numbers."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "t.nc"
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")])
    one = {"h": np.ones(grid.shape)}
    with pytest.raises(
        ValueError, match=re.escape("time must be a finite number of seconds, got '1.0'")
    ):
        w.append("1.0", 0, one)
    with pytest.raises(
        ValueError, match=re.escape("step must be a whole number from 0 to 2**63 - 1, got '3'")
    ):
        w.append(1.0, "3", one)
    with pytest.raises(
        ValueError, match=re.escape("time must be a finite number of seconds, got b'1'")
    ):
        w.append(b"1", 0, one)
    assert read_attrs(path)["n_frames"] == 0
    assert w.append(np.float32(0.5), np.int64(3), one) == 1


def test_reopen_refuses_fewer_variables_than_the_file_holds(tmp_path):
    """reopen with some of the file's time-dependent variables appended frames that left
    the others unwritten, read back as zeros in frames counted as whole."""
    from physjax.grids import CENTRE, X_FACE, Grid
    from physjax.io import Variable

    grid = Grid((3, 4), (3e3, 4e3))
    h, u = Variable("h", CENTRE, "m", "H"), Variable("u", X_FACE, "m s-1", "U")
    b = Variable("b", CENTRE, "m", "B", False)
    path = tmp_path / "r.nc"
    w = NetCDFWriter(path, grid, [h, u, b])
    w.write_static({"b": np.ones(grid.shape)})
    w.append(0.0, 0, {"h": np.ones(grid.shape), "u": np.ones(grid.shape)})
    w.finish("stopped: x")
    before = path.read_bytes()
    with pytest.raises(
        ValueError, match=re.escape("also holds the time-dependent variable(s) ['u']")
    ):
        NetCDFWriter.reopen(path, grid, [h, b])
    assert path.read_bytes() == before
    w = NetCDFWriter.reopen(path, grid, [h, u])  # a static variable may be left out
    w.append(1.0, 1, {"h": np.ones(grid.shape), "u": np.full(grid.shape, 2.0)})
    with xr.load_dataset(path) as ds:
        assert float(ds.u.isel(time=1).min()) == 2.0


def test_append_names_a_step_beyond_int64_and_a_time_beyond_float(tmp_path):
    """A step of 2**63 or more failed in h5py ("Python int too large to convert to C long")
    after the time axis had grown, and a time beyond float's range (10**400) was reported as
    a bad step."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "s.nc"
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")])
    one = {"h": np.ones(grid.shape)}
    w.append(0.0, 0, one)
    before = path.read_bytes()
    for step in (2**63, 1e20):
        with pytest.raises(
            ValueError,
            match=re.escape(f"step must be a whole number from 0 to 2**63 - 1, got {step!r}"),
        ):
            w.append(1.0, step, one)
    with pytest.raises(
        ValueError, match=re.escape("time must be a finite number of seconds, got 1000")
    ):
        w.append(10**400, 1, one)
    assert path.read_bytes() == before
    assert w.append(1.0, 2**63 - 1, one) == 2
    assert read_attrs(path)["n_frames"] == 2


@pytest.mark.parametrize("name", ["time", "step", "grid", "x", "y_f", "z"])
def test_a_variable_named_like_the_writers_own_is_refused_up_front(tmp_path, name):
    """A variable named "time", "x", "grid" … failed while the file was being made, with
    h5netcdf's "unable to create variable 'time' (name already exists)"; in 2-D "z" is free."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_frame

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "n.nc"
    if name == "z":
        NetCDFWriter(path, grid, [Variable(name, CENTRE, "m", "Z")]).append(
            0.0, 0, {"z": np.ones(grid.shape)}
        )
        assert float(read_frame(path)["z"].sum()) == 12.0
        return
    with pytest.raises(
        ValueError, match=re.escape(f"Variable.name {name!r} is a name the writer gives its own")
    ):
        NetCDFWriter(path, grid, [Variable(name, CENTRE, "m", "N")])
    assert not path.exists()


def test_a_second_output_lock_in_the_same_process_says_so(tmp_path):
    """flock locks per open file, so a second output_lock of the same path in one process is
    refused too; it was said to be held by "another physjax process" (its own pid)."""
    from physjax.io import OutputLocked, output_lock

    path = tmp_path / "l.nc"
    with output_lock(path):
        with pytest.raises(
            OutputLocked, match=re.escape("already being written by this process")
        ) as info:
            with output_lock(path):
                pass
        assert f"pid {os.getpid()} " in str(info.value) and "another" not in str(info.value)
    with output_lock(path):  # released, and taken again
        assert os.path.exists(tmp_path / ".l.nc.lock")
    assert os.listdir(tmp_path) == []


def test_a_dataset_kept_open_in_the_same_process_is_named_when_append_fails(tmp_path):
    """A library user who kept an xr.open_dataset of the output open in the process that
    writes it got h5py's bare "Unable to synchronously open file (file is already open for
    read-only)" from append (HDF5 opens a file once per process). It is still an OSError,
    which now says what holds the file and what to do; the file is unchanged."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_frame

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "o.nc"
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")])
    w.append(0.0, 0, {"h": np.ones(grid.shape)})
    ds = xr.open_dataset(path, engine="h5netcdf")
    try:
        with pytest.raises(OSError, match=re.escape("is open for reading in this process")):
            w.append(1.0, 1, {"h": np.full(grid.shape, 2.0)})
        with pytest.raises(OSError, match=re.escape("close it (ds.close()")):
            w.finish()
    finally:
        ds.close()
    assert w.append(1.0, 1, {"h": np.full(grid.shape, 2.0)}) == 2
    w.finish()
    assert float(read_frame(path)["h"][0, 0]) == 2.0


def test_read_frame_takes_a_jax_or_numpy_integer_index(tmp_path):
    """read_frame refused a JAX integer (jnp.int32(-1)) or a 0-d integer array as "not an
    integer frame number"; floats and bools are still refused."""
    import jax.numpy as jnp

    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_frame

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "i.nc"
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")])
    for k in range(3):
        w.append(float(k), k, {"h": np.full(grid.shape, float(k))})
    for index, want in [(jnp.int32(-1), 2), (np.array(1), 1), (np.int64(0), 0), (-2, 1)]:
        frame = read_frame(path, index)
        assert int(frame["step"]) == want and float(frame["h"][0, 0]) == want
    for bad in (1.0, True, np.bool_(False), jnp.float32(1.0), np.array([1])):
        with pytest.raises(TypeError, match="index must be an integer frame number"):
            read_frame(path, bad)


def test_text_attributes_are_stored_as_text_not_python_reprs(tmp_path):
    """A bytes attribute was stored as the text of its repr, "\\"b'abc'\\"", and an array of
    strings as "['a' 'b']" (in attrs, parameters and the configuration's JSON)."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "a.nc"
    attrs = {
        "source": b"abc",
        "names": np.array(["a", "bc"]),
        "parameters": {"scheme": np.bytes_(b"rk4"), "tags": np.array([b"x", b"y"])},
        "configuration": {"labels": np.array(["u", "v"]), "raw": b"q"},
    }
    NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")], attrs=attrs)
    a = read_attrs(path)
    assert a["source"] == "abc" and json.loads(a["names"]) == ["a", "bc"]
    assert a["parameter_scheme"] == "rk4" and json.loads(a["parameter_tags"]) == ["x", "y"]
    assert a["parameters"] == {"scheme": "rk4", "tags": ["x", "y"]}
    assert a["configuration"] == {"labels": ["u", "v"], "raw": "q"}
    with xr.load_dataset(path) as ds:
        assert ds.attrs["source"] == "abc"


def test_numpy_strings_and_odd_floats_are_attributes_netcdf_reads(tmp_path):
    """An item of an array of names (np.str_) failed in h5py ("No conversion path for
    dtype('<U9')"), in finish() after the new status was written; a float16 or long double
    was stored as an HDF5 type netCDF does not have, which its readers drop."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    names = np.array(["dam-break", "jet"])
    path = tmp_path / "a.nc"
    attrs = {
        "case": names[0],
        "cfl": np.float16(0.5),
        "ld": np.longdouble(2.0),
        "parameters": {"scheme": names[1], "g": np.float16(9.8125)},
    }
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")], attrs=attrs)
    w.append(0.0, 0, {"h": np.zeros(grid.shape)})
    w.finish("failed: NaN at step 3", note=names[0])
    a = read_attrs(path)
    assert (a["case"], a["parameter_scheme"], a["note"]) == ("dam-break", "jet", "dam-break")
    assert (a["cfl"], a["ld"], a["parameter_g"]) == (0.5, 2.0, 9.8125)
    assert a["status"] == "failed: NaN at step 3"
    with h5py.File(path, "r") as f:  # netCDF's float and double
        assert {f.attrs[k].dtype.itemsize for k in ("cfl", "ld", "parameter_g")} == {8}


def test_a_failing_finish_leaves_the_status_as_it_was(tmp_path):
    """The status is written last: a finish that fails on an attribute after the checks
    (here, h5py refusing a write) leaves the file's status as it was."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "a.nc"
    w = NetCDFWriter(path, grid, [Variable("h", CENTRE, "m", "H")])
    w.append(0.0, 0, {"h": np.zeros(grid.shape)})
    original = h5py.AttributeManager.__setitem__

    def refuse_note(self, name, value):
        if name == "note":
            raise OSError("disk full")
        original(self, name, value)

    h5py.AttributeManager.__setitem__ = refuse_note
    try:
        with pytest.raises(OSError, match="disk full"):
            w.finish("failed: x", note="n", zz=1)
    finally:
        h5py.AttributeManager.__setitem__ = original
    assert read_attrs(path)["status"] == "running"


def test_bad_fields_attributes_and_names_are_named(tmp_path):
    """A list or None for a frame's fields stopped on NumPy's "truth value of an array is
    ambiguous" or "argument of type 'NoneType' is not iterable", an array given to
    write_static on "has no attribute 'items'"; a tuple key in a nested attribute on JSON's
    message alone; a NUL in a variable's name was stored cut at the NUL."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable

    grid = Grid((3, 4), (3e3, 4e3))
    h = Variable("h", CENTRE, "m", "H")
    b = Variable("b", CENTRE, "m", "B", time_dependent=False)
    w = NetCDFWriter(tmp_path / "a.nc", grid, [h, b])
    for fields in ([np.zeros(grid.shape)], None):
        with pytest.raises(TypeError, match="fields must be a mapping of variable names"):
            w.append(0.0, 0, fields)
    with pytest.raises(TypeError, match="fields must be a mapping .* got ndarray"):
        w.write_static(np.zeros(grid.shape))
    assert w.frames() == (0, None)
    for attrs, match in [
        ({"meta": {(1, 2): 3}}, "attrs: attribute 'meta': {(1, 2): 3} cannot be stored as JSON"),
        ({"parameters": {"k": {(1,): 2}}}, "attrs['parameters']: attribute 'parameter_k': "),
        ({"configuration": {"c": {(1,): 2}}}, "attrs['configuration']: {'c': {(1,): 2}} cannot"),
    ]:
        with pytest.raises(ValueError, match=re.escape(match)):
            NetCDFWriter(tmp_path / "bad.nc", grid, [h], attrs=attrs)
    with pytest.raises(ValueError, match="Variable.name must be .* without '/' or a NUL"):
        NetCDFWriter(tmp_path / "bad.nc", grid, [Variable("h\x00x", CENTRE, "m", "H")])
    assert sorted(os.listdir(tmp_path)) == ["a.nc"]


def test_reopen_shows_cell_centres_that_differ_in_full(tmp_path):
    """reopen of a grid whose origin moved by 1 mm said the file's x cell centres "are -1500
    … 1500, those of the grid asked for -1500 … 1500": six digits hid the difference."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable

    h = Variable("h", CENTRE, "m", "H")
    grid = Grid((3, 4), (3e3, 4e3), origin=(0.0, -2e3), dtype="float64")
    path = tmp_path / "o.nc"
    NetCDFWriter(path, grid, [h]).append(0.0, 0, {"h": np.ones(grid.shape)})
    moved = Grid((3, 4), (3e3, 4e3), origin=(0.0, -2e3 + 1e-3), dtype="float64")
    with pytest.raises(ValueError) as info:
        NetCDFWriter.reopen(path, moved, [h])
    assert "are -1500.0 … 1500.0, those of the grid asked for -1499.999 … 1500.001" in str(
        info.value
    )


def test_frames_of_a_file_without_a_time_axis_is_none(tmp_path):
    """frames() of a writer of only time-independent variables (a Poisson solve's) raised a
    bare KeyError: 'time'."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable

    grid = Grid((3, 4), (3e3, 4e3))
    w = NetCDFWriter(tmp_path / "s.nc", grid, [Variable("b", CENTRE, "m", "B", False)])
    assert w.frames() == (0, None)
    w2 = NetCDFWriter(tmp_path / "t.nc", grid, [Variable("h", CENTRE, "m", "H")])
    assert w2.frames() == (0, None)
    w2.append(0.0, 7, {"h": np.ones(grid.shape)})
    assert w2.frames() == (1, 7)


@pytest.mark.parametrize("field", ["units", "long_name"])
@pytest.mark.parametrize("value", ["", "m\x00"])
def test_a_variable_without_units_or_long_name_is_refused(tmp_path, field, value):
    """Empty units or long_name were stored as "" (every variable is to have both), and a NUL
    in one failed while the file was being made ("VLEN strings do not support embedded
    NULLs")."""
    import dataclasses

    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable

    v = dataclasses.replace(Variable("h", CENTRE, "m", "H"), **{field: value})
    with pytest.raises(
        ValueError, match=re.escape(f"Variable.{field} of 'h' must be a non-empty string")
    ):
        NetCDFWriter(tmp_path / "e.nc", Grid((3, 4), (3e3, 4e3)), [v])
    assert os.listdir(tmp_path) == []


def test_reopen_checks_its_history_line_before_touching_the_file(tmp_path):
    """A history line with a NUL failed in h5py ("VLEN strings do not support embedded
    NULLs") after reopen had marked the file running; a number was taken as text."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    h = [Variable("h", CENTRE, "m", "H")]
    path = tmp_path / "h.nc"
    w = NetCDFWriter(path, grid, h)
    w.append(0.0, 0, {"h": np.ones(grid.shape)})
    w.finish("stopped: x")
    before = path.read_bytes()
    for history in ("a\x00b", 5):
        with pytest.raises(
            ValueError, match=re.escape("reopen: history must be a text without NUL")
        ):
            NetCDFWriter.reopen(path, grid, h, history=history)
    assert path.read_bytes() == before and read_attrs(path)["status"] == "stopped: x"
    NetCDFWriter.reopen(path, grid, h, history="resumed")
    assert read_attrs(path)["history"].endswith(": resumed")


def test_a_file_system_without_file_locks_is_named_with_its_remedy(tmp_path, monkeypatch, capsys):
    """On a file system without file locks (Lustre or NFS mounted without flock) HDF5 fails
    every open with "unable to lock file, errno = 524", and the remedy is
    HDF5_USE_FILE_LOCKING=FALSE. A --rhs read took it for a lock held by another process:
    it waited the full 5 s and then said the file "is locked by another process … try
    again"; a run's new file and read_attrs said nothing of the remedy (read_attrs: "locked
    by a process writing it; try again in a moment"). Each now names it, at once."""
    from physjax.io import read_attrs

    src = tmp_path / "f.h5"
    with h5py.File(src, "w") as fh:
        fh["f"] = np.ones((8, 8))
    real = h5py.File

    def no_locks(name, mode="r", *args, **kwargs):
        if kwargs.get("locking") is False:
            return real(name, mode, *args, **kwargs)
        raise OSError(
            524,
            "Unable to synchronously open file (unable to lock file, errno = 524, error "
            "message = 'Unknown error 524')",
        )

    monkeypatch.setattr(h5py, "File", no_locks)
    monkeypatch.setattr("physjax.io._reading.READ_WAIT", 20.0)  # a wait would be plain
    t0 = time.monotonic()
    out = tmp_path / "p.h5"
    code = main(["poisson", "--rhs", f"{src}:f", "--bc", "dirichlet", "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "HDF5_USE_FILE_LOCKING=FALSE" in err and "locked by another" not in err, err
    assert time.monotonic() - t0 < 10  # not the wait for a lock to be released
    code = main(["shallow-water", *FAST, "--output", str(tmp_path / "sw.h5")])
    err = capsys.readouterr().err
    assert code == 2 and "HDF5_USE_FILE_LOCKING=FALSE" in err, err
    assert not (tmp_path / "sw.h5").exists()
    with pytest.raises(ValueError, match="HDF5_USE_FILE_LOCKING=FALSE"):
        read_attrs(src)
    # an existing output, or one to resume, is not called damaged (nor --overwrite advised)
    for argv in (["shallow-water", *FAST], ["shallow-water", "--resume", "--quiet"]):
        assert main([*argv, "--output", str(src)]) == 2
        err = capsys.readouterr().err
        assert "HDF5_USE_FILE_LOCKING=FALSE" in err and "damaged" not in err, err
        assert "--overwrite" not in err, err


def test_progress_in_a_log_keeps_its_half_minute_when_the_run_slows(tmp_path, capsys, monkeypatch):
    """tqdm learnt at the first redraw how many steps make LOG_PROGRESS_SECONDS and then
    looked at the clock only after that many steps: a run slowing down after its first half
    minute (a node that got busy: 198 -> 134 steps/s) drew its next line 40 s later, then a
    second one at once. Here, on a simulated clock, frames take 6 s and then 20 s: the lines
    must stay at most LOG_PROGRESS_SECONDS plus one frame apart (they were 100 s apart)."""
    import re

    import tqdm.std

    from physjax.cli import LOG_PROGRESS_SECONDS

    clock = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    original = NetCDFWriter.append
    frames = []

    def timed_append(self, *args):
        frames.append(1)
        clock[0] += 6.0 if len(frames) <= 7 else 20.0
        return original(self, *args)

    monkeypatch.setattr(NetCDFWriter, "append", timed_append)
    args = ["--case", "gravity-wave", "--n", "16", "--t-end", "7200", "--save-every", "2"]
    assert main(["shallow-water", *args, "--dt", "120", "--output", str(tmp_path / "s.h5")]) == 0
    err = capsys.readouterr().err
    elapsed = [int(m) * 60 + int(s) for m, s in re.findall(r"\[(\d+):(\d+)<", err)]
    assert len(frames) == 31 and elapsed[-1] >= 500, (len(frames), elapsed)
    gaps = [b - a for a, b in zip(elapsed, elapsed[1:])]
    assert max(gaps) <= LOG_PROGRESS_SECONDS + 20, elapsed


def _configuration(path):
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["configuration"])


def test_config_from_a_runs_file_runs_it_again(tmp_path, capsys):
    """--config RUN.h5 gives a new run the settings the file's run was given: the same
    frames bit for bit and the same configuration but for the output's name; a setting
    given on the command line wins, as over a TOML file."""
    first = tmp_path / "first.h5"
    argv = ["shallow-water", "--case", "zonal-jet", "--nx", "16", "--ny", "12", "--quiet"]
    # a --dt that is lowered to end on --t-end (the file stores both) and a --param
    argv += ["--t-end", "20000", "--dt", "900", "--save-every", "7", "--precision", "float64"]
    assert main([*argv, "--param", "jet_speed=3.0", "--output", str(first)]) == 0
    again = tmp_path / "again.h5"
    assert main(["shallow-water", "--config", str(first), "--quiet", "--output", str(again)]) == 0
    with xr.open_dataset(first) as a, xr.open_dataset(again) as b:
        assert a.sizes == b.sizes and a.sizes["time"] > 2
        for name in ("h", "u", "v", "zeta"):
            np.testing.assert_array_equal(a[name], b[name])
        assert b.attrs["parameter_jet_speed"] == 3.0
    one, two = _configuration(first), _configuration(again)
    assert {k for k in one if one[k] != two.get(k)} == {"output"}
    assert two["dt_requested"] == 900.0 and two["dt"] < 900.0
    # the command line wins: another end time and parameter, a --cfl for the file's --dt
    later = tmp_path / "later.h5"
    over = ["--t-end", "10000", "--param", "jet_speed=2.0", "--cfl", "0.3", "--quiet"]
    assert main(["shallow-water", "--config", str(first), *over, "--output", str(later)]) == 0
    three = _configuration(later)
    assert three["t_end"] == 10000.0 and three["cfl"] == 0.3 and three["dt_requested"] is None
    assert (three["nx"], three["ny"], three["case"]) == (16, 12, "zonal-jet")
    with h5py.File(later, "r") as f:
        assert f.attrs["parameter_jet_speed"] == 2.0
    # a setting the first command left to its default follows the new command's others:
    # its frame interval from the new end time, as in a run typed anew
    short = tmp_path / "short.h5"
    assert main(["shallow-water", *FAST[:-3], "--quiet", "--output", str(short)]) == 0
    argv = ["shallow-water", "--config", str(short), "--t-end", "14400", "--quiet"]
    assert main([*argv, "--output", str(tmp_path / "longer.h5")]) == 0
    direct = ["shallow-water", *FAST[:4], "--t-end", "14400", "--quiet"]
    assert main([*direct, "--output", str(tmp_path / "direct.h5")]) == 0
    longer, typed = _configuration(tmp_path / "longer.h5"), _configuration(tmp_path / "direct.h5")
    assert {k for k in typed if typed[k] != longer.get(k)} == {"output"}
    assert longer["save_every"] != _configuration(short)["save_every"]


def test_config_from_a_file_is_refused_where_it_would_replace_it_or_is_no_run(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    # a run that kept its default name, given back without --output: the new run would
    # have replaced the file it reads its settings from
    assert main(["shallow-water", *FAST]) == 0
    before = (tmp_path / "gravity-wave.h5").read_bytes()
    capsys.readouterr()
    assert main(["shallow-water", "--config", "gravity-wave.h5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--output 'gravity-wave.h5' is the file that --config reads its settings from" in err
    assert (tmp_path / "gravity-wave.h5").read_bytes() == before
    # with --overwrite it is replaced by the same run
    assert main(["shallow-water", "--config", "gravity-wave.h5", "--quiet", "--overwrite"]) == 0
    # a --resume of the file with its own settings is no new run: allowed (already complete)
    argv = ["shallow-water", "--config", "gravity-wave.h5", "--output", "gravity-wave.h5"]
    assert main([*argv, "--resume", "--quiet"]) == 0
    # another command's file, and an HDF5 file that physjax did not write
    assert main(["poisson", "--n", "16", "--quiet", "--output", "p.h5"]) == 0
    capsys.readouterr()
    assert main(["shallow-water", "--config", "p.h5", "--output", "o.h5"]) == 2
    err = capsys.readouterr().err
    assert "'p.h5' holds the results of physjax poisson, not of physjax shallow-water" in err
    assert main(["poisson", "--config", "gravity-wave.h5", "--output", "o.h5"]) == 2
    assert "give it to physjax shallow-water --config" in capsys.readouterr().err
    with h5py.File("foreign.h5", "w") as f:
        f["h"] = np.zeros((4, 4))
    assert main(["shallow-water", "--config", "foreign.h5", "--output", "o.h5"]) == 2
    assert "'foreign.h5' is an HDF5 file without a physjax configuration" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "o.h5").exists()


def test_drive_names_the_first_unhealthy_step_inside_a_chunk():
    """A failure that is no NaN (the CLI's h <= 0) is located at its own step inside a
    chunk of save_every steps, with the `healthy` check the run was given."""
    from physjax._runner import SimulationBlewUp, drive

    frames = []
    with pytest.raises(SimulationBlewUp) as info:
        drive(
            lambda s, t0, n: s - n,  # one unit per step: 0 at step 7, negative from step 8
            np.float64(7.5),
            dt=10.0,
            step0=0,
            n_steps=20,
            save_every=5,
            on_frame=lambda s, t, k: frames.append(k),
            healthy=lambda s: s > 0,
            failure="h <= 0",
        )
    e = info.value
    assert (e.step, e.time, e.frames_written, frames) == (8, 80.0, 1, [5])
    assert str(e).startswith("the run blew up (h <= 0) at step 8, t = 80 s; the 1 frame")


def test_drive_catches_a_nan_in_one_field_of_the_state():
    """A NaN in one field of the state, the others finite, stops the run at its step."""
    from physjax._runner import SimulationBlewUp, _all_finite, drive

    def advance_(s, t0, n):
        k = t0 / 10.0 + n  # the step reached
        return {"h": s["h"] + n, "u": jnp.where(k >= 3, jnp.nan, s["u"])}

    state = {"h": jnp.ones(4), "u": jnp.zeros(4)}
    assert not bool(_all_finite({"h": jnp.ones(4), "u": jnp.array([0.0, jnp.inf, 0, 0])}))
    with pytest.raises(SimulationBlewUp, match=r"at step 3, t = 30 s; the 1 frame written"):
        drive(
            advance_,
            state,
            dt=10.0,
            step0=0,
            n_steps=8,
            save_every=2,
            on_frame=lambda s, t, k: None,
        )


@pytest.mark.parametrize("then", ["finish", "reopen"])
def test_a_frame_left_incomplete_by_an_append_stopped_midway_is_dropped(tmp_path, then):
    """A frame that an append stopped part-way wrote is dropped by `finish`, and by `reopen`
    before the resumed run writes anything: every reader sees the whole frames only."""
    from physjax.grids import CENTRE, X_FACE, Grid
    from physjax.io import Variable, read_attrs

    grid = Grid((3, 4), (3e3, 4e3))
    path = tmp_path / "f.nc"
    variables = [Variable("h", CENTRE, "m", "H"), Variable("u", X_FACE, "m s-1", "U")]
    w = NetCDFWriter(path, grid, variables)
    for k in range(2):
        w.append(float(k), k, {"h": np.full(grid.shape, 1.0 + k), "u": np.ones(grid.shape)})
    # what append does before a kill that lands ahead of its last line (n_frames = 3): the
    # time axis and its variables grown, time, step and h written, u not
    with h5py.File(path, "a") as h5:
        time_axis = h5["time"]
        time_axis.resize((3,))
        for ref, axis in time_axis.attrs["REFERENCE_LIST"]:
            h5[ref].resize(3, int(axis))
        time_axis[2], h5["step"][2], h5["h"][2] = 2.0, 2, np.full(grid.shape, 3.0)
        assert h5.attrs["n_frames"] == 2
    if then == "finish":
        w.finish()
    else:
        NetCDFWriter.reopen(path, grid, variables)
    with h5py.File(path, "r") as h5:
        assert h5["time"].shape[0] == h5["h"].shape[0] == h5["u"].shape[0] == 2
    with xr.open_dataset(path) as ds:
        assert ds.attrs["status"] == ("complete" if then == "finish" else "running")
        assert ds.sizes["time"] == 2
        np.testing.assert_array_equal(ds["time"].values, [0.0, 1.0])
    assert read_attrs(path)["n_frames"] == 2


def test_resume_refuses_another_end_time_or_frame_interval(tmp_path, capsys):
    """`--resume` with another `--t-end` or `--save-every` is refused and the file is untouched."""
    out = tmp_path / "r.h5"
    assert main(["shallow-water", *FAST, "--output", str(out), "--max-frames", "1"]) == 0
    before = out.read_bytes()
    resume = ["shallow-water", "--output", str(out), "--resume", "--quiet"]
    for extra, match in (
        (["--t-end", "14400"], "--t-end 14400.0 differs from the stored 7200.0 (leave it out"),
        (["--save-every", "5"], "--save-every 5 differs from the stored 10 (leave it out"),
    ):
        code = main([*resume, *extra])
        err = capsys.readouterr().err
        assert code == 2 and match in err, err
        assert out.read_bytes() == before
    # the stored values themselves continue it
    assert main([*resume, "--t-end", "7200", "--save-every", "10"]) == 0
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete" and float(ds["time"][-1]) == 7200.0


def test_a_new_run_replaces_a_failed_run_without_overwrite(tmp_path, capsys):
    """A run that blew up ("failed: ...") is replaced by a new run without `--overwrite`."""
    out = tmp_path / "boom.h5"
    boom = ["--case", "geostrophic-adjustment", "--n", "16", "--dt", "6000", "--t-end", "600000"]
    boom += ["--save-every", "1", "--no-cfl-check", "--quiet"]
    assert main(["shallow-water", *boom, "--output", str(out)]) == 3
    with h5py.File(out, "r") as f:
        status = f.attrs["status"]
    assert status.startswith("failed: NaN/Inf or h <= 0 at step")
    capsys.readouterr()
    assert main(["shallow-water", *FAST, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        f"replacing the shallow-water run in {out} (case geostrophic-adjustment, {status})" in err
    )
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"] == "complete" and ds.attrs["case"] == "gravity-wave"


def test_n_on_the_command_line_overrides_the_configs_nx_and_ny(tmp_path):
    """`--n` on the command line wins over the config's nx and ny; `--nx` beside it over `--n`."""
    cfg = tmp_path / "run.toml"
    cfg.write_text("case = 'gravity-wave'\nnx = 24\nny = 8\nt_end = 7200.0\nsave_every = 10\n")
    out = tmp_path / "o.h5"
    assert (
        main(["shallow-water", "--config", str(cfg), "--n", "16", "--quiet", "--output", str(out)])
        == 0
    )
    with xr.open_dataset(out) as ds:
        assert (ds.sizes["x"], ds.sizes["y"]) == (16, 16)
    # --nx given beside it wins over --n for its own axis
    out2 = tmp_path / "o2.h5"
    argv = ["shallow-water", "--config", str(cfg), "--n", "16", "--nx", "12", "--quiet"]
    assert main([*argv, "--output", str(out2)]) == 0
    with xr.open_dataset(out2) as ds:
        assert (ds.sizes["x"], ds.sizes["y"]) == (12, 16)


def test_config_from_a_runs_file_keeps_its_no_cfl_check(tmp_path):
    """`--config RUN.h5` of a `--no-cfl-check` run reruns it without the check."""
    first = tmp_path / "first.h5"
    argv = ["shallow-water", *FAST, "--dt", "360", "--no-cfl-check", "--output", str(first)]
    assert main(argv) == 0
    assert _configuration(first)["cfl_check"] is False
    again = tmp_path / "again.h5"
    assert main(["shallow-water", "--config", str(first), "--quiet", "--output", str(again)]) == 0
    one, two = _configuration(first), _configuration(again)
    assert two["cfl_check"] is False
    assert {k for k in one if one[k] != two.get(k)} == {"output"}


def test_read_frame_returns_the_time_dependent_variables_only(tmp_path):
    """`read_frame` gives the frame's variables, time and step, not the static ones."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_frame

    g = Grid((3, 4), (3.0, 4.0), dtype="float64")
    path = tmp_path / "k.h5"
    w = NetCDFWriter(
        path, g, [Variable("h", CENTRE, "m", "h"), Variable("b", CENTRE, "m", "b", False)]
    )
    w.write_static({"b": np.ones(g.shape)})
    for k in range(2):
        w.append(float(k), k, {"h": np.full(g.shape, float(k))})
    frame = read_frame(path)
    assert set(frame) == {"h", "time", "step"}
    assert frame["h"].shape == (3, 4) and float(frame["h"][0, 0]) == 1.0


def test_read_attrs_counts_complete_frames_only(tmp_path):
    """`read_attrs`' n_frames counts whole frames, not the time axis' length."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs, read_frame

    g = Grid((3, 4), (3.0, 4.0), dtype="float64")
    path = tmp_path / "c.h5"
    w = NetCDFWriter(path, g, [Variable("h", CENTRE, "m", "h")])
    for k in range(3):
        w.append(float(k), k, {"h": np.full(g.shape, float(k))})
    with h5py.File(path, "a") as f:
        f.attrs["n_frames"] = 2  # frame 2 was never completed
    assert read_attrs(path)["n_frames"] == 2
    assert int(read_frame(path)["step"]) == 1


def test_locks_unsupported_reads_the_errno_of_the_error_too():
    """A file system without locks is told from a held lock by the error's errno too."""
    from physjax.io._reading import locks_unsupported, transient_error

    no_locks = OSError(524, "Unable to synchronously open file (unable to lock file)")
    assert locks_unsupported(no_locks)
    assert transient_error(no_locks) is None  # no wait mends it
    held = OSError(11, "Unable to synchronously open file (unable to lock file)")
    assert not locks_unsupported(held)
    assert transient_error(held)[0] == "locked"


def test_every_coordinate_variable_carries_its_axis_2d_and_3d(tmp_path):
    """Every coordinate, centre and face, 2-D and 3-D, has its CF `axis`; faces the xgcm shift."""
    from physjax.grids import Grid
    from physjax.io import Variable

    for shape, extent in (((4, 6), (4e3, 6e3)), ((2, 4, 6), (100.0, 4e3, 6e3))):
        g = Grid(shape, extent, dtype="float32")
        path = tmp_path / f"a{len(shape)}.nc"
        w = NetCDFWriter(path, g, [Variable("h", ("centre",) * len(shape), "m", "H")])
        w.append(0.0, 0, {"h": np.zeros(g.shape)})
        w.finish()
        with xr.open_dataset(path) as ds:
            for name in g.axis_names:
                for coord in (name, f"{name}_f"):
                    assert ds[coord].attrs["axis"] == name.upper(), coord
            for name in g.axis_names:  # and xgcm's shift on the faces only
                assert ds[f"{name}_f"].attrs["c_grid_axis_shift"] == -0.5
                assert "c_grid_axis_shift" not in ds[name].attrs


def test_sgrid_locations_of_every_3d_stagger(tmp_path):
    """The SGRID location of each of the eight 3-D staggers, as docs/output.md lists them."""
    from physjax.grids import Grid
    from physjax.io import Variable

    g = Grid((2, 4, 6), (100.0, 4e3, 6e3), dtype="float32")  # axes (z, y, x)
    expected = {
        ("centre", "centre", "centre"): "volume",
        ("centre", "centre", "face"): "face1",  # normal to x
        ("centre", "face", "centre"): "face2",  # normal to y
        ("face", "centre", "centre"): "face3",  # normal to z
        ("face", "face", "centre"): "edge1",  # along x
        ("face", "centre", "face"): "edge2",  # along y
        ("centre", "face", "face"): "edge3",  # along z
        ("face", "face", "face"): "node",
    }
    assert set(expected) == set(itertools.product(("centre", "face"), repeat=3))
    names = {loc: "v_" + "".join(s[0] for s in loc) for loc in expected}
    variables = [Variable(names[loc], loc, "1", names[loc], False) for loc in expected]
    path = tmp_path / "s3.nc"
    w = NetCDFWriter(path, g, variables)
    w.write_static({names[loc]: np.zeros(g.shape) for loc in expected})
    w.finish()
    with xr.open_dataset(path) as ds:
        got = {loc: ds[names[loc]].attrs["location"] for loc in expected}
        dims = {loc: ds[names[loc]].dims for loc in expected}
    assert got == expected
    assert dims[("centre", "face", "face")] == ("z", "y_f", "x_f")


def test_a_python_writer_records_title_parameters_and_conventions(tmp_path):
    """A writer made from Python records a title, parameters, Conventions and version."""
    from physjax.grids import CENTRE, Grid
    from physjax.io import Variable, read_attrs

    g = Grid((4, 6), (4e3, 6e3), dtype="float32")
    plain = tmp_path / "plain.nc"
    w = NetCDFWriter(plain, g, [Variable("h", CENTRE, "m", "H")])
    w.append(0.0, 0, {"h": np.zeros(g.shape)})
    w.finish()
    a = read_attrs(plain)
    assert a["title"] == "physjax output"
    assert a["parameters"] == {}
    assert a["Conventions"] == "CF-1.9 SGRID-0.3" and a["physjax_version"]
    assert a["status"] == "complete" and a["n_frames"] == 1
    named = tmp_path / "named.nc"
    attrs = {"title": "my run", "case": "lake", "parameters": {"g": 9.81}}
    NetCDFWriter(named, g, [Variable("h", CENTRE, "m", "H")], attrs=attrs).finish("stopped")
    b = read_attrs(named)
    assert b["title"] == "my run" and b["case"] == "lake"
    assert b["parameters"] == {"g": 9.81} and b["parameter_g"] == 9.81
    untitled = tmp_path / "untitled.nc"
    NetCDFWriter(untitled, g, [Variable("h", CENTRE, "m", "H")], attrs={"title": None}).finish()
    assert read_attrs(untitled)["title"] == "physjax output"  # not the text "None"


@pytest.mark.parametrize(
    "layout, shape", [("[4, 1]", {"y": 4, "x": 1}), ("[1, 4]", {"y": 1, "x": 4})]
)
def test_a_device_layout_given_as_a_list_in_the_config_is_y_by_x(
    tmp_path, monkeypatch, layout, shape
):
    """A config's `devices = [P, Q]` is P devices along y by Q along x, as `--devices PxQ`."""
    meshes = _meshes_advanced_on(monkeypatch)
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'case = "gravity-wave"\nn = 16\nt_end = 3600.0\ndevices = {layout}\n')
    out = tmp_path / "d.h5"
    assert main(["shallow-water", "--config", str(cfg), "--output", str(out), "--quiet"]) == 0
    with h5py.File(out, "r") as f:
        assert json.loads(f.attrs["configuration"])["devices"] == json.loads(layout)
    assert meshes and all(m == shape for m in meshes), meshes


def test_progress_bar_counts_steps_and_shows_steps_per_second(tmp_path, capsys):
    """docs/shallow_water.md: the bar shows steps, simulated time and steps/s."""
    from physjax._runner import _format_time

    out = tmp_path / "o.h5"
    argv = ["shallow-water", *[a for a in FAST if a != "--quiet"], "--output", str(out)]
    assert main(argv) == 0
    with h5py.File(out, "r") as f:
        n_steps = json.loads(f.attrs["configuration"])["n_steps"]
    draws = [s for s in re.split(r"[\r\n]", capsys.readouterr().err) if "shallow-water" in s]
    last = draws[-1]
    assert f" {n_steps}/{n_steps} " in last and f"t={_format_time(7200.0)}]" in last, draws
    assert re.search(r"step/s|s/step", last), last


def test_closing_line_of_a_stopped_run_gives_the_time_and_step_it_reached(tmp_path, capsys):
    """The closing line of a run stopped by --max-frames gives the time and step it reached."""
    out = tmp_path / "o.h5"
    assert main(["shallow-water", *FAST, "--output", str(out), "--max-frames", "1"]) == 0
    line = capsys.readouterr().out.strip()
    with h5py.File(out, "r") as f:
        step, t = int(f["step"][-1]), float(f["time"][-1])
        dt = json.loads(f.attrs["configuration"])["dt"]
    assert step == 10
    assert line.startswith(
        f"wrote 2 frames of gravity-wave (t = {t:.6g} s, 10 steps of dt = {dt:.6g} s) to {out}"
    ), line
    assert "(stopped at step 10/" in line


def test_param_overrides_one_config_parameter_and_keeps_the_others(tmp_path):
    """`--param` replaces one parameter of the config's [parameters] and keeps the others."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[parameters]\nmean_depth = 60.0\ncoriolis = 2e-4\n")
    out = tmp_path / "o.h5"
    argv = ["shallow-water", *FAST, "--config", str(cfg), "--output", str(out)]
    assert main([*argv, "--param", "mean-depth=50"]) == 0
    with h5py.File(out, "r") as f:
        params = json.loads(f.attrs["parameters"])
    assert params["mean_depth"] == 50.0 and params["coriolis"] == 2e-4, params
