#!/usr/bin/env bash
# GPU check for a lent accelerator machine: the shallow-water benchmark at 4096² float32,
# reporting the fraction of the device's measured copy bandwidth (target ≥ 40%).
# Run from the repository root:  bash benchmarks/gpu_check.sh  (writes $OUT or benchmarks/results)
set -euo pipefail
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python -c "import jax; print(jax.__version__, jax.devices())"
python benchmarks/shallow_water.py --sizes 1024 2048 4096 --dtypes float32 --no-numpy \
    --output "$out/shallow_water_gpu.json" 2>&1 | tee "$out/shallow_water_gpu.log"
