"""``physjax poisson``: manufactured cases, user right-hand sides from files, bad input."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import xarray as xr

from physjax.cli import main
from physjax.grids import Grid
from physjax.solvers.poisson import PoissonSolver


def _poisson(tmp_path, *extra, name="p.h5"):
    out = tmp_path / name
    code = main(["poisson", "--quiet", "--output", str(out), *extra])
    return code, out


def _plotted_figure(tmp_path, drawn_figures, *extra):
    """Run ``physjax poisson … --plot`` with ``extra`` and return the figure it drew (kept
    open by the ``drawn_figures`` fixture) and that figure's renderer."""
    code, _ = _poisson(tmp_path, *extra, "--plot", str(tmp_path / "p.png"))
    assert code == 0
    assert len(drawn_figures) == 1
    return drawn_figures[-1], drawn_figures[-1].canvas.get_renderer()


def _fd_laplacian(u, spacing, bc):
    """Second-order 5/7-point Laplacian of cell-centred u with homogeneous conditions."""
    total = np.zeros_like(u)
    for axis, (h, kind) in enumerate(zip(spacing, bc)):
        if kind == "periodic":
            lo, hi = np.roll(u, 1, axis), np.roll(u, -1, axis)
        else:
            sign = -1.0 if kind == "dirichlet" else 1.0
            first = np.take(u, [0], axis)
            last = np.take(u, [u.shape[axis] - 1], axis)
            lo = np.concatenate([sign * first, np.delete(u, -1, axis)], axis)
            hi = np.concatenate([np.delete(u, 0, axis), sign * last], axis)
        total += (lo - 2 * u + hi) / h**2
    return total


@pytest.mark.parametrize(
    "case, method",
    [
        ("periodic-sines", "spectral"),
        ("dirichlet", "spectral"),
        ("neumann", "multigrid"),
        ("variable-coefficient", "cg"),
    ],
)
def test_manufactured_cases_converge_at_second_order(tmp_path, case, method):
    errors = []
    for n in (16, 32):
        code, out = _poisson(
            tmp_path, "--case", case, "--n", str(n), "--method", method, name=f"{n}.h5"
        )
        assert code == 0
        with xr.open_dataset(out) as ds:
            assert ds.attrs["status"] == "complete" and "n_frames" not in ds.attrs  # no frames
            assert ds.attrs["converged"] == 1
            cfg = json.loads(ds.attrs["configuration"])
            assert cfg["case"] == case and cfg["method"] == method and cfg["shape"] == [n, n]
            # solved by that method, not only recorded so: the transforms take no iteration,
            # multigrid and cg at least one (at 16² one: the coarsest level is the grid)
            iterations = np.asarray(ds.attrs["iterations"]).item()
            assert (iterations == 0) == (method == "spectral"), iterations
            for name in ("u", "f", "residual", "u_exact", "error"):
                assert ds[name].dims == ("y", "x")
                assert ds[name].attrs["units"] and ds[name].attrs["long_name"]
            f = np.asarray(ds["f"])
            assert float(np.abs(ds["residual"]).max()) <= 1e-9 * np.abs(f).max()
            err = np.asarray(ds["error"])
            assert ds.attrs["error_max"] == pytest.approx(np.abs(err).max())
            errors.append(np.abs(err).max())
    order = np.log2(errors[0] / errors[1])
    assert abs(order - 2) <= 0.15, errors


def test_shift_solves_the_helmholtz_problem(tmp_path, rhs_file):
    """--shift C: div(a grad u) - C u = f. The manufactured case keeps its exact u (f is
    shifted with it) and converges at order 2; a user f with a nonzero mean needs no
    compatibility condition: f = 1 on a periodic box gives u = -1/C exactly."""
    errors = []
    for n, method in ((16, "spectral"), (32, "cg")):
        args = ["--case", "neumann", "--n", str(n), "--shift", "50", "--method", method]
        code, out = _poisson(tmp_path, *args, name=f"s{n}.h5")
        assert code == 0
        with xr.open_dataset(out) as ds:
            assert json.loads(ds.attrs["configuration"])["shift"] == 50.0
            params = json.loads(ds.attrs["parameters"])
            assert params == dict(nx=n, ny=n, Lx=1.0, Ly=1.0, precision="float64", shift=50.0)
            assert ds.attrs["parameter_nx"] == n and ds.attrs["parameter_shift"] == 50.0
            assert ds["u"].attrs["long_name"] == "solution of div(a grad u) - 50 u = f"
            assert float(np.abs(ds["residual"]).max()) <= 1e-9 * float(np.abs(ds["f"]).max())
            errors.append(float(ds.attrs["error_max"]))
    assert abs(np.log2(errors[0] / errors[1]) - 2) <= 0.15, errors
    args = ["--rhs", f"{rhs_file}:forcing", "--bc", "periodic", "--compatibility", "check"]
    code, out = _poisson(tmp_path, *args, "--shift", "2", name="c.h5")
    assert code == 0
    with xr.open_dataset(out) as ds:
        np.testing.assert_allclose(ds["u"].values, -0.5, rtol=1e-12)
        assert ds.attrs["rhs_mean_removed"] == 0.0


def test_methods_agree_and_3d_runs_on_devices(tmp_path, monkeypatch):
    args = ["--case", "dirichlet", "--n", "16", "--nz", "16"]
    sols, solved, solve = {}, [], PoissonSolver.solve

    def spy(self, *a, **k):
        sol = solve(self, *a, **k)
        u = sol.u
        solved.append((self.method, u.sharding.shard_shape(u.shape), len(u.sharding.device_set)))
        return sol

    monkeypatch.setattr(PoissonSolver, "solve", spy)
    # 2x2x1 is z×y×x; 4 devices on a 3-D grid are make_mesh's 1x2x2 (columns whole)
    for method, devices, blocks, used in (
        ("spectral", "1", (16, 16, 16), 1),
        ("cg", "2x2x1", (8, 8, 16), 4),
        ("multigrid", "4", (16, 8, 8), 4),
    ):
        code, out = _poisson(
            tmp_path, *args, "--method", method, "--devices", devices, name=f"{method}.h5"
        )
        assert code == 0
        # solved by the method asked for (not only recorded so), split as asked
        assert solved.pop() == (method, blocks, used), method
        with xr.open_dataset(out) as ds:
            assert ds["u"].dims == ("z", "y", "x")
            assert json.loads(ds.attrs["configuration"])["method"] == method
            sols[method] = np.asarray(ds["u"])
    scale = np.abs(sols["spectral"]).max()
    for method in ("cg", "multigrid"):
        assert np.abs(sols[method] - sols["spectral"]).max() <= 1e-8 * scale


def test_devices_equal_one_device(tmp_path, monkeypatch):
    args = ["--case", "periodic-sines", "--nx", "32", "--ny", "16"]
    _, one = _poisson(tmp_path, *args, name="one.h5")
    solved, solve = [], PoissonSolver.solve

    def spy(self, *a, **k):
        sol = solve(self, *a, **k)
        solved.append(sol.u.sharding)
        return sol

    monkeypatch.setattr(PoissonSolver, "solve", spy)
    _, four = _poisson(tmp_path, *args, "--devices", "2x2", name="four.h5")
    assert [s.shard_shape((16, 32)) for s in solved] == [(8, 16)]  # split as asked
    with xr.open_dataset(one) as a, xr.open_dataset(four) as b:
        assert json.loads(b.attrs["configuration"])["devices"] == [2, 2]
        assert float(np.abs(a["u"] - b["u"]).max()) <= 1e-12


def _write_rhs(path, f, dx, dy, x0=0.0, y0=0.0, units="s-1", time=False):
    ny, nx = f.shape[-2:]
    coords = {"y": y0 + dy * (np.arange(ny) + 0.5), "x": x0 + dx * (np.arange(nx) + 0.5)}
    dims = ("y", "x")
    if time:
        coords["time"] = np.arange(f.shape[0]) * 10.0
        dims = ("time", *dims)
    ds = xr.Dataset({"forcing": (dims, f, {"units": units})}, coords=coords)
    ds.to_netcdf(path, engine="h5netcdf")


def test_read_static_gives_a_solves_fields_and_read_frame_points_to_it(tmp_path):
    """physjax.io had no reader for fields without a time axis: a Poisson file's u, f and
    residual could be read only with xarray or h5py, and read_frame called the file "not a
    physjax output file with frames". read_static gives them, as stored; the Dirichlet
    solve they hold satisfies the second-order system to round-off."""
    from physjax.io import read_frame, read_static

    code, out = _poisson(tmp_path, "--case", "dirichlet", "--n", "32", "--precision", "float64")
    assert code == 0
    fields = read_static(out)
    assert sorted(fields) == ["error", "f", "residual", "u", "u_exact"]
    with h5py.File(out, "r") as f:
        for name, value in fields.items():
            np.testing.assert_array_equal(value, f[name][...])
        spacing = tuple(float(f[c][1] - f[c][0]) for c in ("y", "x"))
    lap = _fd_laplacian(fields["u"], spacing, ("dirichlet",) * 2)
    scale = float(np.abs(fields["f"]).max())
    assert float(np.abs(lap - fields["f"]).max()) <= 1e-10 * scale
    with pytest.raises(ValueError, match=r"has no time axis, so no frames: .*read_static"):
        read_frame(out)
    # a shallow-water run's one time-independent field, and a file of frames alone
    sw = tmp_path / "sw.h5"
    run = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", "600", "--quiet"]
    assert main([*run, "--output", str(sw)]) == 0
    assert list(read_static(sw)) == ["bottom"]
    from physjax.io import NetCDFWriter, Variable

    g = Grid((2, 3), (2.0, 3.0), dtype="float64")
    w = NetCDFWriter(tmp_path / "f.h5", g, [Variable("h", ("centre", "centre"), "m", "h")])
    w.append(0.0, 0, {"h": np.ones(g.shape)})
    with pytest.raises(ValueError, match=r"f.h5' holds no time-independent field on a grid"):
        read_static(w.path)


def test_user_rhs_takes_the_files_grid(tmp_path):
    rng = np.random.default_rng(1)
    f = rng.normal(size=(24, 40))
    dx, dy = 2.5e3, 4e3
    src = tmp_path / "rhs.nc"
    _write_rhs(src, f, dx, dy, x0=-50e3, y0=1e5)
    code, out = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "dirichlet,periodic")
    assert code == 0
    with xr.open_dataset(out) as ds, xr.open_dataset(src) as inp:
        np.testing.assert_allclose(ds["x"], inp["x"], rtol=0, atol=1e-9)
        np.testing.assert_allclose(ds["y"], inp["y"], rtol=0, atol=1e-9)
        assert ds["f"].attrs["units"] == "s-1" and ds["u"].attrs["units"] == "s-1 m2"
        assert ds.attrs["case"] == "user"
        u = np.asarray(ds["u"])
    # the discrete equations hold with the file's spacing (a unit box would be off by 1e7)
    lap = _fd_laplacian(u, (dy, dx), ("dirichlet", "periodic"))
    assert np.abs(lap - f).max() <= 1e-10 * np.abs(f).max()
    # and the library gives the same solution
    grid = Grid(f.shape, (24 * dy, 40 * dx), periodic=(False, True), dtype="float64")
    ref = np.asarray(PoissonSolver(grid, ("dirichlet", "periodic"))(f))
    assert np.abs(ref - u).max() <= 1e-12 * np.abs(ref).max()
    # the same field stored (x, y): read by its dimension names, not their order (it was
    # solved with the axes, spacings and --bc swapped)
    with xr.open_dataset(src) as inp:
        inp.load().transpose("x", "y").to_netcdf(tmp_path / "xy.nc", engine="h5netcdf")
    spec = f"{tmp_path / 'xy.nc'}:forcing"
    code, out2 = _poisson(tmp_path, "--rhs", spec, "--bc", "dirichlet,periodic", name="xy.h5")
    assert code == 0
    with xr.open_dataset(out2) as ds:
        assert ds["u"].dims == ("y", "x") and np.array_equal(ds["u"].values, u)
        np.testing.assert_allclose(ds["x"], dx * (np.arange(40) + 0.5) - 50e3, atol=1e-9)


