#!/usr/bin/env bash
# The Dask scheduler and workers of `wikirag services` in the foreground: loopback, TLS with encryption
# required, certificates of one CA issued into $WIKIRAG_HOME/services/tls (keys 0600); ports
# WIKIRAG_DASK_PORT and WIKIRAG_DASK_DASHBOARD_PORT, WIKIRAG_DASK_WORKERS processes of one thread.
# Command lines: runtime/service_specs.py. Clients then set what this prints.
# On real machines run the workers' command (`python3 -m runtime.services argv dask-workers`) with the
# scheduler's address on each host instead; every worker needs wikirag installed (pip install -e .), the
# same environment (env.sh) and a copy of the cluster's certificate and key.
set -euo pipefail
source "$(dirname "$0")/env.sh"
workers=
python3 -m runtime.services run dask &
scheduler=$!
trap 'kill $scheduler $workers 2>/dev/null' EXIT
until python3 -m runtime.services health dask; do
  kill -0 $scheduler 2>/dev/null || { echo "dask-cluster.sh: the scheduler exited" >&2; exit 1; }
  sleep 1
done
python3 -m runtime.services run dask-workers &
workers=$!
python3 -m runtime.services env | grep DASK
wait
