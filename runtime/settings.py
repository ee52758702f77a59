"""Settings, read from the environment once, at the edge (the CLI, the deployments' entry flows).

Every variable has the ``WIKIRAG_`` prefix except the standard ones other
tools already use (``AWS_*``, ``MLFLOW_TRACKING_URI``, ``PREFECT_API_URL``).
Nothing below the edge reads the environment: flows get a :class:`StoreAccess`
(the store URL and the S3 options, credentials kept secret in the run's
recorded parameters), tasks and ``rag_core`` get a ``Store``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, Secret, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rag_core.errors import StoreError
from rag_core.leases import DEFAULT_TTL_S
from rag_core.storage import Store, retry_window_s as storage_retry_window_s

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
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # Dask's per-connection INFO lines drown the run's own; warnings still show.
    "DASK_LOGGING__DISTRIBUTED": "warning",
}


def quiet_environment() -> None:
    """Switch telemetry off for this process and every process it starts."""
    for key, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


# A store that is down for a few seconds (a restart, a failover) is ridden through; one that stays down ends the
# command with one line within a bounded time. See docs/operations.md, "Storage outage", for the figures.
STORE_RETRIES = 7
# a rerun waits up to 6 hours for another run's lease (tasks.leases.WAIT_S); a longer ttl would outlast that wait
LEASE_TTL_MAX_S = 6 * 3600.0
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 30  # silence on an open connection; a frozen server costs this much per attempt


def s3_config(retries: int = STORE_RETRIES) -> dict[str, Any]:
    """botocore's client settings for the store: ``retries`` retries in its "standard" mode.

    Standard mode retries connection errors (refused, reset, timed out), HTTP 500/502/503/504, throttling
    and RequestTimeout, sleeping ``random(0, 1) * min(2 ** (i - 1), 20)`` seconds before retry ``i``
    (exponential backoff with full jitter): for 7 retries at most 1 + 2 + 4 + 8 + 16 + 20 + 20 = 71 s in
    all, 35.5 s on average, and 5 s or less about twice in 100,000 requests (so an outage of a few seconds
    is ridden through). A client also stops retrying once its retry quota (500 tokens, 5 a retry, 10 a
    timeout) is spent.
    """
    return {"connect_timeout": S3_CONNECT_TIMEOUT_S, "read_timeout": S3_READ_TIMEOUT_S,
            "retries": {"mode": "standard", "total_max_attempts": retries + 1}}


def retry_window_s(retries: int = STORE_RETRIES) -> float:
    """The longest botocore sleeps between the attempts of one request: the backoff's worst case."""
    return storage_retry_window_s(retries)


def is_s3(url: str) -> bool:
    return url.startswith(("s3://", "s3a://"))


