#!/usr/bin/env bash
# A persistent Prefect server on loopback (UI at http://127.0.0.1:4200), state in $WIKIRAG_HOME/prefect,
# every API call but the health probe refused without PREFECT_API_AUTH_STRING (user:password).
# Then: export PREFECT_API_URL=http://127.0.0.1:4200/api  (wikirag commands stop starting their own;
# they and the workers send the same PREFECT_API_AUTH_STRING).
set -euo pipefail
source "$(dirname "$0")/env.sh"
: "${PREFECT_API_AUTH_STRING:?set PREFECT_API_AUTH_STRING=user:password}"
export PREFECT_HOME=${PREFECT_HOME:-$WIKIRAG_HOME/prefect}
PREFECT_SERVER_API_AUTH_STRING=$PREFECT_API_AUTH_STRING exec prefect server start --host 127.0.0.1 \
  --port "${PREFECT_PORT:-4200}"