def test_streamfunction_of_a_shallow_water_run(tmp_path, capsys):
    """ζ of the last frame of a physjax shallow-water file → ψ with ∇²ψ = ζ − ⟨ζ⟩."""
    sw = tmp_path / "sw.h5"
    assert (
        main(
            [
                "shallow-water",
                "--case",
                "barotropic-instability",
                "--n",
                "32",
                "--t-end",
                "20000",
                "--precision",
                "float64",
                "--quiet",
                "--output",
                str(sw),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code, out = _poisson(tmp_path, "--rhs", f"{sw}:zeta", "--bc", "periodic")
    assert code == 0
    err = capsys.readouterr().err
    assert "lies on" not in err  # periodic axes: no wall to misplace
    # but the channel's y axis is walled in the run, which the file records
    assert "note: the y axis of" in err and "is wall in the file that wrote it" in err
    assert "the x axis" not in err
    with xr.open_dataset(sw) as run, xr.open_dataset(out) as ds:
        zeta = np.asarray(run["zeta"].isel(time=-1))
        dx = float(run["x_f"][1] - run["x_f"][0])
        dy = float(run["y_f"][1] - run["y_f"][0])
        psi = np.asarray(ds["u"])
        cfg = json.loads(ds.attrs["configuration"])
        assert cfg["frame"] == run.sizes["time"] - 1
        assert cfg["rhs_time"] == float(run["time"][-1])
        np.testing.assert_allclose(ds["x"], run["x_f"], atol=1e-6)
        assert ds.attrs["rhs_mean_removed"] == pytest.approx(zeta.mean(), rel=1e-6, abs=1e-20)
    lap = _fd_laplacian(psi, (dy, dx), ("periodic", "periodic"))
    assert np.abs(lap - (zeta - zeta.mean())).max() <= 1e-9 * np.abs(zeta).max()
    # --frame picks another frame
    code, out0 = _poisson(
        tmp_path, "--rhs", f"{sw}:zeta", "--bc", "periodic", "--frame", "0", name="f0.h5"
    )
    assert code == 0
    with xr.open_dataset(out0) as ds:
        assert json.loads(ds.attrs["configuration"])["frame"] == 0
    # Walls in y: the corners' first row lies on the run's south wall, but the solve puts
    # its boundary half a cell below it: said on stderr, for y only (x is periodic)
    code, _ = _poisson(tmp_path, "--rhs", f"{sw}:zeta", "--bc", "dirichlet,periodic", name="d.h5")
    assert code == 0
    err = capsys.readouterr().err
    assert f"{sw}:zeta lies on y faces (y_f)" in err
    assert f"dy/2 = {dy / 2:g} m" in err
    assert "not on the walls of the run that wrote it" in err
    assert "x faces" not in err
    # walls in x, where the run is periodic: no "walls of the run that wrote it" (it had
    # none there), and the other note names the run's periodic x axis
    code, _ = _poisson(tmp_path, "--rhs", f"{sw}:zeta", "--bc", "periodic,neumann", name="n.h5")
    assert code == 0
    err = capsys.readouterr().err
    assert f"{sw}:zeta lies on x faces (x_f)" in err and "y faces" not in err
    assert "walls of the run" not in err
    assert "the x axis of" in err and "is periodic in the file that wrote it" in err


def test_coefficient_from_file(tmp_path, capsys):
    ny, nx = 32, 32
    x = (np.arange(nx) + 0.5) / nx
    a = np.broadcast_to(1 + 0.5 * np.sin(2 * np.pi * x), (ny, nx)).copy()
    rng = np.random.default_rng(2)
    f = rng.normal(size=(ny, nx))
    src = tmp_path / "in.h5"
    with h5py.File(src, "w") as h:
        h["f"] = f
        h["a"] = a
    code, out = _poisson(
        tmp_path, "--rhs", f"{src}:f", "--coefficient", f"{src}:a", "--bc", "dirichlet"
    )
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["method"] == "cg"
        np.testing.assert_array_equal(ds["a"], a)
        u = np.asarray(ds["u"])
    grid = Grid((ny, nx), (1.0, 1.0), periodic=False, dtype="float64")
    ref = np.asarray(PoissonSolver(grid, "dirichlet", "cg", coefficient=a)(f))
    assert np.abs(ref - u).max() <= 1e-8 * np.abs(ref).max()
    # a manufactured f with another coefficient has no known solution: none is written
    code, out = _poisson(
        tmp_path, "--case", "dirichlet", "--n", "32", "--coefficient", f"{src}:a", name="m.h5"
    )
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert "u_exact" not in ds and "error" not in ds and "a" in ds
    # --frame picks the frame of a time-dependent f; a static coefficient goes with it
    timed = tmp_path / "timed.nc"
    _write_rhs(timed, np.stack([f, 2 * f]), 1 / nx, 1 / ny, units="1", time=True)
    code, out = _poisson(
        tmp_path,
        *("--rhs", f"{timed}:forcing", "--frame", "1", "--coefficient", f"{src}:a"),
        *("--bc", "dirichlet"),
        name="t.h5",
    )
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert np.abs(np.asarray(ds["u"]) - 2 * ref).max() <= 1e-8 * np.abs(ref).max()
    # and that of a time-dependent coefficient beside a static f (refused: "--frame given,
    # but …:f has no time dimension"), recorded also without --rhs (it was -1)
    _write_rhs(timed, np.stack([a, 2 * a]), 1 / nx, 1 / ny, units="1", time=True)
    given_f = ("--rhs", f"{src}:f", "--bc", "dirichlet")
    for rhs, name in ((given_f, "c.h5"), (("--case", "dirichlet", "--n", "32"), "cm.h5")):
        argv = ("--coefficient", f"{timed}:forcing", "--frame", "1", *rhs)
        code, out = _poisson(tmp_path, *argv, name=name)
        assert code == 0, capsys.readouterr().err
        with xr.open_dataset(out) as ds:
            np.testing.assert_array_equal(ds["a"], 2 * a)
            assert json.loads(ds.attrs["configuration"])["frame"] == 1
            if rhs == given_f:  # ∇·(2a∇u) = f: u/2
                assert np.abs(np.asarray(ds["u"]) - ref / 2).max() <= 1e-8 * np.abs(ref).max()
    # both time-dependent, with different numbers of frames: each file's last frame is taken,
    # and the configuration records the coefficient's (only the right-hand side's was kept)
    timed_f = tmp_path / "timed_f.nc"
    _write_rhs(timed_f, np.stack([f, 2 * f]), 1 / nx, 1 / ny, units="1", time=True)
    _write_rhs(timed, np.stack([a, 2 * a, 3 * a]), 1 / nx, 1 / ny, units="1", time=True)
    argv = ("--rhs", f"{timed_f}:forcing", "--coefficient", f"{timed}:forcing")
    code, out = _poisson(tmp_path, *argv, "--bc", "dirichlet", name="both.h5")
    assert code == 0, capsys.readouterr().err
    with xr.open_dataset(out) as ds:  # ∇·(3a∇u) = 2f: 2u/3
        assert np.abs(np.asarray(ds["u"]) - 2 * ref / 3).max() <= 1e-8 * np.abs(ref).max()
        cfg = json.loads(ds.attrs["configuration"])
    assert (cfg["frame"], cfg["rhs_time"]) == (1, 10.0)
    assert (cfg["coefficient_frame"], cfg["coefficient_time"]) == (2, 20.0)
    with xr.open_dataset(tmp_path / "c.h5") as ds:  # a static f: the coefficient's frame 1
        cfg = json.loads(ds.attrs["configuration"])
    assert (cfg["coefficient_frame"], cfg["coefficient_time"], cfg["rhs_time"]) == (1, 10.0, None)
    code, _ = _poisson(tmp_path, "--coefficient", f"{src}:a", "--frame", "0", *given_f)
    err = capsys.readouterr().err
    assert code == 2 and f"--frame given, but neither --rhs {src}:f nor --coefficient" in err
    # a coefficient that is not > 0: the error names the option and the file's variable
    with h5py.File(src, "a") as h:
        h["neg"] = a - 1.2
    argv = ("--rhs", f"{src}:f", "--coefficient", f"{src}:neg", "--bc", "dirichlet")
    code, out = _poisson(tmp_path, *argv, name="neg.h5")
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert f"--coefficient {src}:neg: coefficient must be" in err and "got min -0.698" in err, err


def test_config_file_and_precedence(tmp_path):
    cfg = tmp_path / "p.toml"
    cfg.write_text("case = 'neumann'\nn = 16\nmethod = 'multigrid'\nrtol = 1e-6\n")
    code, out = _poisson(tmp_path, "--config", str(cfg), "--nx", "32")
    assert code == 0
    with xr.open_dataset(out) as ds:
        cfg_out = json.loads(ds.attrs["configuration"])
        assert cfg_out["shape"] == [16, 32] and cfg_out["method"] == "multigrid"
        assert cfg_out["rtol"] == 1e-6 and cfg_out["bc"] == ["neumann", "neumann"]
        assert 1e-10 < ds.attrs["residual_norm"] <= 1e-6  # stopped at the looser tolerance


def test_iteration_options_of_a_config_are_refused_with_spectral(tmp_path, capsys):
    """max_iterations in a --config file was ignored by the spectral method without a word,
    as --rtol and --max-iterations were on the command line; with multigrid it applies."""
    cfg = tmp_path / "p.toml"
    cfg.write_text("n = 16\nmethod = 'spectral'\nmax_iterations = 5\n")
    code, out = _poisson(tmp_path, "--config", str(cfg))
    assert code == 2 and not out.exists()
    assert "--max-iterations given, but --method spectral" in capsys.readouterr().err
    code, out = _poisson(tmp_path, "--config", str(cfg), "--method", "multigrid")
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["max_iterations"] == 5


@pytest.mark.parametrize("k, iterations", [(1, "1 iteration"), (2, "2 iterations")])
def test_not_converged_is_reported_and_the_file_kept(tmp_path, capsys, k, iterations):
    code, out = _poisson(
        tmp_path,
        "--case",
        "dirichlet",
        "--n",
        "64",
        "--method",
        "multigrid",
        "--max-iterations",
        str(k),
    )
    assert code == 1
    err = capsys.readouterr().err
    assert f"did not converge in {iterations} (relative" in err
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"].startswith(f"failed: not converged after {iterations} (")
        assert ds.attrs["converged"] == 0 and ds.attrs["residual_norm"] > 1e-10


def test_not_converged_names_the_rtol_given(tmp_path, capsys):
    """The rtol in the message and the file's status was rounded to one digit: with --rtol
    0.0174 a CG step that left 1.76e-2 read "relative residual 1.76e-02 > rtol 2e-02", and
    0.015 was shown as 1e-02."""
    run = ["--case", "dirichlet", "--n", "64", "--method", "cg", "--max-iterations", "1"]
    code, out = _poisson(tmp_path, *run, "--rtol", "0.0174")
    assert code == 1
    err = capsys.readouterr().err
    assert re.search(r"relative residual 1\.76e-02 > rtol 0\.0174\)", err), err
    with xr.open_dataset(out) as ds:
        assert ds.attrs["status"].endswith("> rtol 0.0174)"), ds.attrs["status"]


def test_plot_and_script_wrapper(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "solve_poisson.py")
    out, png = tmp_path / "s.h5", tmp_path / "s.png"
    env = dict(os.environ, XLA_FLAGS="")
    res = subprocess.run(
        [
            sys.executable,
            script,
            "--case",
            "dirichlet",
            "--n",
            "16",
            "--nz",
            "8",
            "--output",
            str(out),
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert f"wrote {out} and {png}" in res.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with h5py.File(out, "r") as h:
        assert h.attrs["status"] == "complete"
        assert h["u"].shape == (8, 16, 16)
    # physjax plot redraws it; a --frame is refused, the file has no time axis
    again = tmp_path / "again.png"
    assert main(["plot", str(out), "--output", str(again)]) == 0 and again.stat().st_size > 10_000
    assert main(["plot", str(out), "--frame", "3", "--output", str(tmp_path / "f.png")]) == 2
    assert not (tmp_path / "f.png").exists()


def test_physjax_plot_draws_the_panels_of_the_solve(tmp_path, monkeypatch):
    """`physjax plot` of a Poisson file draws what `--plot` draws: u, the residual and the
    error where the exact solution is known, else f (it used to draw u, f, residual); a
    case run with other boundary conditions is named so in the file and the title."""
    import matplotlib.axes
    import matplotlib.figure

    titles = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, **kw: titles.append(t))
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", lambda fig, t, **kw: titles.append(t))
    out = tmp_path / "p.h5"
    for bc, last in ((None, "error"), ("neumann", "f")):
        extra = ["--bc", bc] if bc else []
        assert (
            main(
                [
                    "poisson",
                    "--case",
                    "dirichlet",
                    "--n",
                    "16",
                    "--output",
                    str(out),
                    "--overwrite",
                    *extra,
                    "--plot",
                    str(tmp_path / "a.png"),
                ]
            )
            == 0
        )
        drawn, titles[:] = list(titles), []
        assert main(["plot", str(out), "--output", str(tmp_path / "b.png")]) == 0
        assert titles == drawn
        assert [t.split(":")[0] for t in titles[:3]] == ["u", "residual", last]
        case = "dirichlet" if bc is None else "dirichlet right-hand side, bc neumann,neumann"
        assert titles[3] == f"physjax poisson, {case}"
        with h5py.File(out, "r") as h:
            assert h.attrs["case"] == case
        titles.clear()


def test_plot_of_a_long_channel_is_not_a_sliver(tmp_path, drawn_figures):
    """A 100 m by 1 m channel was drawn to scale, each panel a line a few pixels high with
    its y ticks on top of each other; a domain more than 4 times longer than wide now fills
    its panel (the ticks give the extents), a moderate one keeps its true proportions."""

    for n, lx, proportions in (("64", "100", False), ("16", "3", True)):
        code, out = _poisson(
            tmp_path, "--case", "dirichlet", "--nx", n, "--ny", "4", "--lx", lx, "--overwrite"
        )
        assert code == 0
        assert main(["plot", str(out), "--output", str(tmp_path / "p.png")]) == 0
        panels = [ax for ax in drawn_figures[-1].axes if ax.get_label() != "<colorbar>"]
        assert len(panels) == 3
        for ax in panels:
            box = ax.get_window_extent()
            if proportions:
                assert box.height / box.width == pytest.approx(1 / 3, rel=0.02)
            else:
                assert box.height > 0.5 * box.width


def test_plot_title_does_not_overlap_the_panel_titles(tmp_path, drawn_figures):
    """The figure's title ("physjax poisson, …") was drawn over the two-line panel titles of
    a 3-D solve ("… at z = 1.12 m"): tight_layout left it no room; a failed run's two-line
    title came as close."""
    fig, renderer = _plotted_figure(tmp_path, drawn_figures, "--n", "16", "--nz", "8", "--lz", "2")
    top = fig._suptitle.get_window_extent(renderer)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3
    for ax in panels:
        assert ax.title.get_text().endswith("at z = 1.12 m")
        assert ax.title.get_window_extent(renderer).y1 < top.y0


@pytest.mark.parametrize("nx, ny, lx", [("32", "16", "2"), ("48", "16", "3"), ("8", "24", "0.333")])
def test_plot_colour_bars_are_as_tall_as_their_panels(tmp_path, drawn_figures, nx, ny, lx):
    """A domain wider than about 2:1 keeps its true proportions in a short panel, but its
    colour bar was sized by the panel's slot: a bar up to twice the height of the field it
    keys, with blank space above and below the panel. Each bar now spans its panel exactly,
    beside it, and the figure is no taller than the panels need."""
    fig, renderer = _plotted_figure(tmp_path, drawn_figures, "--nx", nx, "--ny", ny, "--lx", lx)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == 3
    for ax in panels:
        box = ax.get_window_extent(renderer)
        bar = ax.collections[0].colorbar.ax.get_window_extent(renderer)
        assert ax.get_aspect() == 1  # true proportions kept
        assert bar.y0 == pytest.approx(box.y0, abs=1) and bar.y1 == pytest.approx(box.y1, abs=1)
        assert 0 < bar.x0 - box.x1 < 0.3 * fig.dpi  # beside its panel, not across a gap
    # no blank bands above and below short panels: the figure holds its title and the
    # panels with their titles, labels and bars, and little else
    used = fig._suptitle.get_window_extent(renderer).height
    used += max(ax.get_tightbbox(renderer).height for ax in panels)
    assert fig.bbox.height - used < 0.4 * fig.dpi


def test_plot_of_a_tall_domain_leaves_no_blank_columns_between_its_panels(tmp_path, drawn_figures):
    """A domain 3 times taller than wide keeps its true proportions in a narrow panel, each
    left alone in a third of a 15.6-inch figure, blank columns of 3 inches between them;
    the figure is now as wide as the panels with their titles, labels and bars need."""
    fig, renderer = _plotted_figure(
        tmp_path, drawn_figures, "--nx", "8", "--ny", "24", "--lx", "0.333"
    )
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    boxes = [ax.get_tightbbox(renderer) for ax in panels]
    assert all(ax.get_aspect() == 1 for ax in panels)
    assert fig.bbox.width - sum(b.width for b in boxes) < 1.2 * fig.dpi
    for left, right in zip(boxes, boxes[1:]):  # the titles (the widest) do not touch
        assert left.x1 < right.x0


def test_plot_of_a_dimensionless_field_gives_its_power_of_ten_alone(tmp_path, drawn_figures):
    """The error of a solve (CF units "1", about 1e-3) was keyed "error [10⁻³ 1]", the 1
    read as a factor; a dimensionless field's bar now says "[10⁻³]" (and "[1]" without a
    power of ten), other units keep theirs, and a variable without units has no "[]"."""

    code, out = _poisson(tmp_path, "--n", "32", "--plot", str(tmp_path / "p.png"))
    assert code == 0
    bars = [ax.collections[0].colorbar.ax.get_ylabel() for ax in drawn_figures[-1].axes]
    assert bars[0] == "u [1]" and re.fullmatch(r"error \[\$10\^\{-\d\}\$\]", bars[2])
    assert bars[1].startswith("residual [$10^{-1") and bars[1].endswith("$ m$^{-2}$]")
    with h5py.File(out, "a") as h:
        del h["u"].attrs["units"]
    assert main(["plot", str(out), "--output", str(tmp_path / "q.png")]) == 0
    assert drawn_figures[-1].axes[0].collections[0].colorbar.ax.get_ylabel() == "u"


def test_plot_raises_the_powers_of_a_files_units():
    """The poisson panels' colour bars showed a file's UDUNITS text as stored ("m-2",
    "s-1 m") where the shallow-water panels draw s⁻¹; the powers are now raised, and a "$"
    in a file's units is drawn as itself instead of opening mathematics."""
    from physjax._plot import _units_text

    assert _units_text("kg m-2 s-1") == "kg m$^{-2}$ s$^{-1}$"
    assert _units_text("m2 s-2") == "m$^{2}$ s$^{-2}$"
    for same in ("1", "m", "K", "degrees_north", "1e-3 kg", "W m^2"):
        assert _units_text(same) == same
    assert _units_text("US$ m-1") == r"US\$ m$^{-1}$"


def test_plot_of_a_deep_3d_box_gives_its_level_without_an_exponent(tmp_path, monkeypatch):
    """An ocean-sized 3-D solve (4 km deep) titled its panels "at z = 2.5e+03 m"; the level is
    now in whole metres below 10 km, in km above."""
    import matplotlib.axes

    titles = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, **kw: titles.append(t))
    png = str(tmp_path / "p.png")
    code, _ = _poisson(tmp_path, "--n", "8", "--nz", "4", "--lz", "4000", "--plot", png)
    assert code == 0
    assert [t.split("\n")[1] for t in titles] == ["at z = 2500 m"] * 3
    from physjax._plot import _length_text

    assert [_length_text(z) for z in (0.5625, 56.25, 12500.0)] == ["0.562 m", "56.2 m", "12.5 km"]


def test_plot_waits_out_a_writer_holding_the_lock(tmp_path, monkeypatch, capsys):
    """A running file is locked for a moment at every frame: `physjax plot` tries again
    (it used to stop with "cannot read … unable to lock file")."""
    import xarray as xr

    out = tmp_path / "p.h5"
    assert main(["poisson", "--n", "16", "--output", str(out)]) == 0
    real, calls = xr.open_dataset, []

    def locked_twice(*args, **kw):
        calls.append(1)
        if len(calls) <= 2:
            raise OSError("[Errno 11] Unable to synchronously open file (unable to lock file)")
        return real(*args, **kw)

    monkeypatch.setattr(xr, "open_dataset", locked_twice)
    assert main(["plot", str(out), "--output", str(tmp_path / "p.png")]) == 0
    assert len(calls) == 3
    calls.clear()
    (tmp_path / "bad.h5").write_bytes(b"not hdf5")
    monkeypatch.setattr(xr, "open_dataset", real)
    assert main(["plot", str(tmp_path / "bad.h5")]) == 2  # no lock: refused at once
    assert "cannot read" in capsys.readouterr().err


def test_plot_waits_out_a_real_writer_lock(tmp_path, monkeypatch, capsys):
    """`physjax plot` of a running file that met a frame being appended stopped with a
    traceback (BlockingIOError from the check that physjax wrote the file, before the
    retried read); it now tries again, and a lock that stays names the file (exit 2)."""
    from physjax.io import _reading

    out = tmp_path / "p.h5"
    assert main(["poisson", "--n", "16", "--output", str(out), "--quiet"]) == 0
    hold = "import h5py, sys, time; f = h5py.File(sys.argv[1], 'a'); print(1, flush=True); "
    for seconds, wait, code in (("0.5", 5.0, 0), ("5", 0.2, 2)):
        monkeypatch.setattr(_reading, "READ_WAIT", wait)
        writer = subprocess.Popen(
            [sys.executable, "-c", hold + f"time.sleep({seconds})", str(out)],
            stdout=subprocess.PIPE,
        )
        try:
            assert writer.stdout.readline().strip() == b"1"  # the lock is held
            assert main(["plot", str(out), "--output", str(tmp_path / "p.png")]) == code
        finally:
            writer.kill()
            writer.wait()
    err = capsys.readouterr().err
    assert f"{str(out)!r} is locked by another process and stayed so for 0.2 s" in err, err


@pytest.fixture
def rhs_file(tmp_path):
    path = tmp_path / "in.h5"
    _write_rhs(path, np.ones((3, 8, 8)), 1.0, 1.0, time=True)
    with h5py.File(path, "a") as h:
        h["line"] = np.zeros(8)
        h["empty"] = np.zeros((0, 8, 8))
        h["bad"] = np.full((8, 8), np.nan)
        h["cplx"] = np.ones((8, 8), complex)
        h["odd"] = np.zeros((97, 97))
        h["huge"] = np.full((8, 8), 1e39) * np.cos(np.arange(8))  # finite in float64 only
    xr.Dataset({"yz": (("y", "z"), np.ones((8, 8)))}).to_netcdf(path, "a", engine="h5netcdf")
    return path


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--bc", "wall"], "unknown boundary condition(s) ['wall']"),
        (["--bc", "dirichlet,dirichlet,dirichlet"], "--bc needs one condition or 2"),
        (["--n", "0"], "--n must be a positive integer"),
        (["--n", "100000"], "--nx 100000 --ny 100000: a float64 solve of 100000×100000 cells"),
        (["--n", "4096", "--nz", "4096"], "--nz 4096: a float64 solve of 4096×4096×4096 cells"),
        (
            ["--method", "multigrid", "--n", "97"],
            "--method multigrid with --ny 97 --nx 97: multigrid",
        ),
        (  # max_coarse is not an option of the command: its message names the number only
            ["--method", "multigrid", "--n", "97"],
            "cannot be halved), more than 1024 cells; use sizes c·2^k",
        ),
        (  # a grid from --rhs: named "--ny 97 --nx 97", options not given and not givable
            ["--method", "multigrid", "--rhs", "{rhs}:odd", "--bc", "periodic"],
            ":odd (97×97): multigrid cannot coarsen grid.shape=(97, 97)",
        ),
        (["--method", "spectral", "--case", "variable-coefficient"], "needs a constant coef"),
        (["--rtol", "2"], "--rtol must be a number in (0, 1)"),
        (["--shift", "0"], "--shift must be a finite number > 0, got 0.0"),
        (["--shift", "nan"], "--shift must be a finite number > 0, got nan"),
        (["--max-iterations", "0"], "--max-iterations must be a positive integer"),
        (  # options of the iterative methods were ignored by spectral without a word
            ["--method", "spectral", "--rtol", "1e-3"],
            "--rtol given, but --method spectral, a direct solve with no iterations to stop; "
            "they apply to --method multigrid or cg",
        ),
        (
            ["--max-iterations", "5", "--rtol", "1e-3"],
            "--rtol and --max-iterations given, but the method is spectral (the default)",
        ),
        (  # an OverflowError traceback from the compiled float32 solve (exit status 1)
            ["--max-iterations", "3000000000", "--precision", "float32", "--method", "cg"],
            "--max-iterations must be at most 2147483647 (2**31 - 1), got 3000000000",
        ),
        (["--devices", "3"], "--devices 3: the mesh does not divide the grid: ny=64"),
        (  # the slabs of the spectral method: the layout 2x2 divides 6×6, 4 slabs do not
            ["--n", "6", "--devices", "4"],
            "--devices 4: the spectral method on 4 devices needs ny divisible by 4",
        ),
        (["--nz", "8", "--devices", "2x2"], "--devices 2x2: a device layout needs 3 positive"),
        (["--plot", "p.jpg"], "--plot must name a .png"),
        (["--rhs", "nofile.h5:f", "--bc", "periodic"], "file 'nofile.h5' does not exist"),
        (["--rhs", "{rhs}:nope", "--bc", "periodic"], "has no variable 'nope'"),
        (["--rhs", "{rhs}:line", "--bc", "periodic"], "need a 2-D (y, x) or 3-D"),
        (  # told as its frame's: "time has dimensions () of shape ()"
            ["--rhs", "{rhs}:time", "--bc", "periodic"],
            "time has dimensions ('time',) of shape (3,); need a 2-D (y, x) or 3-D (z, y, x) "
            "field (after its leading time dimension 'time')",
        ),
        (["--rhs", "{rhs}:empty", "--bc", "periodic"], "empty holds no values (shape (0, 8, 8))"),
        (["--rhs", "{rhs}:bad", "--bc", "periodic"], "64 non-finite value(s)"),
        (["--rhs", "{rhs}:cplx", "--bc", "periodic"], "cplx is complex (dtype complex128)"),
        (  # made inf by the cast to float32 and solved: NaN, a file marked failed, status 1
            ["--rhs", "{rhs}:huge", "--bc", "dirichlet", "--precision", "float32"],
            "huge holds values up to 1e+39 in magnitude, beyond the range of --precision float32",
        ),
        (
            ["--coefficient", "{rhs}:huge", "--n", "8", "--precision", "float32"],
            "--coefficient: {rhs}:huge holds values up to 1e+39 in magnitude, beyond the range",
        ),
        (["--output", "p.PNG"], "--output 'p.PNG' names the NetCDF4/HDF5 data file"),
        (["--rhs", "{rhs}:forcing", "--bc", "periodic", "--frame", "3"], "out of range"),
        (["--rhs", "{rhs}:forcing", "--bc", "periodic", "--nx", "16"], "--nx=16 does not match"),
        (["--rhs", "{rhs}:forcing", "--bc", "periodic", "--n", "16"], "--n=16 does not match"),
        (["--rhs", "{rhs}:forcing"], "--rhs needs --bc"),
        (["--lz", "5"], "--lz given, but the problem is 2-D"),
        (  # OverflowError tracebacks (exit status 1) from the case's f and the stencil's 1/h²
            ["--lx", "1e-160"],
            "--lx 1e-160 over 64 cells gives a spacing of 1.56e-162 m, whose square or its "
            "inverse is beyond the range of float64",
        ),
        (["--ly", "1e308", "--case", "dirichlet"], "--ly 1e+308 over 64 cells gives a spacing"),
        (["--rhs", "{rhs}:forcing", "--bc", "periodic", "--lz", "5"], "--lz given"),
        (["--rhs", "{rhs}:yz", "--bc", "periodic"], "needs dimensions along y, x"),
        (["--rhs", "{rhs}"], "--rhs must be FILE:VARIABLE"),
        (
            ["--rhs", "{rhs}:forcing", "--bc", "periodic", "--compatibility", "check"],
            "needs ∫f = 0",
        ),
        (
            ["--case", "neumann", "--compatibility", "check", "--rhs", "{rhs}:forcing"],
            "needs ∫f = 0",
        ),
    ],
)
def test_bad_input_clear_error_and_no_file(tmp_path, capsys, rhs_file, extra, match):
    extra = [e.replace("{rhs}", str(rhs_file)) for e in extra]
    before = sorted(tmp_path.iterdir())
    code, out = _poisson(tmp_path, *extra)
    err = capsys.readouterr().err
    assert code == 2, err
    assert match.replace("{rhs}", str(rhs_file)) in err
    assert not out.exists()
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "extra, devices, match",
    [
        # simulated on a CPU before the mesh was checked: 5000 took seconds and 700 MB
        (["--n", "16"], "5000", "--devices 5000: 5000 devices for a grid of 16×16 = 256 cells"),
        (["--n", "16"], "3", "--devices 3: the mesh does not divide the grid: ny=16 cannot"),
        (["--n", "16", "--nz", "8"], "3", "--devices 3: the mesh does not divide the grid: ny=16"),
        (["--rhs", "{rhs}:forcing"], "5000", "5000 devices for a grid of 8×8 = 64 cells"),
        (["--rhs", "{rhs}:forcing"], "1x3", "--devices 1x3: the mesh does not divide the grid"),
        (  # 74 s and 1.3 GB to be told so once the devices were simulated
            ["--n", "16", "--nz", "8"],
            "100x100",
            "--devices 100x100: a device layout needs 3 positive entries, one per grid axis",
        ),
    ],
)
def test_devices_that_cannot_split_the_grid_are_refused_before_jax_starts(
    tmp_path, capsys, monkeypatch, rhs_file, extra, devices, match
):
    from physjax import cli

    started = []
    monkeypatch.setattr(cli, "setup_jax", lambda *a: started.append(a))
    extra = [e.replace("{rhs}", str(rhs_file)) for e in extra]
    code, out = _poisson(tmp_path, *extra, "--bc", "periodic", "--devices", devices)
    err = capsys.readouterr().err
    assert code == 2 and match in err and err.count("\n") == 1, err
    assert started == []  # the devices were never simulated
    assert not out.exists()


def test_a_grid_from_rhs_too_large_for_memory_is_refused(tmp_path, capsys, monkeypatch):
    """The memory check of --n/--nx/--nz was skipped for a --rhs grid: a file's 20000×20000
    field went on to a solve needing about 72 GiB. (A machine 10^9 times smaller here.)"""
    from physjax import cli

    src = tmp_path / "in.h5"
    _write_rhs(src, np.ones((4, 16, 8)), 1.0, 1.0, time=True)
    monkeypatch.setattr(cli, "_FIELDS_IN_MEMORY", 24 * 10**9)
    code, out = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "periodic")
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert f"--rhs {src}:forcing: a float64 solve of 16×8 cells needs about" in err, err


