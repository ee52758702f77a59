#!/usr/bin/env bash
# A Dask scheduler and workers on loopback; then WIKIRAG_DASK_ADDRESS=tcp://127.0.0.1:8786.
# On real machines run `dask worker tcp://SCHEDULER:8786` on each host instead of the local line below;
# every worker needs wikirag installed (pip install -e .) and the same environment (env.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
dask scheduler --host 127.0.0.1 --port 8786 --dashboard-address 127.0.0.1:8787 &
scheduler=$!
trap 'kill $scheduler $workers 2>/dev/null' EXIT
sleep 3
dask worker tcp://127.0.0.1:8786 --host 127.0.0.1 --nworkers "${WORKERS:-$(nproc)}" --nthreads 1 \
  --dashboard-address 127.0.0.1:0 &
workers=$!
wait
