"""Settings, read from the environment once, at the edge (CLI and flow entry points).

Every variable has the ``WIKIRAG_`` prefix except the standard ones other
tools already use (``AWS_*``, ``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``).
``rag_core`` never reads the environment: values travel as arguments.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# Telemetry off everywhere, and no hub: set before prefect, mlflow or
# transformers are imported, and inherited by Dask workers and subprocesses.
QUIET_ENVIRONMENT = {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "AWS_EC2_METADATA_DISABLED": "true",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    # A bar per model load from every worker says nothing; shards log their own progress.
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    # Dask's per-connection INFO lines drown the run's own; warnings still show.
    "DASK_LOGGING__DISTRIBUTED": "warning",
}


def quiet_environment() -> None:
    """Switch telemetry off for this process and every process it starts."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


class Settings(BaseSettings):
    """wikirag's settings; see docs/operations.md for each variable."""

    model_config = SettingsConfigDict(env_prefix="WIKIRAG_", extra="ignore")

    home: Path = Field(Path.home() / ".wikirag", description="workspace: store, Prefect and MLflow state, samples")
    store: str | None = Field(None, description="store URL (path, file://, s3://bucket/prefix); default <home>/store")
    dask_address: str | None = Field(None, description="scheduler of an existing Dask cluster; default a local one")
    workers: int = Field(max(1, os.cpu_count() or 1), ge=1, description="workers of the local Dask cluster")

    # The standard AWS variables, read without the prefix.
    aws_access_key_id: str | None = Field(None, validation_alias="AWS_ACCESS_KEY_ID")
    aws_secret_access_key: SecretStr | None = Field(None, validation_alias="AWS_SECRET_ACCESS_KEY")
    aws_endpoint_url: str | None = Field(None, validation_alias="AWS_ENDPOINT_URL")
    aws_region: str | None = Field(None, validation_alias="AWS_DEFAULT_REGION")
    mlflow_tracking_uri: str | None = Field(None, validation_alias="MLFLOW_TRACKING_URI")
    prefect_api_url: str | None = Field(None, validation_alias="PREFECT_API_URL")

    @property
    def store_url(self) -> str:
        return self.store or str(self.home / "store")

    @property
    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.home / 'mlflow.db'}"

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    def storage_options(self, url: str | None = None) -> dict[str, Any]:
        """fsspec options for ``url`` (the store by default): credentials for s3://, nothing otherwise."""
        url = url or self.store_url
        if not url.startswith(("s3://", "s3a://")):
            return {}
        options: dict[str, Any] = {
            # Fail in seconds, not minutes, when the endpoint is down.
            "config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}},
        }
        if self.aws_access_key_id:
            options["key"] = self.aws_access_key_id
        if self.aws_secret_access_key:
            options["secret"] = self.aws_secret_access_key.get_secret_value()
        if self.aws_endpoint_url:
            options["endpoint_url"] = self.aws_endpoint_url
        if self.aws_region:
            options["client_kwargs"] = {"region_name": self.aws_region}
        return options
