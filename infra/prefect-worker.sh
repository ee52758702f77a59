#!/usr/bin/env bash
# Register the deployments of prefect.yaml and serve them from a process work pool.
# Needs PREFECT_API_URL and PREFECT_API_AUTH_STRING; the worker's environment carries WIKIRAG_STORE, AWS_*,
# MLFLOW_TRACKING_URI/USERNAME/PASSWORD, WIKIRAG_DASK_ADDRESS and Dask's client certificate (dask-cluster.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$(dirname "$0")/.."
: "${PREFECT_API_URL:?set PREFECT_API_URL, e.g. http://127.0.0.1:4200/api}"
: "${PREFECT_API_AUTH_STRING:?set PREFECT_API_AUTH_STRING, the server's user:password}"
export WIKIRAG_REPO=${WIKIRAG_REPO:-$PWD}
prefect work-pool inspect wikirag-process >/dev/null 2>&1 || prefect work-pool create wikirag-process --type process
prefect --no-prompt deploy --all
exec prefect worker start --pool wikirag-process
