"""Structured grids, C-grid staggering, boundary conditions by halo filling, stencils."""

from ._grid import (
    AXIS_NAMES_2D as AXIS_NAMES_2D,
    AXIS_NAMES_3D as AXIS_NAMES_3D,
    CENTRE as CENTRE,
    CORNER as CORNER,
    X_FACE as X_FACE,
    Y_FACE as Y_FACE,
    Grid as Grid,
    Stagger as Stagger,
)
from ._halo import fill_halo as fill_halo, interior as interior
from ._stencils import (
    diff_x_c2f as diff_x_c2f,
    diff_x_f2c as diff_x_f2c,
    diff_y_c2f as diff_y_c2f,
    diff_y_f2c as diff_y_f2c,
    diff_z_c2f as diff_z_c2f,
    diff_z_f2c as diff_z_f2c,
    interp_x_c2f as interp_x_c2f,
    interp_x_f2c as interp_x_f2c,
    interp_y_c2f as interp_y_c2f,
    interp_y_f2c as interp_y_f2c,
    interp_z_c2f as interp_z_c2f,
    interp_z_f2c as interp_z_f2c,
    laplacian as laplacian,
)
