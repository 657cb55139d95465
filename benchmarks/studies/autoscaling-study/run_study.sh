#!/usr/bin/env bash
# The autoscaling study (docs/studies/autoscaling.md): the diurnal day of scenario.yaml on a fixed peak fleet, under
# Kubernetes' HPA and under Dynamo's SLA Planner, each with four routers; then the HPA settings tried. Each run is one
# `kvsim run` as a user would type it (printed as it starts); tables.py reads their outputs into results.csv and draws
# the figures.
#
#   benchmarks/studies/autoscaling-study/run_study.sh            # from the repository root; JOBS=2 runs at a time
#   KVSIM=path/to/kvsim JOBS=1 benchmarks/studies/autoscaling-study/run_study.sh
#
# A run takes 30-200 s on one core (57,308 requests; 31 s for hpa-kvsim after the engine speed-ups of f3dec8e).
# A run whose runs/NAME/summary.csv exists is skipped: delete runs/NAME to redo it.
set -euo pipefail
here=benchmarks/studies/autoscaling-study
kvsim=${KVSIM:-.venv/bin/kvsim}
runs=$here/runs

if [[ ${1:-} == --one ]]; then   # one run: --one NAME FLAGS
  name=$2; flags=$3
  echo "kvsim run $here/scenario.yaml $flags --out $runs/$name"
  # shellcheck disable=SC2086
  "$kvsim" run "$here/scenario.yaml" $flags --out "$runs/$name" --format csv > /dev/null 2> "$runs/$name.err" \
    || { cat "$runs/$name.err" >&2; exit 255; }
  rm -f "$runs/$name.err"
  exit 0
fi

peak=7                               # the fixed peak fleet: the fewest L4s at which random routing meets the SLO for
                                     # 99 % of requests at the peak rate (14.4 req/s held for 15 min; README)
elastic="--min-workers 1 --max-workers $peak"
hpa="hpa:metric=in_flight,target=2"   # README: HPA settings tried (target 1 and 3, TTFT p90)
planner="planner:worker_rps=3.668"   # kvsim's worker profile of scenario.yaml (README): one L4 meets the SLO to 3.668 req/s
mkdir -p "$runs"
{
  for router in random prefix-hash kv-aware kvsim; do
    echo "fixed-$router|--workers $peak --router $router"
    echo "hpa-$router|--router $router --autoscaler $hpa $elastic"
    echo "planner-$router|--router $router --autoscaler $planner $elastic"
  done
  # Other HPA settings (README: HPA settings tried), with the routers at both ends of the hit-rate range
  for router in random kvsim; do
    echo "hpa-target1-$router|--router $router --autoscaler hpa:metric=in_flight,target=1 $elastic"
    echo "hpa-target3-$router|--router $router --autoscaler hpa:metric=in_flight,target=3 $elastic"
    echo "hpa-ttft-$router|--router $router --autoscaler hpa:metric=ttft_p90_ms,target=250 $elastic"
  done
  # The Planner with the worker profiled at 99 % attainment instead of 95 % (README)
  for router in random kvsim; do
    echo "planner-rps2.7-$router|--router $router --autoscaler planner:worker_rps=2.709 $elastic"
  done
} | while IFS='|' read -r name flags; do
  [[ -f $runs/$name/summary.csv ]] || printf '%s\0%s\0' "$name" "$flags"
done | xargs -0 -n 2 -P "${JOBS:-2}" "$0" --one

"$(dirname "$kvsim")/python" "$here/tables.py"