class StoreAccess(BaseModel):
    """Where the store is and how to reach S3: what a flow needs from the settings, passed as its parameter.

    A plain string is a store URL with no S3 options (a local folder, or S3
    with credentials from boto's own sources) and the default lease ttl. Prefect records ``s3_options``
    as ``**********``: credentials never reach the run's stored parameters.
    """

    url: str = Field(description="store URL: a path, file://..., or s3://bucket/prefix")
    s3_options: Secret[dict[str, Any]] = Field(default_factory=lambda: Secret({}),
                                               description="fsspec options for every s3:// URL (credentials, endpoint)")
    lease_ttl_s: float = Field(DEFAULT_TTL_S, ge=5, le=LEASE_TTL_MAX_S,
                               description="ttl written into the build leases a flow takes on this store")

    @model_validator(mode="before")
    @classmethod
    def _from_url(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value

    def options(self, url: str | None = None) -> dict[str, Any]:
        """fsspec options for ``url`` (the store by default): the S3 options for s3://, nothing otherwise."""
        return dict(self.s3_options.get_secret_value()) if is_s3(url or self.url) else {}

    def store(self) -> Store:
        return Store(self.url, self.options())


class Switches(BaseSettings):
    """The performance machinery's two off switches (``off``/``false``/``0``); read by every wikirag process at its
    start (runtime.process_tuning.start_process), Dask workers and training ranks included."""

    model_config = SettingsConfigDict(env_prefix="WIKIRAG_", extra="ignore")

    perf: bool = Field(True, description="precision, probes and the int8 engine (rag_core.perf); off = dtype and "
                                         "engine auto mean float32 and torch, and no timed probe runs")
    process_tuning: bool = Field(True, description="glibc malloc thresholds, gc.freeze before exit, Dask's quiet "
                                                   "background sampling, the Prefect database template "
                                                   "(runtime.process_tuning); off = the libraries' defaults")


class Settings(Switches):
    """wikirag's settings; see docs/operations.md for each variable."""

    model_config = SettingsConfigDict(env_prefix="WIKIRAG_", extra="ignore")

    home: Path = Field(Path.home() / ".wikirag", description="workspace: store, Prefect and MLflow state, samples")
    store: str | None = Field(None, description="store URL (path, file://, s3://bucket/prefix); default <home>/store")
    dask_address: str | None = Field(None, description="scheduler of an existing Dask cluster; default a local one")
    workers: int = Field(max(1, os.cpu_count() or 1), ge=1, description="workers of the local Dask cluster")
    store_retries: int = Field(STORE_RETRIES, ge=0, le=10,
                               description="retries of a failed S3 request (timeouts, 5xx, throttling, connection "
                                           "refused or reset), with exponential backoff and jitter")
    lease_ttl_s: float = Field(DEFAULT_TTL_S, ge=5, le=LEASE_TTL_MAX_S,
                               description="ttl written into each build lease this process takes: seconds after the "
                                           "lease's last heartbeat (one every ttl/4) before another run may take it "
                                           "over, which a rerun after a killed build waits. Keep it above the store's "
                                           "retry window (71 s at 7 retries): a heartbeat that rides out a longer "
                                           "store outage would find its lease taken")

    # The standard AWS variables, read without the prefix.
    aws_access_key_id: str | None = Field(None, validation_alias="AWS_ACCESS_KEY_ID")
    aws_secret_access_key: SecretStr | None = Field(None, validation_alias="AWS_SECRET_ACCESS_KEY")
    aws_endpoint_url: str | None = Field(None, validation_alias="AWS_ENDPOINT_URL")
    aws_region: str | None = Field(None, validation_alias="AWS_DEFAULT_REGION")
    mlflow_tracking_uri: str | None = Field(None, validation_alias="MLFLOW_TRACKING_URI")
    prefect_api_url: str | None = Field(None, validation_alias="PREFECT_API_URL")

    @model_validator(mode="after")
    def _folders_are_folders(self) -> Settings:
        # Raised as is (not a ValueError): one line naming the path, not "no index has been published here".
        places = (("the workspace (--home, WIKIRAG_HOME)", str(self.home)),
                  ("the store (--store, WIKIRAG_STORE)", self.store_url))
        for what, path in places:
            local = path.removeprefix("file://")
            if "://" not in local and Path(local).expanduser().is_file():
                raise StoreError(f"{path}: a file, not a folder; point {what} at a folder (new or existing)")
        return self

    @property
    def store_url(self) -> str:
        return self.store or str(self.home / "store")

    @property
    def tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.home / 'mlflow.db'}"

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    def store_access(self, url: str | None = None) -> StoreAccess:
        """The store (``url``, default the configured one) with this environment's S3 options, for a flow."""
        return StoreAccess(url=url or self.store_url, s3_options=Secret(self.s3_options()),
                           lease_ttl_s=self.lease_ttl_s)

    def open_store(self, url: str | None = None) -> Store:
        """The store (``url``, default the configured one), ready for ``rag_core`` calls."""
        return self.store_access(url).store()

    def storage_options(self, url: str | None = None) -> dict[str, Any]:
        """fsspec options for ``url`` (the store by default): credentials for s3://, nothing otherwise."""
        return self.s3_options() if is_s3(url or self.store_url) else {}

    def s3_options(self) -> dict[str, Any]:
        """fsspec options for s3:// URLs: credentials, endpoint and region from the environment."""
        options: dict[str, Any] = {"config_kwargs": s3_config(self.store_retries)}
        if self.aws_access_key_id:
            options["key"] = self.aws_access_key_id
        if self.aws_secret_access_key:
            options["secret"] = self.aws_secret_access_key.get_secret_value()
        if self.aws_endpoint_url:
            options["endpoint_url"] = self.aws_endpoint_url
        if self.aws_region:
            options["client_kwargs"] = {"region_name": self.aws_region}
        return options