def test_a_config_files_n_is_named_as_n(tmp_path, capsys, rhs_file):
    """n in --config sets nx and ny like --n; a mismatch with --rhs named it --ny."""
    config = tmp_path / "n.toml"
    config.write_text("n = 16\n")
    for extra in ([], ["--nx", "8"]):
        args = ["--config", str(config), "--rhs", f"{rhs_file}:forcing", "--bc", "periodic"]
        code, _ = _poisson(tmp_path, *args, *extra)
        err = capsys.readouterr().err
        assert code == 2 and "error: --n=16 does not match --rhs" in err, err


def test_output_paths_and_config_errors(tmp_path, capsys, rhs_file):
    code, _ = _poisson(
        tmp_path, "--rhs", f"{rhs_file}:forcing", "--bc", "periodic", name=rhs_file.name
    )
    assert code == 2
    assert "is the input file" in capsys.readouterr().err
    assert h5py.File(rhs_file, "r")["forcing"].shape == (3, 8, 8)  # untouched
    assert main(["poisson", "--output", str(tmp_path / "no" / "x.h5")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("case = 'dirichlet\n")
    assert main(["poisson", "--config", str(bad)]) == 2
    assert "is not valid TOML" in capsys.readouterr().err
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("case = 'dirichlet'\nt_end = 3.0\n")
    assert main(["poisson", "--config", str(unknown)]) == 2
    err = capsys.readouterr().err
    assert "unknown setting(s) ['t_end']" in err and "[parameters]" not in err
    params = tmp_path / "params.toml"
    params.write_text("case = 'dirichlet'\n[parameters]\ngravity = 9.8\n")
    assert main(["poisson", "--config", str(params)]) == 2
    assert "unknown setting(s) ['parameters']" in capsys.readouterr().err
    quiet = tmp_path / "quiet.toml"  # as for shallow-water
    quiet.write_text(f"n = 16\nquiet = true\noutput = '{tmp_path / 'q.h5'}'\n")
    assert main(["poisson", "--config", str(quiet)]) == 0
    assert "physjax poisson:" not in capsys.readouterr().err  # no status line


def test_a_variable_named_like_its_first_dimension_keeps_the_files_grid(tmp_path, capsys):
    """netCDF-4 makes lev(lev, y, x) the scale of its own first dimension and attaches no
    scale to its other dimensions: they are found by their netCDF ids. (Before, every
    dimension was labelled 'lev' and the file's x/y coordinates were dropped: a solve on a
    1-m box, a solution wrong by a factor of ~1e8, exit 0.)"""
    y, x = 1e3 * (np.arange(8) + 0.5), 1e3 * (np.arange(12) + 0.5)
    f = np.sin(2 * np.pi * x / 12e3)[None, :] * np.cos(2 * np.pi * y / 8e3)[:, None]
    src = tmp_path / "lev.nc"
    xr.Dataset(
        {"lev": (("lev", "y", "x"), f[None]), "same": (("y", "x"), f)},
        coords={"x": ("x", x, {"units": "m"}), "y": ("y", y, {"units": "m"})},
    ).to_netcdf(src, engine="h5netcdf")
    results = {}
    for name in ("lev", "same"):
        code, out = _poisson(tmp_path, "--rhs", f"{src}:{name}", "--bc", "periodic", name=name)
        assert code == 0
        with xr.open_dataset(out) as ds:
            assert json.loads(ds.attrs["configuration"])["extent"] == [8e3, 12e3]  # (y, x)
            np.testing.assert_allclose(ds["x"], x)
            results[name] = ds["u"].values
    np.testing.assert_array_equal(results["lev"], results["same"])
    assert "dimensions ('lev', 'y', 'x')" in capsys.readouterr().err  # the size-1 level dropped


def test_coordinate_units(tmp_path, capsys):
    f = np.random.default_rng(3).normal(size=(8, 16))
    km = tmp_path / "km.nc"
    xr.Dataset(
        {"f": (("y", "x"), f)},
        coords={
            "y": ("y", 2.0 * (np.arange(8) + 0.5), {"units": "km"}),
            "x": ("x", 0.5 * (np.arange(16) + 0.5), {"units": "km"}),
        },
    ).to_netcdf(km, engine="h5netcdf")
    code, out = _poisson(tmp_path, "--rhs", f"{km}:f", "--bc", "periodic", name="km.h5")
    assert code == 0
    with xr.open_dataset(out) as ds:
        np.testing.assert_allclose(ds["x"], 500.0 * (np.arange(16) + 0.5))
        assert json.loads(ds.attrs["configuration"])["extent"] == [16e3, 8e3]
    deg = tmp_path / "deg.nc"
    xr.Dataset(
        {"f": (("lat", "lon"), f)},
        coords={
            "lat": ("lat", np.linspace(-35, 35, 8), {"units": "degrees_north"}),
            "lon": ("lon", np.linspace(0, 337.5, 16), {"units": "degrees_east"}),
        },
    ).to_netcdf(deg, engine="h5netcdf")
    code, out = _poisson(tmp_path, "--rhs", f"{deg}:f", "--bc", "periodic", name="deg.h5")
    assert code == 2
    assert "coordinate of" in (err := capsys.readouterr().err) and "is in 'degrees_north'" in err
    assert not out.exists()
    code, out = _poisson(
        tmp_path,
        *("--rhs", f"{deg}:f", "--bc", "periodic", "--lx", "4e7", "--ly", "8e6"),
        name="deg.h5",
    )
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["extent"] == [8e6, 4e7]
    row = tmp_path / "row.nc"  # one y value: no spacing (it used to become a 1-m extent)
    _write_rhs(row, f[:1], 1e3, 1e3)
    code, out = _poisson(tmp_path, "--rhs", f"{row}:forcing", "--bc", "neumann,periodic")
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "the y coordinate of" in err and "has one value" in err and "--ly" in err
    code, out = _poisson(
        tmp_path, "--rhs", f"{row}:forcing", "--bc", "neumann,periodic", "--ly", "1e3"
    )
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["extent"] == [1e3, 16e3]
    # y stored north to south: 'not uniformly increasing; give the domain length with --ly'
    # led to a solve with the axis reversed against the file's coordinates
    down = tmp_path / "down.nc"
    xr.Dataset({"f": (("y", "x"), f)}, coords={"y": 8.0 - np.arange(8)}).to_netcdf(
        down, engine="h5netcdf"
    )
    code, out = _poisson(tmp_path, "--rhs", f"{down}:f", "--bc", "periodic", name="d.h5")
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "the y coordinate of" in err and "decreases (8 … 1)" in err, err
    assert "store the variable with y increasing (with xarray, ds.sortby('y'))" in err
    # uniform coordinates stored in float32 (as many models write them): 0.1 km steps vary
    # by 5e-6 of themselves through rounding alone, and were refused as not uniform
    single = tmp_path / "single.nc"
    xr.Dataset(
        {"f": (("y", "x"), np.tile(f, (8, 1)))},
        coords={
            "y": ("y", (0.1 * (np.arange(64) + 0.5)).astype("f4"), {"units": "km"}),
            "x": ("x", (-3.3e5 + 1.1e4 * (np.arange(16) + 0.5)).astype("f4"), {"units": "m"}),
        },
    ).to_netcdf(single, engine="h5netcdf")
    code, out = _poisson(tmp_path, "--rhs", f"{single}:f", "--bc", "periodic", name="s.h5")
    assert code == 0, capsys.readouterr().err
    with xr.open_dataset(out) as ds:
        np.testing.assert_allclose(json.loads(ds.attrs["configuration"])["extent"], [6400, 176e3])
        np.testing.assert_allclose(ds["y"], 100.0 * (np.arange(64) + 0.5), rtol=1e-6)
    # a coordinate of labels gives no positions: a box of 1 m (or --lx) along it, as without
    # one; it stopped with "error: could not convert string to float: b's0'", naming nothing
    labels = tmp_path / "labels.nc"
    xr.Dataset({"f": (("y", "x"), f)}, coords={"x": ("x", [f"s{i}" for i in range(16)])}).to_netcdf(
        labels, engine="h5netcdf"
    )
    code, out = _poisson(tmp_path, "--rhs", f"{labels}:f", "--bc", "periodic", name="l.h5")
    assert code == 0, capsys.readouterr().err
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["extent"] == [1.0, 1.0]
    code, out = _poisson(
        tmp_path, "--rhs", f"{labels}:f", "--bc", "periodic", "--lx", "4e3", name="l.h5"
    )
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert json.loads(ds.attrs["configuration"])["extent"] == [1.0, 4e3]


def test_packed_and_missing_values_read_as_cf_readers_do(tmp_path, capsys):
    """Packed integers (scale_factor/add_offset) are unpacked, and cells equal to the
    _FillValue are missing values, refused — as xarray reads them, not as raw HDF5."""
    x = (np.arange(16) + 0.5) * 1e3
    q = np.outer(np.sin(np.pi * x / 16e3), np.sin(np.pi * x / 16e3))
    src = tmp_path / "packed.nc"
    coords = {"y": ("y", x, {"units": "m"}), "x": ("x", x, {"units": "m"})}
    holes = np.where(q > 0.9, np.nan, q)
    xr.Dataset({"qpack": (("y", "x"), q), "qfill": (("y", "x"), holes)}, coords=coords).to_netcdf(
        src,
        engine="h5netcdf",
        encoding={
            "qpack": {
                "dtype": "int16",
                "scale_factor": 1e-4,
                "add_offset": 1.0,
                "_FillValue": -32768,  # present, but no cell has it
            },
            "qfill": {"_FillValue": -999.0},
        },
    )
    code, out = _poisson(tmp_path, "--rhs", f"{src}:qpack", "--bc", "dirichlet")
    assert code == 0
    with xr.open_dataset(out) as ds, xr.open_dataset(src) as inp:
        np.testing.assert_allclose(ds["f"], inp["qpack"], rtol=0, atol=1e-12)
        assert float(ds["f"].min()) > 0  # the raw int16 values are ≈ -1e4
    code, out = _poisson(tmp_path, "--rhs", f"{src}:qfill", "--bc", "dirichlet", name="q.h5")
    assert code == 2 and not out.exists()
    missing = int(np.isnan(holes).sum())
    err = capsys.readouterr().err
    assert f"has {missing} missing value(s) (cells equal to its _FillValue" in err


@pytest.mark.parametrize(
    "key, value", [("scale_factor", "0.5"), ("add_offset", np.array([1.0, 2.0]))]
)
def test_a_packing_attribute_that_is_not_one_number_is_named(tmp_path, capsys, key, value):
    """A scale_factor stored as text (as some tools write attributes) or an add_offset of
    two values stopped with NumPy's "ufunc 'multiply' did not contain a loop …" or
    "operands could not be broadcast …", naming neither the variable nor the attribute."""
    src = tmp_path / "packed.h5"
    with h5py.File(src, "w") as fh:
        fh["q"] = np.arange(256, dtype=np.int16).reshape(16, 16)
        fh["q"].attrs[key] = value
    code, out = _poisson(tmp_path, "--rhs", f"{src}:q", "--bc", "dirichlet")
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert f"--rhs: {src}:q has {key} = " in err and "not a number" in err, err


def test_unsigned_integers_read_as_cf_readers_do(tmp_path, capsys):
    """netCDF keeps unsigned counts in signed types marked ``_Unsigned = "true"`` (satellite
    products pack them so): they are read unsigned, then unpacked, as xarray reads them.
    Read signed, half the cells of this f were off by 65536 * scale_factor = 2.18."""
    x = (np.arange(16) + 0.5) / 16
    q = np.outer(np.sin(2 * np.pi * x), np.cos(2 * np.pi * x))
    src = tmp_path / "counts.nc"
    coords = {"y": ("y", x, {"units": "m"}), "x": ("x", x, {"units": "m"})}
    xr.Dataset({"q": (("y", "x"), q)}, coords=coords).to_netcdf(
        src,
        engine="h5netcdf",
        encoding={
            "q": {
                "dtype": "int16",
                "_Unsigned": "true",
                "scale_factor": np.float32(2 / 60000),
                "add_offset": np.float32(-1.0),
                "_FillValue": np.int16(-1),  # 65535 unsigned: no cell has it
            }
        },
    )
    with h5py.File(src, "r") as fh:
        assert fh["q"].dtype == np.int16 and (fh["q"][...] < 0).sum() > 50  # stored signed
    code, out = _poisson(tmp_path, "--rhs", f"{src}:q", "--bc", "periodic")
    assert code == 0
    with xr.open_dataset(out) as ds, xr.open_dataset(src) as inp:
        np.testing.assert_allclose(ds["f"], inp["q"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(ds["f"], q, rtol=0, atol=2e-5)
    # an unpacked unsigned byte, and the fill value still found among the raw values
    counts = np.round((q + 1) * 100).astype(np.uint8)
    counts[0, :3] = 255
    xr.Dataset(
        {"c": (("y", "x"), counts.view(np.int8), {"_Unsigned": "true", "_FillValue": np.int8(-1)})}
    ).to_netcdf(src, engine="h5netcdf")
    code, out = _poisson(tmp_path, "--rhs", f"{src}:c", "--bc", "periodic", name="c.h5")
    assert code == 2 and not out.exists()
    assert "has 3 missing value(s)" in capsys.readouterr().err
    counts[0, :3] = 7
    xr.Dataset({"c": (("y", "x"), counts.view(np.int8), {"_Unsigned": "true"})}).to_netcdf(
        src, engine="h5netcdf"
    )
    code, out = _poisson(tmp_path, "--rhs", f"{src}:c", "--bc", "dirichlet", name="c.h5")
    assert code == 0
    with xr.open_dataset(out) as ds:
        np.testing.assert_array_equal(ds["f"], counts.astype(float))


def test_rhs_skips_an_incomplete_trailing_frame(tmp_path, capsys):
    """A physjax file killed in the middle of an append has a time axis one longer than its
    ``n_frames``: the last complete frame is the default, and --frame counts those only."""
    src = tmp_path / "run.h5"
    _write_rhs(src, np.random.default_rng(3).normal(size=(3, 8, 8)), 1.0, 1.0, time=True)
    with h5py.File(src, "a") as h:
        h.attrs["n_frames"] = 2  # frame 2 was never completed
    code, out = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "dirichlet")
    assert code == 0
    with xr.open_dataset(out) as ds, xr.open_dataset(src) as inp:
        assert json.loads(ds.attrs["configuration"])["frame"] == 1
        np.testing.assert_allclose(ds["f"], inp["forcing"][1], rtol=0, atol=0)
    code, out = _poisson(
        tmp_path, "--rhs", f"{src}:forcing", "--bc", "dirichlet", "--frame", "-2", name="m2.h5"
    )
    assert code == 0
    with xr.open_dataset(out) as ds, xr.open_dataset(src) as inp:
        cfg = json.loads(ds.attrs["configuration"])
        assert cfg["frame"] == 0 and cfg["rhs_time"] == 0.0
        np.testing.assert_allclose(ds["f"], inp["forcing"][0], rtol=0, atol=0)
    code, out = _poisson(
        tmp_path, "--rhs", f"{src}:forcing", "--bc", "dirichlet", "--frame", "2", name="f2.h5"
    )
    assert code == 2 and not out.exists()
    # the valid range, worded as physjax plot --frame words it
    assert (
        f"--frame 2 is out of range: {src}:forcing has 2 frames (0 to 1, or -1 to -2 from the "
        "last)" in capsys.readouterr().err
    )


@pytest.mark.parametrize("n_frames", [-1, 2.5, True])
def test_rhs_refuses_a_files_n_frames_that_is_no_count(tmp_path, capsys, n_frames):
    """An ``n_frames`` that is no count of frames is refused as `read_frame` refuses it, not
    read as "-1 frames" (an out-of-range --frame that was never given) or cut to 2."""
    src = tmp_path / "run.h5"
    _write_rhs(src, np.random.default_rng(3).normal(size=(3, 8, 8)), 1.0, 1.0, time=True)
    with h5py.File(src, "a") as h:
        h.attrs["n_frames"] = n_frames
    code, out = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "dirichlet")
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert f"--rhs: {str(src)!r}: attribute n_frames must be a count of frames" in err
    assert f"got {n_frames!r}" in err and "--frame" not in err


def test_output_replaces_a_physjax_file_but_not_someone_elses(tmp_path, capsys):
    small = ["--nx", "16", "--ny", "16"]
    code, out = _poisson(tmp_path, *small)
    assert code == 0
    assert _poisson(tmp_path, *small, "--case", "dirichlet")[0] == 0  # its own: replaced
    with xr.open_dataset(out) as ds:
        assert ds.attrs["case"] == "dirichlet"
    data = tmp_path / "mine.h5"
    with h5py.File(data, "w") as f:
        f["x"] = np.arange(3.0)
    before = data.read_bytes()
    capsys.readouterr()
    assert _poisson(tmp_path, *small, name="mine.h5")[0] == 2
    assert "exists and is not a physjax output file; pass --overwrite" in capsys.readouterr().err
    assert data.read_bytes() == before
    assert _poisson(tmp_path, *small, "--overwrite", name="mine.h5")[0] == 0
    with xr.open_dataset(data) as ds:
        assert ds.attrs["status"] == "complete" and "u" in ds
    # another command's finished results: a clash of names, not replaced without --overwrite
    # (a solve used to replace a complete shallow-water run, and the other way round)
    sw = tmp_path / "sw.h5"
    fast = ["--case", "gravity-wave", "--n", "8", "--t-end", "3600", "--quiet"]
    assert main(["shallow-water", *fast, "--output", str(sw)]) == 0
    before = sw.read_bytes()
    capsys.readouterr()
    assert _poisson(tmp_path, *small, name="sw.h5")[0] == 2
    err = capsys.readouterr().err
    assert "holds the results of physjax shallow-water (case gravity-wave, complete)" in err
    assert sw.read_bytes() == before
    assert main(["shallow-water", *fast, "--output", str(out)]) == 2
    assert "holds the results of physjax poisson (case dirichlet" in capsys.readouterr().err
    assert _poisson(tmp_path, *small, "--overwrite", name="sw.h5")[0] == 0


def test_an_unfinished_solve_is_not_sent_to_a_resume_that_poisson_lacks(tmp_path, capsys):
    """A solve killed before it ended (SIGKILL: its file stays marked running) was refused
    with 'continue it with: physjax poisson --output … --resume', an option poisson does not
    have; shallow-water pointed there too."""
    small = ["--nx", "16", "--ny", "16"]
    code, out = _poisson(tmp_path, *small)
    assert code == 0
    with h5py.File(out, "a") as f:
        f.attrs["status"] = "running"
    before = out.read_bytes()
    capsys.readouterr()
    assert _poisson(tmp_path, *small)[0] == 2
    err = capsys.readouterr().err
    assert "holds an unfinished poisson solve (status 'running'" in err
    assert "--resume" not in err and "pass --overwrite to replace it" in err
    fast = ["--case", "gravity-wave", "--n", "8", "--t-end", "3600", "--quiet"]
    assert main(["shallow-water", *fast, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds an unfinished poisson solve" in err and "--resume" not in err
    assert out.read_bytes() == before
    assert _poisson(tmp_path, *small, "--overwrite")[0] == 0


@pytest.fixture
def sigterm_unhandled(monkeypatch):
    """A SIGTERM that physjax leaves unhandled fails the test instead of killing pytest."""

    def unhandled(signum, frame):
        raise RuntimeError("SIGTERM was not handled by physjax")

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield unhandled
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("where", ["at once", "in a weakref callback"])
def test_sigterm_ends_the_solve_like_ctrl_c_with_no_file_left(
    tmp_path, capsys, monkeypatch, sigterm_unhandled, where, signal_in_a_callback
):
    """A batch system's SIGTERM ends `physjax poisson` with status 130 and one line, and
    leaves neither the output (it would say "running") nor the hidden lock file. One that
    lands in a weakref callback, where Python cannot raise it (it would print "Exception
    ignored" and go on to a normal exit), is raised again at the next opportunity."""

    from physjax.io import NetCDFWriter

    original = NetCDFWriter.write_static

    def write_static(self, fields):
        if where == "at once":
            signal.raise_signal(signal.SIGTERM)
        else:
            signal_in_a_callback(signal.SIGTERM)
            time.sleep(5)  # where the stop is raised again (a command that ends first ends)
        return original(self, fields)

    ignored = []  # what Python would print as "Exception ignored in …"
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    monkeypatch.setattr(NetCDFWriter, "write_static", write_static)
    code, out = _poisson(tmp_path, "--n", "16")
    err = capsys.readouterr().err
    assert code == 130 and not ignored, err
    assert err.strip().splitlines() == [
        "terminated (SIGTERM): stopping now",
        "physjax poisson: interrupted",
    ]
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is sigterm_unhandled  # restored after
    assert sys.unraisablehook == ignored.append


@pytest.mark.parametrize("stop", ["interrupt", "failed write"])
def test_an_existing_output_survives_a_solve_stopped_while_writing(
    tmp_path, capsys, monkeypatch, stop
):
    """A solve replacing a finished one (or any file, with --overwrite) used to replace it
    as the new file was created and then remove the half-written new one when Ctrl-C, a
    SIGTERM or a failed write struck while its fields were written: the earlier results
    were lost (exit 130, no file). The new file is now made under a hidden name and moved
    into place whole; the old one stays as it was, and nothing else is left."""
    from physjax.io import NetCDFWriter, OutputSpaceError

    code, out = _poisson(tmp_path, "--n", "16")
    assert code == 0
    before = out.read_bytes()
    original = NetCDFWriter.write_static

    def write_static(self, fields):
        original(self, fields)  # the new fields are in the file, not yet marked complete
        if stop == "interrupt":
            raise KeyboardInterrupt
        raise OutputSpaceError(f"only 1 KiB free on the disk of {self.path!r}")

    monkeypatch.setattr(NetCDFWriter, "write_static", write_static)
    capsys.readouterr()
    for extra in ([], ["--overwrite"]):
        code = _poisson(tmp_path, "--n", "32", "--case", "dirichlet", *extra)[0]
        err = capsys.readouterr().err
        if stop == "interrupt":
            assert code == 130 and err.strip().splitlines()[-1] == "physjax poisson: interrupted"
        else:  # the error names the --output, not the hidden file
            assert code == 1 and f"free on the disk of {str(out)!r}" in err, err
        assert out.read_bytes() == before
        assert sorted(p.name for p in tmp_path.iterdir()) == ["p.h5"]
    monkeypatch.setattr(NetCDFWriter, "write_static", original)
    assert _poisson(tmp_path, "--n", "32", "--case", "dirichlet")[0] == 0  # replaced whole
    with xr.open_dataset(out) as ds:
        assert ds.attrs["case"] == "dirichlet" and ds.sizes["x"] == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.h5"]


def test_sigterm_while_compiling_exits_130(tmp_path):
    """The console command, stopped while XLA compiles: status 130 with one line (a SIGTERM
    used to kill it outright, leaving the hidden lock file; a Ctrl-C there ended in a
    segmentation fault of the interpreter's teardown after the "interrupted" line)."""
    out = tmp_path / "c.h5"
    run = [sys.executable, "-m", "physjax.cli", "poisson", "--method", "multigrid"]
    run += ["--case", "dirichlet", "--n", "256", "--output", str(out)]
    proc = subprocess.Popen(run, stderr=subprocess.PIPE, text=True)
    try:
        header = proc.stderr.readline()  # printed just before the solver is built
        assert "256×256 cells" in header, header
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, header + rest
    assert rest.strip().splitlines()[-1] == "physjax poisson: interrupted"
    assert list(tmp_path.iterdir()) == []


def test_named_x_y_are_honoured_beside_dimensions_of_other_names(tmp_path, capsys):
    """One dimension of another name (depth) used to make every dimension positional, so a
    (depth, x, y) field was solved with x and y swapped; the named ones are now kept and the
    other takes the axis left over."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(4, 8, 16))  # (depth, y, x)
    coords = {
        "y": ("y", np.arange(8) * 10.0 + 5, {"units": "m"}),
        "x": ("x", np.arange(16) * 20.0 + 10, {"units": "m"}),
        "depth": ("depth", np.arange(4) * 2.0 + 1, {"units": "m"}),
    }
    results = {}
    for name, dims in (
        ("ref", ("depth", "y", "x")),
        ("a", ("depth", "x", "y")),
        ("b", ("y", "x", "depth")),
    ):
        order = [("depth", "y", "x").index(d) for d in dims]
        src = tmp_path / f"{name}.nc"
        xr.Dataset({"f": (dims, a.transpose(order))}, coords=coords).to_netcdf(
            src, engine="h5netcdf"
        )
        code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "dirichlet", name=f"{name}.h5")
        err = capsys.readouterr().err
        assert code == 0, err
        assert ("took 'depth' as z" in err) == (name != "ref"), err
        with h5py.File(out, "r") as h:
            results[name] = h["u"][...]
            assert h["u"].shape == (4, 8, 16) and float(h["x"][1] - h["x"][0]) == 20.0
    assert np.array_equal(results["a"], results["ref"])
    assert np.array_equal(results["b"], results["ref"])


def test_a_single_level_is_solved_in_2d(tmp_path, capsys):
    """A 2-D field stored with a dimension of size 1 of another name (one level, one member:
    (lev, y, x), (y, x, lev), (member, lev, y, x)) is the 2-D problem. It was solved as a 3-D
    box one cell thick, whose Dirichlet walls half a cell above and below changed u by 6 %
    (8.1e-4 of max |u| 1.3e-2 here) with no word when lev came first."""
    x = (np.arange(16) + 0.5) / 16
    q = np.outer(np.sin(2 * np.pi * x), np.cos(2 * np.pi * x))
    coords = {"y": ("y", x, {"units": "m"}), "x": ("x", x, {"units": "m"})}
    src = tmp_path / "levels.nc"
    xr.Dataset(
        {
            "flat": (("y", "x"), q),
            "lev_first": (("lev", "y", "x"), q[None]),
            "lev_last": (("y", "x", "lev"), q[..., None]),
            "member": (("member", "lev", "y", "x"), q[None, None]),
        },
        coords=coords,
    ).to_netcdf(src, engine="h5netcdf")
    results = {}
    for name in ("flat", "lev_first", "lev_last", "member"):
        code, out = _poisson(
            tmp_path, "--rhs", f"{src}:{name}", "--bc", "dirichlet", name=f"{name}.h5"
        )
        err = capsys.readouterr().err
        assert code == 0, err
        assert ("dropped the dimension(s) of size 1" in err) == (name != "flat"), err
        with xr.open_dataset(out) as ds:
            assert ds["u"].dims == ("y", "x")
            assert json.loads(ds.attrs["configuration"])["shape"] == [16, 16]
            results[name] = ds["u"].values
    for name in ("lev_first", "lev_last", "member"):
        np.testing.assert_array_equal(results[name], results["flat"])
    # a dimension named z is an axis, one cell thick or not
    xr.Dataset({"f": (("z", "y", "x"), q[None])}, coords=coords).to_netcdf(src, engine="h5netcdf")
    code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "dirichlet", name="z.h5")
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert ds["u"].dims == ("z", "y", "x")


def test_time_dimensions_known_by_name_or_cf_attributes(tmp_path, capsys):
    """WRF's ``Time`` (no coordinate) and a time axis under another name with CF units
    ("days since …") are time: their last frame is solved in 2-D (they were a third spatial
    axis), and the frame's time is recorded with its units; time not first is refused."""
    rng = np.random.default_rng(2)
    ft = rng.normal(size=(3, 16, 16))
    wrf = tmp_path / "wrf.nc"
    xr.Dataset({"f": (("Time", "south_north", "west_east"), ft)}).to_netcdf(wrf, engine="h5netcdf")
    days = tmp_path / "days.nc"
    ds = xr.Dataset({"f": (("tt", "y", "x"), ft)}, coords={"tt": np.arange(3.0)})
    ds["tt"].attrs["units"] = "days since 2000-01-01"
    ds.to_netcdf(days, engine="h5netcdf")
    late = tmp_path / "late.nc"
    xr.Dataset({"f": (("y", "x", "time"), ft.transpose(1, 2, 0))}).to_netcdf(
        late, engine="h5netcdf"
    )
    ref = np.asarray(
        PoissonSolver(
            Grid((16, 16), (1.0, 1.0), dtype="float64"), "periodic", compatibility="project"
        )(ft[-1])
    )
    for src, unit in ((wrf, None), (days, "days since 2000-01-01")):
        code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "periodic", name="t.h5")
        assert code == 0, capsys.readouterr().err
        with h5py.File(out, "r") as h:
            assert h["u"].shape == (16, 16)
            np.testing.assert_allclose(h["u"][...], ref, rtol=0, atol=1e-12)
            cfg = json.loads(h.attrs["configuration"])
        assert cfg["frame"] == 2 and cfg.get("rhs_time_units") == unit
        assert cfg["rhs_time"] == (None if unit is None else 2.0)
    plot = tmp_path / "t.png"
    assert main(["plot", str(out), "--output", str(plot)]) == 0 and plot.exists()
    code, _ = _poisson(tmp_path, "--rhs", f"{late}:f", "--bc", "periodic", name="late.h5")
    err = capsys.readouterr().err
    assert code == 2 and "with time ('time') not first" in err, err
    assert not (tmp_path / "late.h5").exists()


def test_a_coefficient_on_another_grid_is_refused_and_units_follow_it(tmp_path, capsys):
    """The coefficient's coordinates and staggering were never compared with the right-hand
    side's; u's units ignored a's."""
    x = np.arange(16) * 10.0 + 5
    src = tmp_path / "f.nc"
    f = np.random.default_rng(3).normal(size=(16, 16))
    xr.Dataset(
        {"f": (("y", "x"), f, {"units": "s-1"})},
        coords={"x": ("x", x, {"units": "m"}), "y": ("y", x, {"units": "m"})},
    ).to_netcdf(src, engine="h5netcdf")

    def coefficient(name, xs, xdim="x", unit="m"):
        path = tmp_path / f"{name}.nc"
        ds = xr.Dataset(
            {"a": (("y", xdim), np.full((16, 16), 2.0), {"units": "m"})},
            coords={xdim: (xdim, xs, {"units": unit}), "y": ("y", x, {"units": "m"})},
        )
        ds.to_netcdf(path, engine="h5netcdf")
        return f"{path}:a"

    for spec, match in (
        (coefficient("shifted", x + 5000), "its x coordinate (5005 … 5155 m) is not the one"),
        (coefficient("faces", x - 5, xdim="x_f"), "lies on 'x_f' along x, --rhs"),
    ):
        code, _ = _poisson(tmp_path, "--rhs", f"{src}:f", "--coefficient", spec, "--bc", "periodic")
        err = capsys.readouterr().err
        assert code == 2 and match in err, err
    km = coefficient("km", x / 1000, unit="km")  # the same points in km
    code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--coefficient", km, "--bc", "periodic")
    assert code == 0, capsys.readouterr().err
    with h5py.File(out, "r") as h:
        units = {k: h[k].attrs["units"] for k in ("u", "f", "a")}
    assert units == {"u": "s-1 m", "f": "s-1", "a": "m"}  # [f] m2 / [a]
    # a manufactured case's f (m-2) with that coefficient: u was given units 1 whatever a's
    code, out = _poisson(tmp_path, "--case", "dirichlet", "--n", "16", "--coefficient", km)
    assert code == 0, capsys.readouterr().err
    with h5py.File(out, "r") as h:
        units = {k: h[k].attrs["units"] for k in ("u", "f", "a")}
    assert units == {"u": "m-1", "f": "m-2", "a": "m"}
    # the same points far from the origin (UTM northings), the coefficient's stored in
    # float32: rounded by up to 0.25 m, which 1e-6 of the extent (1.6e-4 m) refused
    far = x + 5.0e6 + 0.2
    utm = tmp_path / "utm.nc"
    xr.Dataset(
        {"f": (("y", "x"), f, {"units": "s-1"})},
        coords={"x": ("x", x, {"units": "m"}), "y": ("y", far, {"units": "m"})},
    ).to_netcdf(utm, engine="h5netcdf")
    a32 = tmp_path / "a32.nc"
    xr.Dataset(
        {"a": (("y", "x"), np.full((16, 16), 2.0))},
        coords={"x": ("x", x.astype("f4")), "y": ("y", far.astype("f4"))},
    ).to_netcdf(a32, engine="h5netcdf")
    code, _ = _poisson(
        tmp_path, "--rhs", f"{utm}:f", "--coefficient", f"{a32}:a", "--bc", "periodic"
    )
    assert code == 0, capsys.readouterr().err


def test_big_endian_fields_are_read(tmp_path, capsys):
    """A coefficient stored big-endian (as some Fortran models and older archives write
    them) was refused as 'coefficient must be a positive number or a real array of the
    grid's shape', JAX taking native byte order only; the right-hand side was read."""
    path = tmp_path / "be.h5"
    f = np.sin(np.arange(256.0)).reshape(16, 16)
    with h5py.File(path, "w") as h:
        h.create_dataset("f", data=f, dtype=">f8")
        h.create_dataset("a", data=np.full((16, 16), 2.0), dtype=">f8")
    spec = ["--rhs", f"{path}:f", "--coefficient", f"{path}:a", "--bc", "dirichlet"]
    code, out = _poisson(tmp_path, *spec)
    assert code == 0, capsys.readouterr().err
    with xr.open_dataset(out) as ds:
        u = np.asarray(ds["u"])
    grid = Grid((16, 16), (1.0, 1.0), periodic=False, dtype="float64")
    np.testing.assert_allclose(u, np.asarray(PoissonSolver(grid, "dirichlet")(f)) / 2, atol=1e-12)


def test_units_stored_as_one_element_arrays_are_read(tmp_path, capsys):
    """A units attribute stored as a 1-element array (MATLAB's h5writeatt, some h5py
    writers) stopped the command with "AttributeError: 'numpy.ndarray' object has no
    attribute 'split'" and a traceback."""
    path = tmp_path / "arr.h5"
    with h5py.File(path, "w") as h:
        h["f"] = np.sin(np.arange(64.0)).reshape(8, 8)
        h["f"].attrs["units"] = np.array([b"s-1"])
        h["a"] = np.ones((8, 8))
        h["a"].attrs["units"] = np.array(["m"], dtype=h5py.string_dtype())
    spec = ["--rhs", f"{path}:f", "--coefficient", f"{path}:a", "--bc", "dirichlet"]
    code, out = _poisson(tmp_path, *spec)
    assert code == 0, capsys.readouterr().err
    with h5py.File(out, "r") as h:
        units = {k: h[k].attrs["units"] for k in ("u", "f", "a")}
    assert units == {"u": "s-1 m", "f": "s-1", "a": "m"}


def test_a_file_locked_by_a_writer_is_waited_for(tmp_path, capsys, monkeypatch):
    """A run writing its file holds HDF5's lock for each frame: --rhs waits for it (it used
    to fail at once with a raw 'unable to lock file' error), and says so if it lasts."""
    from physjax.io import _reading

    src = tmp_path / "in.h5"
    _write_rhs(src, np.random.default_rng(4).normal(size=(8, 8)), 1.0, 1.0)

    def hold(seconds):
        code = (
            f"import h5py, time; f = h5py.File({str(src)!r}, 'a'); print('held', flush=True); "
            f"time.sleep({seconds}); f.close()"
        )
        holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "held"
        return holder

    holder = hold(1.0)
    code, _ = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "periodic")
    holder.wait()
    assert code == 0, capsys.readouterr().err
    monkeypatch.setattr(_reading, "READ_WAIT", 0.3)
    holder = hold(5.0)
    try:
        code, _ = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "periodic", name="q.h5")
    finally:
        holder.kill()
    err = capsys.readouterr().err
    assert code == 2 and "is locked by another process and stayed so for 0.3 s" in err, err


def test_a_file_a_running_writer_extends_is_read_again(tmp_path, capsys, monkeypatch):
    """A physjax run that finds its file open by a reader goes on without HDF5's lock, so
    --rhs on a running shallow-water file met the file growing under it: 'addr overflow'
    while reading (a traceback, exit status 1) or 'truncated file' on opening (refused as
    not NetCDF4/HDF5), in about 1 of 3 tries at a run saving every two steps. Both are
    tried again; a read that keeps failing is named."""
    from physjax.io import _reading

    src = tmp_path / "in.h5"
    f = np.random.default_rng(6).normal(size=(8, 8))
    _write_rhs(src, f - f.mean(), 1.0, 1.0)
    failures = {"open": 1, "read": 1}
    init, getitem = h5py.File.__init__, h5py.Dataset.__getitem__

    def opening(self, *a, **k):
        if failures["open"]:
            failures["open"] -= 1
            raise OSError("Unable to synchronously open file (truncated file: eof = 96, …)")
        init(self, *a, **k)

    def reading(self, *a):
        if self.name == "/forcing" and failures["read"]:
            failures["read"] -= 1
            raise OSError("Can't synchronously read data (addr overflow, addr = 3221, …)")
        return getitem(self, *a)

    monkeypatch.setattr(h5py.File, "__init__", opening)
    monkeypatch.setattr(h5py.Dataset, "__getitem__", reading)
    code, out = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "periodic")
    assert code == 0, capsys.readouterr().err
    assert failures == {"open": 0, "read": 0}
    with xr.open_dataset(out) as ds:
        np.testing.assert_allclose(ds["f"].values, f - f.mean(), rtol=0, atol=1e-15)
    monkeypatch.setattr(_reading, "READ_WAIT", 0.3)
    failures["read"] = 10**6
    code, out = _poisson(tmp_path, "--rhs", f"{src}:forcing", "--bc", "periodic", name="q.h5")
    err = capsys.readouterr().err
    assert code == 2 and f"--rhs: cannot read {str(src)!r}: Can't synchronously read" in err, err
    assert "still so after trying for 0.3 s" in err
    assert not out.exists()


