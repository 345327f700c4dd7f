"""Rotating nonlinear shallow-water equations on an Arakawa C-grid."""

from ._cases import CASES as CASES, Case as Case, make_case as make_case
from ._model import (
    ShallowWater as ShallowWater,
    ShallowWaterSolution as ShallowWaterSolution,
    ShallowWaterState as ShallowWaterState,
)
