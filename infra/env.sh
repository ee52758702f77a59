# Source this before starting any engine by hand: telemetry off, loopback only.
export DO_NOT_TRACK=true
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
export AWS_EC2_METADATA_DISABLED=true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export DASK_LOGGING__DISTRIBUTED=warning
# Dask workers keep glibc's adaptive malloc thresholds (runtime/local_cluster.py: ~20% faster encoding)
export DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON="{'MALLOC_TRIM_THRESHOLD_': None}"
export WIKIRAG_HOME=${WIKIRAG_HOME:-$HOME/.wikirag}