def test_netcdf3_files_and_recorded_boundaries_are_named(tmp_path, capsys):
    classic = tmp_path / "classic.nc"
    classic.write_bytes(b"CDF\x01" + bytes(60))
    code, _ = _poisson(tmp_path, "--rhs", f"{classic}:f", "--bc", "periodic")
    err = capsys.readouterr().err
    assert code == 2 and "is a netCDF-3 (classic) file" in err and "nccopy -k nc4" in err
    src = tmp_path / "walled.nc"
    y = np.arange(8) + 0.5
    ds = xr.Dataset(
        {"f": (("y", "x"), np.random.default_rng(5).normal(size=(8, 8)))},
        coords={"y": ("y", y, {"boundary": "wall"}), "x": ("x", y, {"boundary": "periodic"})},
    )
    ds.to_netcdf(src, engine="h5netcdf")
    code, _ = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "periodic")
    err = capsys.readouterr().err
    assert code == 0 and "the y axis of" in err and "is wall in the file" in err, err
    assert "the x axis" not in err


def test_missing_variable_lists_those_in_groups_and_a_coordinate_names_its_dimension(
    tmp_path, capsys
):
    src = tmp_path / "g.h5"
    with h5py.File(src, "w") as h:
        h.create_group("grp")["f"] = np.ones((8, 8))
    code, _ = _poisson(tmp_path, "--rhs", f"{src}:nope", "--bc", "periodic")
    err = capsys.readouterr().err
    assert code == 2 and "variables with two or more dimensions: ['grp/f']" in err, err
    nc = tmp_path / "c.nc"
    xr.Dataset({"f": (("y", "x"), np.ones((4, 4)))}, coords={"x": np.arange(4.0)}).to_netcdf(
        nc, engine="h5netcdf"
    )
    code, _ = _poisson(tmp_path, "--rhs", f"{nc}:x", "--bc", "periodic")
    err = capsys.readouterr().err
    assert code == 2 and "has dimensions ('x',) of shape (4,)" in err, err


