"""Quick-look plots of physjax output files (matplotlib, Agg backend)."""

from __future__ import annotations

import os

import numpy as np


def _axes_km(ds, dims):
    ydim, xdim = dims
    return np.asarray(ds[xdim]) / 1e3, np.asarray(ds[ydim]) / 1e3


def plot_panels(path: str | os.PathLike, output: str | os.PathLike, frame: int = -1) -> str:
    """Plot the 2-D fields of one frame of a physjax file into a PNG; returns ``output``.

    Shallow-water files show the height anomaly ``h + b − mean`` [m] and the relative
    vorticity ζ [s⁻¹]; other files show up to three of their data variables.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import xarray as xr

    with xr.open_dataset(os.fspath(path), engine="h5netcdf") as ds:
        if "time" in ds.dims and ds.sizes["time"] == 0:
            raise ValueError(f"{os.fspath(path)!r} holds no frame to plot")
        sel = ds.isel(time=frame) if "time" in ds.dims else ds
        panels = []
        if "h" in sel and "zeta" in sel:
            eta = sel["h"] + (sel["bottom"] if "bottom" in sel else 0)
            anomaly = eta - float(eta.mean())
            panels.append((anomaly, "height anomaly", "m", "RdBu_r"))
            panels.append((sel["zeta"], "relative vorticity", "s$^{-1}$", "PuOr_r"))
        else:
            for name, var in sel.data_vars.items():
                if var.ndim == 2 and name != "grid":
                    panels.append(
                        (
                            var,
                            var.attrs.get("long_name", name),
                            var.attrs.get("units", ""),
                            "viridis",
                        )
                    )
                if len(panels) == 3:
                    break
        if not panels:
            raise ValueError(f"{os.fspath(path)!r} has no 2-D variable to plot")
        title_time = ""
        if "time" in sel.coords or "time" in sel:
            t = float(sel["time"])
            title_time = f", t = {t / 86400:.3g} days" if t >= 86400 else f", t = {t:.4g} s"
        fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
        for ax, (var, label, units, cmap) in zip(axes[0], panels):
            x, y = _axes_km(ds, var.dims[-2:])
            data = np.asarray(var, dtype=float)
            vmax = float(np.nanmax(np.abs(data))) or 1.0
            exponent = int(np.floor(np.log10(vmax)))
            if abs(exponent) >= 3:  # put the power of ten in the label, not over the bar
                data, vmax = data / 10.0**exponent, vmax / 10.0**exponent
                units = f"$10^{{{exponent}}}$ {units}"
            kwargs = {"vmin": -vmax, "vmax": vmax} if cmap != "viridis" else {}
            im = ax.pcolormesh(x, y, data, cmap=cmap, shading="auto", **kwargs)
            ax.set_aspect("equal")
            ax.set_xlabel("x [km]")
            ax.set_ylabel("y [km]")
            ax.set_title(label)
            fig.colorbar(im, ax=ax, shrink=0.85, label=f"{label} [{units}]")
        case = ds.attrs.get("case", "")
        fig.suptitle(f"physjax {case}{title_time}")
        fig.tight_layout()
        fig.savefig(os.fspath(output), dpi=110)
        plt.close(fig)
    return os.fspath(output)
