#!/usr/bin/env bash
# Everything measured on a GPU, in one call of the device tool (a lease is short):
#   bash bench/gpu.sh [PHASE ...]      phases: env eager eager-profile compiled graphs compiled-peers
#                                      pure autotune memory epoch tests lab
#                                      (default: env eager compiled memory epoch)
# Needs torch, timm and torchvision (the device image has them; foodvit runs from src/). Logs and
# JSON go to $OUT (the device tool's folder that comes back), else to /tmp/foodvit-gpu.
# Epoch phase: FoodVision Mini at $FOODVIT_GPU_DATA (default .gpudata/pizza_steak_sushi, a copy
# carried with the call; never committed).
set -uo pipefail
out=${OUT:-/tmp/foodvit-gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
data=${FOODVIT_GPU_DATA:-.gpudata/pizza_steak_sushi}
phases=${*:-env eager compiled memory epoch}
tp="$py -m bench.speed.throughput --device cuda --dtype bf16"
for phase in $phases; do
  echo "=== $phase ($(date -u +%H:%M:%S))"
  case $phase in
    env) nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
         $py -c "import torch, timm, torchvision; print('torch', torch.__version__, 'timm', timm.__version__, 'torchvision', torchvision.__version__)";;
    eager) $tp --models ViT-B/16 ViT-Ti/16 --batch-sizes 64 256 --rounds 5 --iters 5 --check --json "$out/eager.json";;
    compiled) $tp --models ViT-B/16 --batch-sizes 256 512 --rounds 5 --iters 5 --compile foodvit --profile --json "$out/compiled.json";;
    graphs) $tp --models ViT-B/16 --batch-sizes 256 --rounds 5 --iters 5 --compile foodvit --compile-mode reduce-overhead --profile --json "$out/graphs.json";;
    pure) $py -m bench.speed.throughput --device cuda --dtype bf16-pure --models ViT-B/16 --modes infer --batch-sizes 256 1024 --rounds 5 --iters 5 --check --compile foodvit timm --profile --json "$out/pure.json";;
    eager-profile) $tp --models ViT-B/16 --batch-sizes 256 --rounds 3 --iters 5 --profile --json "$out/eager_profile.json";;
    tests) FOODVIT_DATA=$PWD/$data timeout 300 $py -m pytest -q -n 8 -p no:cacheprovider -p no:benchmark;;
    autotune) $tp --models ViT-B/16 --modes infer --batch-sizes 256 --rounds 5 --iters 5 --compile foodvit --compile-mode max-autotune-no-cudagraphs --profile --json "$out/autotune.json";;
    compiled-peers) $tp --models ViT-B/16 --batch-sizes 256 --rounds 5 --iters 5 --compile foodvit timm --json "$out/compiled_peers.json";;
    memory) $tp --models ViT-B/16 ViT-Ti/16 --modes train --batch-sizes 64 --rounds 1 --iters 1 --warmup 1 --memory --json "$out/memory.json";;
    epoch) $py -m bench.speed.epoch --recipes tiny default --data "$data" --rounds 3 --workers 0 4 8;;
    # the recipe laboratory (bench/accuracy/lab.py): the variants of $LAB_VARIANTS (default bench/gpu-variants.txt) under
    # 5-fold CV on seeds 0-2, fold runs from one queue in 14 processes, nothing started after LAB_LAUNCH_FOR s, all
    # stopped at LAB_STOP_AT s
    lab) variants=()
         while IFS= read -r line; do
           [[ -z $line || $line == \#* ]] || variants+=(--variant "$line")
         done < "${LAB_VARIANTS:-bench/gpu-variants.txt}"
         $py -m bench.accuracy.lab --data "$data" --out /tmp/foodvit-lab --processes 14 --seeds 0 1 2 --pack "$out/lab.tar.gz" \
           --launch-for "${LAB_LAUNCH_FOR:-380}" --stop-at "${LAB_STOP_AT:-520}" "${variants[@]}" -- --no-amp;;
    *) echo "unknown phase $phase"; exit 2;;
  esac
done 2>&1 | tee -a "$out/log.txt"
