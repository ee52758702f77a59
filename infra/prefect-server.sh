#!/usr/bin/env bash
# The Prefect server of `wikirag services` in the foreground: loopback, UI at http://127.0.0.1:4200
# (WIKIRAG_PREFECT_PORT), state in $WIKIRAG_HOME/prefect, every API call but the health probe refused
# without PREFECT_API_AUTH_STRING (user:password). Its command line is defined once, in
# runtime/service_specs.py (`python3 -m runtime.services argv prefect` prints it).
# Then: export PREFECT_API_URL=http://127.0.0.1:4200/api  (wikirag commands stop starting their own;
# they and the workers send the same PREFECT_API_AUTH_STRING).
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec python3 -m runtime.services run prefect
