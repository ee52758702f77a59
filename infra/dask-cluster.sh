#!/usr/bin/env bash
# A Dask scheduler and workers on loopback over TLS, encryption required; certificates of one CA
# issued into $WIKIRAG_HOME/dask-tls (keys 0600). Clients then set what this prints.
# On real machines run `dask worker tls://SCHEDULER:8786` with the same --tls-* options on each host
# instead of the local line below; every worker needs wikirag installed (pip install -e .), the same
# environment (env.sh) and a copy of the cluster's certificate and key.
set -euo pipefail
source "$(dirname "$0")/env.sh"
tls=${DASK_TLS_DIR:-$WIKIRAG_HOME/dask-tls}
python3 -m runtime.services tls "$tls"
export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
options=(--tls-ca-file "$tls/ca.pem" --tls-cert "$tls/cluster.pem" --tls-key "$tls/cluster-key.pem")
dask scheduler --host 127.0.0.1 --port 8786 --protocol tls "${options[@]}" --dashboard-address 127.0.0.1:8787 &
scheduler=$!
trap 'kill $scheduler $workers 2>/dev/null' EXIT
sleep 3
dask worker tls://127.0.0.1:8786 --host 127.0.0.1 --protocol tls "${options[@]}" \
  --nworkers "${WORKERS:-$(nproc)}" --nthreads 1 --dashboard-address 127.0.0.1:0 &
workers=$!
cat <<EXPORTS
export WIKIRAG_DASK_ADDRESS=tls://127.0.0.1:8786
export DASK_DISTRIBUTED__COMM__TLS__CA_FILE=$tls/ca.pem
export DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=$tls/client.pem
export DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=$tls/client-key.pem
EXPORTS
wait
