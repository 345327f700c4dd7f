"""Device meshes, sharding of grid fields and halo exchange under ``shard_map``."""

from ._halo import exchange_halo as exchange_halo
from ._mesh import (
    decompose as decompose,
    field_spec as field_spec,
    make_mesh as make_mesh,
    shard as shard,
    shard_map_fields as shard_map_fields,
)
