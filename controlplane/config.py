"""The control plane's settings: one frozen object, read from ``STREAMPILOT_*`` at start-up.

This is the only module that reads the environment. Everything else receives a
:class:`Settings` (``create_app(settings)``, the CLI builds one from its options layered
over the environment). Values are validated when the object is built, so a bad
``STREAMPILOT_PORT`` fails at start-up with pydantic's message naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = ["DEFAULT_DATABASE_URL", "MIN_TOKEN_LENGTH", "Settings"]

DEFAULT_DATABASE_URL = "sqlite:///./streampilot.db"
MIN_TOKEN_LENGTH = 16  # a configured bearer token shorter than this is refused


class Settings(BaseSettings):
    """How the control plane runs. Environment: ``STREAMPILOT_<FIELD>`` (e.g.
    ``STREAMPILOT_DATABASE_URL``, ``STREAMPILOT_ADMIN_TOKEN``); constructor arguments win."""

    model_config = SettingsConfigDict(env_prefix="STREAMPILOT_", frozen=True, extra="ignore")

    database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///path.db or postgresql+psycopg://user@host/db",
    )
    host: str = Field("127.0.0.1", description="address the HTTP server binds")
    port: int = Field(8420, ge=0, le=65535, description="HTTP port (0: any free port)")
    local_workers: int = Field(2, ge=0, description="local worker processes started at start-up")
    workers_timeout_s: float = Field(
        30.0, gt=0, description="local workers register with the coordinator within this"
    )
    coordinator_host: str = Field("127.0.0.1", description="address workers dial")
    coordinator_port: int = Field(0, ge=0, le=65535, description="coordinator port (0: any)")
    cluster_secret: SecretStr | None = Field(
        None, description="secret workers present to the coordinator (random when unset)"
    )
    admin_token: SecretStr | None = Field(
        None, description="a bearer token with scope admin, registered at start-up"
    )
    precopy_min_bytes: int | None = Field(
        32 << 20,
        ge=0,
        description=(
            "a task copies the key groups it gives to another worker ahead, while it runs, "
            "when they come to at least this many bytes of state (none: never)"
        ),
    )
    precopy_pause_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description=(
            "the copying ahead stops once what is left would ship within this many ms of "
            "pause, at the pace of both ends measured while copying (0: copy everything ahead)"
        ),
    )
    stage_window: int = Field(
        1,
        ge=1,
        le=8,
        description=(
            "stages of a staged fluid change under way at once: 2 overlaps the next stage's "
            "barrier with the state transfer of the one before (sooner done when workers have "
            "CPU to spare, higher latency when they do not)"
        ),
    )
    hot_keys: bool = Field(
        True,
        description=(
            "keyed tasks sketch their heaviest keys from a sample of each input batch (the "
            "metrics' hot_keys, the hot-key split); false: they report key-group counts only"
        ),
    )
    data_dir: Path = Field(
        Path("./streampilot-data"),
        description=(
            "the server's data root: a job submitted with an operate token writes its output "
            "only under <data_dir>/jobs/<job key>/ (relative sink paths land there)"
        ),
    )
    checkpoint_interval_s: float = Field(
        10.0,
        ge=0,
        allow_inf_nan=False,
        description=(
            "a running job is checkpointed every this many seconds unless its submission "
            "says otherwise (0: jobs are not checkpointed unless they ask)"
        ),
    )
    checkpoint_timeout_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="a checkpoint not complete within this many seconds is abandoned",
    )
    checkpoints_retained: int = Field(
        3, ge=1, description="complete checkpoints kept per job (older ones are discarded)"
    )
    checkpoint_dir: str | None = Field(
        None,
        min_length=1,
        description=(
            "where checkpoints are written: a directory, or a pyarrow.fs URI such as "
            "s3://bucket/prefix?endpoint_override=host:9000 (unset: <data_dir>/checkpoints)"
        ),
    )
    restart_max_failures: int = Field(
        3,
        ge=0,
        description=(
            "a failed job recovers from its last complete checkpoint at most this many times "
            "within restart_window_s unless its submission says otherwise (0: it fails at "
            "its first failure)"
        ),
    )
    restart_window_s: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        description="the window, in seconds, over which a job's failures are counted",
    )
    restart_delay_s: float = Field(
        0.0,
        ge=0,
        allow_inf_nan=False,
        description="seconds a job waits after a failure before it recovers",
    )
    job_modules: list[str] = Field(
        default_factory=list,
        description=(
            'modules whose callables jobs and logic refs may name, as JSON: ["myjobs.etl"]; '
            "declared by the installation like the streampilot.jobs entry points"
        ),
    )
    max_workers: int = Field(
        16,
        ge=1,
        description=(
            "workers alive at once, server-wide: starting more (POST /workers, or a plan "
            'that places tasks on "new" workers) is refused'
        ),
    )
    operate_starts_workers: bool = Field(
        False,
        description=(
            'let operate tokens apply plans that start workers ("new"); otherwise such a '
            "plan needs an admin token"
        ),
    )
    max_request_bytes: int = Field(
        4 << 20,
        ge=64 << 10,
        description="largest request body accepted (413 beyond it, naming the limit)",
    )
    max_plan_ops: int = Field(
        1000, ge=1, description="operations in one plan at most (422 beyond it)"
    )
    tls_cert: Path | None = Field(
        None,
        description=(
            "PEM certificate (chain) for TLS on the coordinator's and the workers' data "
            "ports; with tls_key. Workers present it too"
        ),
    )
    tls_key: Path | None = Field(
        None, validate_default=True, description="PEM private key of tls_cert"
    )
    tls_ca: Path | None = Field(
        None,
        description=(
            "PEM CA bundle that peers' certificates must chain to: with it, TLS is mutual "
            "(every worker and the coordinator present a certificate it signed)"
        ),
    )
    sandbox_user: str = Field(
        "nobody",
        description=(
            "when the server runs as root, sandboxed processes (controllers, code checks, "
            "job builds) run as this user"
        ),
    )
    controller_max_processes: int = Field(
        16, ge=1, description="processes (and threads) a controller's sandbox may run at once"
    )
    controller_max_open_files: int = Field(
        256, ge=16, description="files a controller's process may hold open at once"
    )
    migrate_on_start: bool = Field(True, description="upgrade the database schema at start-up")
    log_level: str = Field("INFO", description="log level of the control plane")
    worker_log_level: str = Field("WARNING", description="log level of local workers")
    worker_reserve_mb: int = Field(
        0,
        ge=0,
        le=2016,  # what glibc can be told to keep (an int of bytes) less its mmap threshold
        description=(
            "heap memory (MiB) each worker faults in at start and keeps for state that comes "
            "later (a standby worker takes a task's state without faulting in its pages; "
            "costs that much resident memory per worker; glibc only; at most 2016)"
        ),
    )
    controller_memory_mb: int = Field(
        1024, ge=64, description="address-space limit of each controller's process"
    )
    controller_cpu_s: int = Field(
        600, ge=1, description="CPU seconds a controller's process may use before it is restarted"
    )
    controller_timeout_s: float = Field(
        10.0, gt=0, description="a controller's decide / on_start / on_result returns within this"
    )
    controller_max_failures: int = Field(
        3, ge=1, description="consecutive failures after which a controller is marked failed"
    )
    backend: Literal["local", "spark"] = Field(
        "local", description="what starts workers: local subprocesses, or Spark tasks"
    )
    spark_master: str = Field(
        "local[2]", description="Spark master URL (backend spark): local[N], spark://, yarn, k8s://"
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description='extra Spark configuration, as JSON: {"spark.executor.memory": "2g"}',
    )

    @field_validator("database_url")
    @classmethod
    def _parseable_url(cls, value: str) -> str:
        try:
            make_url(value)
        except ArgumentError as exc:
            raise ValueError(
                f"{exc}; expected e.g. sqlite:///./streampilot.db or "
                "postgresql+psycopg://user@127.0.0.1:5432/streampilot"
            ) from None
        return value

    @field_validator("precopy_min_bytes", mode="before")
    @classmethod
    def _never(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip().lower() == "none" else value

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"must be at least {MIN_TOKEN_LENGTH} characters long; e.g. "
                "python -c 'import secrets; print(\"sp_\" + secrets.token_urlsafe(32))'"
            )
        return value

    @field_validator("log_level", "worker_log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"{value!r} is not a log level (DEBUG, INFO, WARNING, ERROR)")
        return level

    @field_validator("tls_key")
    @classmethod
    def _key_with_cert(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if (value is None) != (info.data.get("tls_cert") is None):
            raise ValueError("tls_cert and tls_key go together: set both or neither")
        return value

    def checkpoint_location(self) -> str:
        """Where checkpoints go: ``checkpoint_dir`` as given when it is a URI
        (``scheme://...``), else that directory, or ``<data_dir>/checkpoints`` when unset,
        made absolute (workers do not share the server's working directory)."""
        if self.checkpoint_dir is not None and "://" in self.checkpoint_dir:
            return self.checkpoint_dir
        directory = (
            Path(self.checkpoint_dir) if self.checkpoint_dir else self.data_dir / "checkpoints"
        )
        return str(directory.resolve())

    def redacted_database_url(self) -> str:
        """The database URL with any password hidden, for logs and messages."""
        return make_url(self.database_url).render_as_string(hide_password=True)