def test_check_takes_a_float32_fields_round_off_mean(tmp_path, capsys):
    """`--compatibility check` refused a float32 run's vorticity, whose mean is zero to
    float32's round-off only (1e-10 of its max here), measuring it against float64's, and
    `project` reported that mean as removed; a real mean is still refused."""
    zeta = np.random.default_rng(0).standard_normal((32, 32))
    zeta = ((zeta - zeta.mean()) * 1e-5).astype("f4")
    mean = abs(float(np.mean(zeta.astype("f8")))) / float(abs(zeta).max())
    assert 1e-12 < mean < 1e-6  # above float64's round-off, within float32's
    rhs = tmp_path / "zeta.nc"
    xr.Dataset({"zeta": (("y", "x"), zeta), "off": (("y", "x"), zeta + 1e-6)}).to_netcdf(
        rhs, engine="h5netcdf"
    )
    code, _ = _poisson(tmp_path, "--rhs", f"{rhs}:zeta", "--bc", "periodic", name="a.h5")
    assert code == 0 and "removed" not in capsys.readouterr().out
    args = ["--rhs", f"{rhs}:zeta", "--bc", "periodic", "--compatibility", "check"]
    code, out = _poisson(tmp_path, *args, name="b.h5")
    assert code == 0, capsys.readouterr().err
    with xr.open_dataset(out) as ds:
        assert float(abs(ds.residual).max()) < 1e-12 * float(abs(ds.f).max())
    args[1] = f"{rhs}:off"
    code, _ = _poisson(tmp_path, *args, name="c.h5")
    assert code == 2 and "needs ∫f = 0" in capsys.readouterr().err


