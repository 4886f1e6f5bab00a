#!/usr/bin/env bash
# One lease of a CUDA GPU: the microbenchmark's CUDA grid (its llama bench models with decode as CUDA-graph
# replays, then the whole default grid), three catalog models at their real shapes (random weights), and the
# catalog grid timed eager, each predicted on the catalog GPU entry as shipped. Writes OUT/results.tgz (one folder per run: report.md, points.json, plot.png, calibration.yaml,
# hardware.yaml, its log) after every run, so a run cut short still returns what finished before it.
#
#   bash bench/gpu_validation.sh OUT_DIR [GPU_ID]      # GPU_ID: the catalog entry to compare with (h200-sxm)
#
# Needs torch with CUDA, transformers and matplotlib; pydantic (and its companions) may come as wheels in .whl/.
set -uo pipefail
out=${1:?usage: bash bench/gpu_validation.sh OUT_DIR [GPU_ID]}
gpu=${2:-h200-sxm}
work=$(mktemp -d)
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 3; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
query=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.used
{ date -u; nvidia-smi; nvidia-smi --query-gpu=$query --format=csv; } >"$work/gpu-before.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, torch.cuda.get_device_name(0))" | tee "$work/versions.txt"

pack() { nvidia-smi --query-gpu=$query --format=csv >"$work/gpu-after.txt" 2>&1; tar czf "$out/results.tgz" -C "$work" .; }

steps=" ${STEPS:-bench-graphs bench catalog catalog-eager} "  # STEPS="bench catalog": a subset
step() {  # step NAME LIMIT_S ARGS...: one microbenchmark run into $work/NAME, its log beside it
  local name=$1 limit=$2; shift 2
  [[ $steps == *" $name "* ]] || return 0
  echo "== $name: $* (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" python3 -m calculator.microbench --device cuda --gpu "$gpu" --out "$work/$name" "$@" \
    >"$work/$name.log" 2>&1
  echo "rc $? after $((SECONDS - t0)) s"
  tail -n 14 "$work/$name.log"
  pack
}

step bench-graphs 150 --models bench-llama-1b,bench-llama-3b  # the llama bench models: decode as graph replays
step bench 200  # the default grid: its sliding-window model's decode cannot be captured, so all decode runs eager
step catalog 200 --models llama-3.1-8b,qwen2.5-7b,llama-2-13b
step catalog-eager 100 --models llama-3.1-8b --no-cuda-graphs
ls -la "$out"
