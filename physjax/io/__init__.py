"""NetCDF4/HDF5 output (h5netcdf) readable by h5py, xarray and netCDF tools."""

from ._netcdf import (
    STATUS_COMPLETE as STATUS_COMPLETE,
    STATUS_RUNNING as STATUS_RUNNING,
    NetCDFWriter as NetCDFWriter,
    Variable as Variable,
    check_writable as check_writable,
    read_attrs as read_attrs,
    read_frame as read_frame,
)