def test_notes_that_cannot_be_written_do_not_stop_the_solve(
    tmp_path, monkeypatch, capsys, unwritable_stderr
):
    """The header, the notes (a dimension taken by position, a file replaced) and the line
    of a solve that did not converge go to stderr; where it could not be written (a log on
    a full disk, ENOSPC) the command stopped with an OSError traceback and no file, and
    with stderr closed (``2>&-``, None) they went to stdout among the closing line. They
    are now dropped, as the progress bar is: the solve ends, its file written."""
    src = tmp_path / "f.nc"
    f = np.random.default_rng(0).standard_normal((32, 32))
    f -= f.mean()
    xr.Dataset({"f": (("row", "x"), f)}).to_netcdf(src, engine="h5netcdf")
    out = tmp_path / "p.h5"
    out.write_bytes(b"old")  # replaced: a note
    monkeypatch.setattr(sys, "stderr", unwritable_stderr)
    args = ["poisson", "--rhs", f"{src}:f", "--overwrite", "--output", str(out)]
    assert main([*args, "--bc", "periodic"]) == 0
    with h5py.File(out, "r") as h:
        assert h.attrs["status"] == "complete"
    args += ["--bc", "dirichlet", "--method", "multigrid", "--max-iterations", "1"]
    assert main(args) == 1  # not converged: its line dropped, the file marked failed
    with h5py.File(out, "r") as h:
        assert h.attrs["status"].startswith("failed: not converged")
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1 and printed[0].startswith("poisson spectral:")


