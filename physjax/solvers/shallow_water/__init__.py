"""Rotating nonlinear shallow-water equations on an Arakawa C-grid."""

from ._cases import CASES as CASES
from ._cases import Case as Case
from ._cases import make_case as make_case
from ._model import (
    ShallowWater as ShallowWater,
)
from ._model import (
    ShallowWaterSolution as ShallowWaterSolution,
)
from ._model import (
    ShallowWaterState as ShallowWaterState,
)
