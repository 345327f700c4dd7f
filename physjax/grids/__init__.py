"""Structured grids, C-grid staggering, boundary conditions by halo filling, stencils."""

from ._grid import (
    AXIS_NAMES_2D as AXIS_NAMES_2D,
)
from ._grid import (
    AXIS_NAMES_3D as AXIS_NAMES_3D,
)
from ._grid import (
    CENTRE as CENTRE,
)
from ._grid import (
    CORNER as CORNER,
)
from ._grid import (
    X_FACE as X_FACE,
)
from ._grid import (
    Y_FACE as Y_FACE,
)
from ._grid import (
    Grid as Grid,
)
from ._grid import (
    Stagger as Stagger,
)
from ._halo import fill_halo as fill_halo
from ._halo import interior as interior
from ._stencils import (
    diff_x_c2f as diff_x_c2f,
)
from ._stencils import (
    diff_x_f2c as diff_x_f2c,
)
from ._stencils import (
    diff_y_c2f as diff_y_c2f,
)
from ._stencils import (
    diff_y_f2c as diff_y_f2c,
)
from ._stencils import (
    diff_z_c2f as diff_z_c2f,
)
from ._stencils import (
    diff_z_f2c as diff_z_f2c,
)
from ._stencils import (
    interp_x_c2f as interp_x_c2f,
)
from ._stencils import (
    interp_x_f2c as interp_x_f2c,
)
from ._stencils import (
    interp_y_c2f as interp_y_c2f,
)
from ._stencils import (
    interp_y_f2c as interp_y_f2c,
)
from ._stencils import (
    interp_z_c2f as interp_z_c2f,
)
from ._stencils import (
    interp_z_f2c as interp_z_f2c,
)
from ._stencils import (
    laplacian as laplacian,
)