def test_bad_input_exits_2_where_stderr_cannot_be_written(
    tmp_path, monkeypatch, capsys, unwritable_stderr
):
    """A bad input's one-line message goes to stderr with exit status 2; where stderr could
    not be written (a log on a full disk) writing the message raised an OSError from the
    command, a traceback and status 1 (a job's script taking it for a failed run, not a
    refused input), and with stderr closed (``2>&-``) the message went to stdout. The
    message is now dropped and the status stays 2."""
    monkeypatch.setattr(sys, "stderr", unwritable_stderr)
    out = tmp_path / "p.h5"
    assert main(["poisson", "--n", "-3", "--output", str(out)]) == 2
    assert main(["poisson", "--rhs", f"{tmp_path / 'none.h5'}:f", "--output", str(out)]) == 2
    assert not out.exists()
    assert capsys.readouterr().out == ""


def test_a_variable_compressed_with_a_missing_filter_is_refused_at_once(tmp_path, capsys):
    """A variable compressed with an HDF5 filter the installation lacks (zstd or blosc
    through a plugin not installed) fails every read with HDF5's "can't synchronously read
    data", which read_retrying took for a file a run was extending: the command waited 5 s
    and then called the file damaged. It is now refused at once (exit 2), naming the
    missing filter's remedy."""
    from physjax.io import read_retrying

    src = tmp_path / "zstd.h5"
    with h5py.File(src, "w") as f:
        d = f.create_dataset(
            "f", (8, 8), "f8", chunks=(8, 8), compression=32015, allow_unknown_filter=True
        )
        d.id.write_direct_chunk((0, 0), np.zeros((8, 8)).tobytes())
    start = time.monotonic()
    code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "periodic")
    assert code == 2 and not out.exists()
    assert time.monotonic() - start < 3  # not 5 s of tries
    err = capsys.readouterr().err
    assert "HDF5 filter this installation lacks" in err and "damaged" not in err

    def read():
        with h5py.File(src, "r") as f:
            return f["f"][...]

    start = time.monotonic()
    with pytest.raises(OSError):  # raised at once, unchanged
        read_retrying(src, read)
    assert time.monotonic() - start < 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_finished_solve_whose_log_is_full_exits_0(tmp_path):
    """A batch job logging to a full disk: the solve's file was complete, but its closing
    line ('poisson spectral: … wrote …') failed with an OSError traceback and exit status 1,
    so the job was reported failed (as `physjax plot`'s 'wrote …' line did). The line is
    now dropped, as the shallow-water command's is, and the command exits 0."""
    out, png = tmp_path / "full.h5", tmp_path / "full.png"
    runs = [
        ["poisson", "--n", "16", "--output", str(out)],
        ["plot", str(out), "--output", str(png)],
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args in runs:
        with open("/dev/full", "w") as full:
            res = subprocess.run(
                [sys.executable, "-m", "physjax", *args],
                stdout=full,
                stderr=full,
                timeout=120,
                env=env,
            )
        assert res.returncode == 0, args[0]
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete"
    assert png.stat().st_size > 0


def test_an_empty_output_is_refused_by_name(tmp_path, capsys, monkeypatch):
    """``--output ''`` (or ``output = ""`` in --config) was reported as "--output '' is not
    writable: No such file or directory", as if a folder were missing; it is refused as
    physjax shallow-water refuses it, before anything is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "e.toml").write_text('n = 8\noutput = ""\n')
    for argv, where in (
        (["--n", "8", "--output", ""], ""),
        (["--config", "e.toml"], " (from output = '' in --config 'e.toml')"),
    ):
        assert main(["poisson", "--quiet", *argv]) == 2
        err = capsys.readouterr().err
        assert err == f"physjax poisson: error: --output must name a file, got ''{where}\n", err
    assert os.listdir(tmp_path) == ["e.toml"]


def test_rhs_of_a_run_without_a_whole_frame_says_why(tmp_path, capsys):
    """A run file whose time axis holds entries but no whole frame (``n_frames = 0``: its
    writer stopped in the first append) was said to have a "time dimension of size 0"."""
    run = tmp_path / "w.h5"
    args = ["shallow-water", "--case", "gravity-wave", "--n", "8", "--t-end", "600", "--quiet"]
    assert main([*args, "--output", str(run)]) == 0
    with h5py.File(run, "a") as f:
        f.attrs["n_frames"] = np.array([0])
        entries = f["time"].shape[0]
    code, _ = _poisson(tmp_path, "--rhs", f"{run}:h", "--bc", "periodic")
    err = capsys.readouterr().err
    assert code == 2
    assert f"--rhs: {run}:h has no frame (n_frames = 0 in the file: none of its {entries} " in err
    assert "size 0" not in err and entries > 0
    assert sorted(os.listdir(tmp_path)) == ["w.h5"]


def test_a_stopping_rule_given_to_a_spectral_solve_is_refused(tmp_path, capsys):
    """--rtol and --max-iterations, the stopping rule of multigrid and cg, were taken in
    silence by a spectral solve (direct), as if they had been applied; from the command line
    and the config file alike they are now refused by name (and taken by cg)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_iterations = 5\n")
    refusal = "{} given, but the method is spectral (the default), a direct solve"
    for extra, says in (
        (["--rtol", "1e-3"], "--rtol"),
        (["--config", str(cfg), "--rtol", "1e-3"], "--rtol and --max-iterations"),
        (["--config", str(cfg)], "--max-iterations"),
        (["--config", str(cfg), "--method", "cg"], None),
        ([], None),
    ):
        code, _ = _poisson(tmp_path, "--n", "8", "--overwrite", *extra)
        err = capsys.readouterr().err
        assert code == (0 if says is None else 2), (extra, err)
        assert (refusal.format(says) in err) if says else "direct solve" not in err, err


def test_plot_help_texts_say_what_is_drawn_and_where(tmp_path, monkeypatch, drawn_figures):
    """`physjax poisson --help` said --plot draws "u, the residual and the error", but a solve
    of a --rhs (or with another --bc) has no error and draws f; `physjax plot --help` said
    the default --output is "next to the file", not which name it takes. Both say so now,
    and what they say is what is drawn and written."""

    from physjax.cli import build_parser

    parser = build_parser()
    helps = {
        name: {a.dest: " ".join(a.help.split()) for a in sub._actions if a.help}
        for name, sub in parser.commands.items()
    }
    assert helps["poisson"]["plot"].endswith(
        "the error (or f, where no exact solution is known: a --rhs, or a --bc other than the "
        "case's)"
    )
    assert (
        helps["plot"]["output"]
        == "PNG to write (default: the file's name with .png, run.h5 -> run.png)"
    )
    code, out = _poisson(
        tmp_path, "--case", "dirichlet", "--bc", "neumann", "--n", "8", name="run.h5"
    )
    assert code == 0
    monkeypatch.chdir(tmp_path)
    assert main(["plot", "run.h5"]) == 0 and (tmp_path / "run.png").stat().st_size > 10_000
    titles = [ax.get_title().split(":")[0] for ax in drawn_figures[-1].axes if ax.get_title()]
    assert titles == ["u", "residual", "f"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_that_lands_in_a_callback_just_before_the_output_is_replaced_is_kept(
    tmp_path, capsys, monkeypatch, sigterm_unhandled, signum, signal_in_a_callback
):
    """A Ctrl-C or SIGTERM that lands in a weakref callback (where Python cannot raise it)
    is raised again from a timer 10 ms later; a solve whose file was finished within those
    10 ms (a small one) replaced the existing output and exited 0 as if no signal had come,
    the timer cancelled as the command ended. The stop is now honoured before the output
    is replaced: exit 130, the old file kept, nothing else left."""

    from physjax import cli
    from physjax.io import NetCDFWriter

    code, out = _poisson(tmp_path, "--n", "16")
    assert code == 0
    before = out.read_bytes()
    original = NetCDFWriter.finish

    def finish(self, **kwargs):
        original(self, **kwargs)  # the new file is complete, not yet moved into place
        signal_in_a_callback(signum)

    # the timer's signal not yet delivered when the output is replaced (it comes 10 ms
    # later, and the command has ended by then)
    monkeypatch.setattr(cli._Interrupts, "_signal_again", lambda self: None)
    ignored = []  # what Python would print as "Exception ignored in …"
    monkeypatch.setattr(sys, "unraisablehook", ignored.append)
    monkeypatch.setattr(NetCDFWriter, "finish", finish)
    code, out = _poisson(tmp_path, "--n", "16")
    err = capsys.readouterr().err
    assert code == 130 and not ignored, err
    assert err.strip().splitlines()[-1] == "physjax poisson: interrupted"
    assert out.read_bytes() == before
    assert list(tmp_path.iterdir()) == [out]
    assert sys.unraisablehook == ignored.append


def test_config_from_a_solves_file_solves_it_again(tmp_path):
    """--config P.h5 solves the problem of an earlier solve again: a manufactured case with
    its grid, lengths, method and stopping rule; a --rhs from a run's file with its frame,
    the grid taken from the file again (its corners put the first cell below 0)."""
    code, first = _poisson(
        tmp_path, "--case", "neumann", "--nx", "24", "--ny", "16", "--ly", "2.5",
        "--method", "multigrid", "--rtol", "1e-7", "--precision", "float64",
    )  # fmt: skip
    assert code == 0
    code, again = _poisson(tmp_path, "--config", str(first), name="again.h5")
    assert code == 0
    sw = tmp_path / "sw.h5"
    argv = ["shallow-water", "--case", "barotropic-instability", "--nx", "16", "--ny", "16"]
    assert main([*argv, "--t-end", "20000", "--quiet", "--output", str(sw)]) == 0
    # --lx along x (origin 0 there), the file's coordinates along y (origin below 0)
    code, psi = _poisson(
        tmp_path, "--rhs", f"{sw}:zeta", "--bc", "periodic", "--frame", "1", "--lx", "5e6",
        name="psi.h5",
    )  # fmt: skip
    assert code == 0
    code, psi2 = _poisson(tmp_path, "--config", str(psi), name="psi2.h5")
    assert code == 0
    for one, two in ((first, again), (psi, psi2)):
        with xr.open_dataset(one) as a, xr.open_dataset(two) as b:
            np.testing.assert_array_equal(a["u"], b["u"])
            np.testing.assert_array_equal(a["x"], b["x"])
            np.testing.assert_array_equal(a["y"], b["y"])
            c1, c2 = json.loads(a.attrs["configuration"]), json.loads(b.attrs["configuration"])
        assert {k for k in c1 if c1[k] != c2.get(k)} == {"output"}
    assert c2["frame"] == 1 and c2["rhs"] == f"{sw}:zeta"
    with xr.open_dataset(again) as b:
        c = json.loads(b.attrs["configuration"])
        assert (c["method"], c["rtol"], c["shape"], c["extent"]) == (
            "multigrid",
            1e-7,
            [16, 24],
            [2.5, 1.0],
        )
    assert c2["extent"][1] == 5e6 and c2["origin"][0] < 0 and c2["origin"][1] == 0


def _stored(path):
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["configuration"])


def test_config_from_a_file_replays_what_its_command_was_given(tmp_path):
    """The file's settings that followed from others (a tolerance from the precision, the
    boundary conditions from the case, the frame of each file) were replayed as if given:
    an option changing what they followed from was refused (--method spectral with the
    multigrid's rtol) or kept the old value (float64's rtol in float32, the first case's
    bc); now they are recomputed, as for a command typed anew."""
    code, mg = _poisson(tmp_path, "--case", "dirichlet", "--n", "16", "--method", "multigrid")
    assert code == 0
    code, sp = _poisson(tmp_path, "--config", str(mg), "--method", "spectral", name="sp.h5")
    assert code == 0 and _stored(sp)["method"] == "spectral"
    code, f32 = _poisson(tmp_path, "--config", str(mg), "--precision", "float32", name="32.h5")
    assert code == 0 and _stored(f32)["rtol"] == 1e-5 and _stored(f32)["shape"] == [16, 16]
    # what the command was given, in the options' names (--n stored as nx and ny)
    assert _stored(mg)["given"] == ["case", "method", "nx", "ny", "output", "quiet"]
    code, nm = _poisson(tmp_path, "--config", str(sp), "--case", "neumann", name="nm.h5")
    assert code == 0 and _stored(nm)["bc"] == ["neumann", "neumann"]
    assert _stored(nm)["method"] == "spectral" and _stored(nm)["shape"] == [16, 16]
    # a right-hand side and a coefficient each from its own file's last frame (--frame,
    # which sets both, was not given): the rerun failed on the other file's frame count
    runs = []
    for name, t_end in (("long.h5", "20000"), ("short.h5", "4000")):
        argv = ["shallow-water", "--case", "gravity-wave", "--n", "16", "--t-end", t_end]
        assert main([*argv, "--quiet", "--output", str(tmp_path / name)]) == 0
        runs.append(tmp_path / name)
    spec = ["--rhs", f"{runs[0]}:h", "--coefficient", f"{runs[1]}:h", "--bc", "neumann"]
    code, first = _poisson(tmp_path, *spec, name="two.h5")
    assert code == 0
    code, again = _poisson(tmp_path, "--config", str(first), name="two2.h5")
    assert code == 0
    one, two = _stored(first), _stored(again)
    assert one["frame"] != one["coefficient_frame"]
    assert {k for k in one if one[k] != two.get(k)} == {"output"}
    with xr.open_dataset(first) as a, xr.open_dataset(again) as b:
        np.testing.assert_array_equal(a["u"], b["u"])


def _write_f(path, f):
    with h5py.File(path, "w") as h:
        h["f"] = f


def test_the_written_residual_is_f_minus_a_u_of_the_written_u(tmp_path, capsys):
    """The file's `residual` is f − A u of its own u, sign included (an unconverged solve)."""
    one_cycle = ["--case", "dirichlet", "--n", "32", "--method", "multigrid"]
    code, out = _poisson(tmp_path, *one_cycle, "--max-iterations", "1")
    assert code == 1  # one V-cycle: a residual far from round-off, marked failed
    with xr.open_dataset(out) as ds:
        u, f, r = (np.asarray(ds[k]) for k in ("u", "f", "residual"))
        assert ds["residual"].attrs["long_name"] == "f - A u of the discrete problem"
    expected = f - _fd_laplacian(u, (1 / 32, 1 / 32), ("dirichlet", "dirichlet"))
    assert np.abs(expected).max() > 1e-6 * np.abs(f).max()
    np.testing.assert_allclose(r, expected, rtol=0, atol=1e-9 * np.abs(f).max())


def test_error_l2_is_the_rms_of_the_written_error(tmp_path):
    """`error_l2` and `error_max` are the RMS and max of the written `error`."""
    code, out = _poisson(tmp_path, "--case", "dirichlet", "--n", "16")
    assert code == 0
    with xr.open_dataset(out) as ds:
        err = np.asarray(ds["error"])
        assert ds.attrs["error_l2"] == pytest.approx(np.sqrt(np.mean(err**2)), rel=1e-12)
        assert ds.attrs["error_max"] == pytest.approx(np.abs(err).max(), rel=1e-12)


def test_a_dirichlet_problem_reports_no_mean_removed(tmp_path, capsys):
    """Only a singular problem reports a mean of f removed, in its file and closing line."""
    src = tmp_path / "in.h5"
    _write_f(src, 1.0 + np.random.default_rng(0).normal(size=(16, 16)))  # mean ~1
    code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "dirichlet")
    assert code == 0
    assert "removed" not in capsys.readouterr().out
    with xr.open_dataset(out) as ds:
        assert ds.attrs["rhs_mean_removed"] == 0.0
    # a periodic one does remove it, and says so
    code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "periodic", name="p2.h5")
    assert code == 0
    assert "removed)" in capsys.readouterr().out
    with xr.open_dataset(out) as ds, h5py.File(src, "r") as h:
        assert ds.attrs["rhs_mean_removed"] == pytest.approx(float(np.mean(h["f"][...])))


