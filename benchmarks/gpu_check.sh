#!/usr/bin/env bash
# GPU check for a lent accelerator machine: the shallow-water benchmark at 4096² float32
# (and 1024², 2048² beside it), reporting the fraction of the device's measured copy
# bandwidth reached (column %copy; target ≥ 40% at 4096²).
# Run from the repository root:  bash benchmarks/gpu_check.sh
# Writes $OUT (the device tool's folder) or benchmarks/results. SIZES overrides the sizes
# (a dry run on the CPU: SIZES="64 128" bash benchmarks/gpu_check.sh; without SIZES, a
# machine where jax finds no GPU stops the check at once, exit status 1); PYTHON the
# interpreter (default python3). physjax needs no install: the benchmark puts the
# repository on sys.path; it needs jax (with its CUDA plugin), equinox, jaxtyping, diffrax
# and numpy (not h5netcdf, xarray or matplotlib), checked first. It also writes the compiled
# step's HLO text at the largest size (hlo_N_float32.txt), for counting kernels and bytes.
#
# EXTRAS=1 adds, each under its own time limit and after the check: the README's default
# shallow-water job run on the device through scripts/run_shallow_water.py (needs h5netcdf,
# xarray, matplotlib and tqdm; its log and PNG), and the spectral table of
# benchmarks/poisson.py (physjax on the device against scipy.fft on the host's CPU).
# CARRY=1 (also run by EXTRAS=1) adds benchmarks/sw_padded_carry.py, the step with the
# state kept padded through the run, against the package's step at the last two of SIZES
# (the largest two in the default, ascending order; float32; kernel and copy counts, %copy;
# the compiled programs' text beside the others).
# h5netcdf is not on the lent machines: for EXTRAS=1 carry it as a wheel in .whl/ (see the
# device notes); the script installs .whl/*.whl into a temporary folder if h5netcdf is
# missing, and says so in cli_gpu.log if it is still missing.
# The device tool brings back at most 8 files from $OUT: with OUT set and more than 8 files
# there at the end (CARRY=1 or EXTRAS=1), all but the check's own three (gpu_env.log,
# shallow_water_gpu.json/.log) are packed into gpu_check_files.tar.gz.
# BUDGET (seconds, default 540) bounds the extra steps, so that the packing below runs before
# the device tool stops a command at 600 s: each extra step gets what is left of the budget
# after the main benchmark (at most its own limit), keeping 20 s for the packing. The main
# benchmark itself has no timeout of its own (stopped by the tool, it leaves its three files,
# which come back unpacked).
set -euo pipefail
start=$SECONDS
budget="${BUDGET:-540}"
left() {  # seconds for the next step: what the budget leaves, at most $1
    local l=$((budget - (SECONDS - start) - 20))
    if [ "$l" -gt "$1" ]; then l="$1"; fi
    if [ "$l" -lt 1 ]; then l=1; fi
    echo "$l"
}
out="${OUT:-benchmarks/results}"
py="${PYTHON:-python3}"
sizes="${SIZES:-1024 2048 4096}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# Without an accelerator jax falls back to the CPU (a jax without its CUDA plugin, or no GPU
# visible): the check stops here, rather than spend the device's time on the CPU benchmark
# and write its figures as the GPU's. Giving SIZES is the dry run, which runs on the CPU.
"$py" -c "
import sys, diffrax, equinox, jaxtyping, numpy, jax
print('jax', jax.__version__, jax.devices())
if jax.default_backend() == 'cpu' and not sys.argv[1]:
    sys.exit('gpu_check.sh: no GPU: jax runs on the CPU (no CUDA plugin installed, or no '
             'device visible); nothing measured. SIZES=\"64 128\" runs the dry run on the CPU')
" "${SIZES:-}" 2>&1 | tee "$out/gpu_env.log"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv \
    >> "$out/gpu_env.log" 2>&1 || true
# shellcheck disable=SC2086  # sizes is a list
"$py" benchmarks/shallow_water.py --sizes $sizes --dtypes float32 --no-numpy \
    --output "$out/shallow_water_gpu.json" --hlo "$out" 2>&1 | tee "$out/shallow_water_gpu.log"
if [ "${CARRY:-0}" = 1 ] || [ "${EXTRAS:-0}" = 1 ]; then
    set +e
    # shellcheck disable=SC2086  # sizes is a list
    timeout "$(left 300)" "$py" benchmarks/sw_padded_carry.py --sizes $(echo $sizes | tr ' ' '\n' | tail -2) \
        --dtype float32 --output "$out/sw_padded_carry_gpu.json" --hlo "$out" \
        > "$out/sw_padded_carry_gpu.log" 2>&1
    echo "padded carry rc=$?" >> "$out/sw_padded_carry_gpu.log"
    set -e
fi
if [ "${EXTRAS:-0}" = 1 ]; then
    set +e
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    work="$(mktemp -d)"
    {
        if ! "$py" -c "import h5netcdf" 2>/dev/null && compgen -G ".whl/*.whl" > /dev/null; then
            "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --target "$work/site" .whl/*.whl
            export PYTHONPATH="$work/site:$PYTHONPATH"
        fi
        "$py" -c "import h5netcdf" ||
            echo "h5netcdf missing: carry its wheel in .whl/ (the run below needs it)"
        time timeout "$(left 120)" "$py" scripts/run_shallow_water.py \
            --output "$work/sw.h5" --plot "$out/sw_gpu.png"
        echo "rc=$?"
        "$py" -c "import sys, xarray; print(xarray.open_dataset(sys.argv[1]))" "$work/sw.h5"
    } > "$out/cli_gpu.log" 2>&1
    rm -rf "$work"  # the run's sw.h5: its log and PNG are kept
    timeout "$(left 150)" "$py" benchmarks/poisson.py --only spectral --output "$out/poisson_gpu.json" \
        > "$out/poisson_gpu.log" 2>&1
    echo "poisson rc=$?" >> "$out/poisson_gpu.log"
    set -e
fi
if [ -n "${OUT:-}" ]; then
    # the device tool returns 8 files at most: pack the rest into one
    more=$(cd "$out" && find . -maxdepth 1 -type f ! -name gpu_env.log \
        ! -name shallow_water_gpu.json ! -name shallow_water_gpu.log -printf '%P\n' | sort)
    if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
        # shellcheck disable=SC2086  # a list of plain file names
        (cd "$out" && tar czf gpu_check_files.tar.gz $more && rm -f $more)
    fi
fi
