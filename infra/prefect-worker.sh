#!/usr/bin/env bash
# Register the deployments of prefect.yaml and serve them from a process work pool, with the worker of
# `wikirag services` (runtime/service_specs.py) in the foreground.
# Needs PREFECT_API_URL and PREFECT_API_AUTH_STRING, and the credentials the flows use: AWS_ACCESS_KEY_ID /
# AWS_SECRET_ACCESS_KEY (the store), MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD. Addresses you
# export (WIKIRAG_STORE, AWS_ENDPOINT_URL, MLFLOW_TRACKING_URI, WIKIRAG_DASK_ADDRESS and Dask's client
# certificate, see dask-cluster.sh) win over those of the services on this machine.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$(dirname "$0")/.."
: "${PREFECT_API_URL:?set PREFECT_API_URL, e.g. http://127.0.0.1:4200/api}"
: "${PREFECT_API_AUTH_STRING:?set PREFECT_API_AUTH_STRING, the server's user:password}"
prefect work-pool inspect wikirag-process >/dev/null 2>&1 || prefect work-pool create wikirag-process --type process
prefect --no-prompt deploy --all
exec python3 -m runtime.services run worker