@pytest.mark.parametrize("case", ["dirichlet", "periodic-sines", "neumann"])
def test_3d_manufactured_cases_match_their_exact_solution(tmp_path, case):
    """3-D manufactured solves converge to their exact u at second order."""
    errors = []
    for n in (8, 16):
        code, out = _poisson(
            tmp_path, "--case", case, "--n", str(n), "--nz", str(n), name=f"{n}.h5"
        )
        assert code == 0
        with xr.open_dataset(out) as ds:
            assert ds["u"].dims == ("z", "y", "x")
            errors.append(float(ds.attrs["error_max"]))
    assert errors[1] < 0.05  # u_exact is O(1)
    assert abs(np.log2(errors[0] / errors[1]) - 2) <= 0.3, errors


def test_a_bc_other_than_the_cases_on_one_axis_drops_the_exact_solution(tmp_path):
    """A --bc unlike the case's on one axis: no exact solution or error is written."""
    code, out = _poisson(tmp_path, "--case", "dirichlet", "--n", "16", "--bc", "dirichlet,periodic")
    assert code == 0
    with xr.open_dataset(out) as ds:
        assert "u_exact" not in ds and "error" not in ds and "error_max" not in ds.attrs
        assert ds.attrs["case"] == "dirichlet right-hand side, bc dirichlet,periodic"


def test_nz_with_a_2d_rhs_is_refused(tmp_path, capsys):
    """--nz with a 2-D --rhs is refused, not ignored."""
    src = tmp_path / "in.h5"
    _write_f(src, np.zeros((8, 8)))
    code, out = _poisson(tmp_path, "--rhs", f"{src}:f", "--bc", "dirichlet", "--nz", "4")
    assert code == 2 and not out.exists()
    assert f"--nz given, but --rhs {src}:f is 2-D (shape (8, 8))" in capsys.readouterr().err


def test_variable_coefficient_case_with_rhs_needs_a_coefficient(tmp_path, capsys):
    """The variable-coefficient case with --rhs needs --coefficient."""
    src = tmp_path / "in.h5"
    _write_f(src, np.zeros((8, 8)))
    code, out = _poisson(tmp_path, "--case", "variable-coefficient", "--rhs", f"{src}:f")
    assert code == 2 and not out.exists()
    assert "with --rhs give the coefficient by --coefficient FILE:VARIABLE" in (
        capsys.readouterr().err
    )
