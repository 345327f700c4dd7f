"""NetCDF4/HDF5 output (h5netcdf) readable by h5py, xarray and netCDF tools."""

from ._netcdf import (
    STATUS_COMPLETE as STATUS_COMPLETE,
)
from ._netcdf import (
    STATUS_INTERRUPTED as STATUS_INTERRUPTED,
)
from ._netcdf import (
    STATUS_RUNNING as STATUS_RUNNING,
)
from ._netcdf import (
    STATUS_STOPPED as STATUS_STOPPED,
)
from ._netcdf import (
    NetCDFWriter as NetCDFWriter,
)
from ._netcdf import (
    OutputLocked as OutputLocked,
)
from ._netcdf import (
    OutputRemoved as OutputRemoved,
)
from ._netcdf import (
    OutputSpaceError as OutputSpaceError,
)
from ._netcdf import (
    Variable as Variable,
)
from ._netcdf import (
    check_writable as check_writable,
)
from ._netcdf import (
    output_lock as output_lock,
)
from ._netcdf import (
    read_attrs as read_attrs,
)
from ._netcdf import (
    read_frame as read_frame,
)
from ._netcdf import (
    read_static as read_static,
)
from ._reading import (
    read_retrying as read_retrying,
)
