#!/usr/bin/env bash
# A persistent Prefect server on loopback (UI at http://127.0.0.1:4200), state in $WIKIRAG_HOME/prefect.
# Then: export PREFECT_API_URL=http://127.0.0.1:4200/api  (wikirag commands stop starting their own).
set -euo pipefail
source "$(dirname "$0")/env.sh"
export PREFECT_HOME=${PREFECT_HOME:-$WIKIRAG_HOME/prefect}
exec prefect server start --host 127.0.0.1 --port "${PREFECT_PORT:-4200}"
