"""Deployment settings, all from BATCHPLAN_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.contract.model_registry import EXAMPLE_MODELS, parse_models
from app.contract.targets import missing_module


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BATCHPLAN_", extra="ignore")

    host: str = Field("127.0.0.1", description="Address `batchplan serve` binds.")
    port: int = Field(8000, ge=1, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "console"
    api_key: SecretStr | None = Field(None, description="When set, /v1/checks* require it.")
    protect_planner: bool = Field(False, description="Also require the API key on /v1/plans*.")
    cors_origins: list[str] = Field(default_factory=list)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    plan_fast_path: bool = Field(
        True,
        description="Answer valid POST /v1/plans bodies in pure ASGI before FastAPI's routing "
        "(app.api.plan_fast_path): the same bytes for less server time. false: every "
        "request takes the FastAPI route.",
    )
    gc_freeze: bool = Field(
        True,
        description="Move everything built at startup out of the garbage collector's way "
        "(gc.freeze), so that large plans do not pay for walking the app's own objects.",
    )

    # The worker (gradient checks).
    jobs_db: Path = Field(Path("batchplan-jobs.sqlite3"), description="SQLite job database.")
    worker_enabled: bool = Field(True, description="Start warm rank processes at startup.")
    processes_per_host: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto",
        description="Warm rank processes: `auto` is one per GPU this process sees "
        "(app.worker.service.limits.visible_gpus), or 4 on a host without GPUs.",
    )
    max_replicas_per_check: int = Field(
        131_072,
        ge=1,
        description="Largest data-parallel size a check runs; more get 422. A check of the built-in model "
        "runs one backward per replica group beyond 64 replicas a process: 100,000 replicas in seconds.",
    )
    queue_size: int = Field(16, ge=1, description="Checks that may wait; more get 429.")
    check_timeout_s: float = Field(120.0, gt=0, le=3600)
    concurrent_checks: int = Field(1, ge=1, le=8)
    max_check_samples: int = Field(
        1 << 20,
        ge=1,
        description="Largest global batch a check holds in memory; more get 422. A dataset is only "
        "indexed: unshuffled, any size checks; shuffled, up to max_shuffled_samples.",
    )
    max_shuffled_samples: int = Field(
        1 << 26,
        ge=1,
        description="Largest shuffled dataset a check takes: each rank holds its torch.randperm, "
        "8 bytes a sample; more get 422. Unshuffled datasets have no limit.",
    )
    rendezvous_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts a multi-node check may rendezvous at; empty: this host and loopback.",
    )
    check_models: str | None = Field(
        EXAMPLE_MODELS,
        description="Operator check models, `name=package.module:factory` separated by commas; "
        "requests pick one by name. The default registers the example `mlp`; empty registers none.",
    )

    @field_validator("check_models")
    @classmethod
    def _models_parse(cls, value: str | None) -> str | None:
        parse_models(value or "")  # a bad entry stops the server at startup, naming it
        return value

    @model_validator(mode="after")
    def _models_are_here(self) -> Settings:
        """A registered factory whose module is not installed stops start-up, naming it: a
        server that started would look ready and fail every check of that model. Found without
        importing anything (no torch, none of the operator's code); a factory that is there
        but fails is found by the ranks' probe (GET /v1/check-models). Without a worker the
        registry is never used, so it is not held against this environment."""
        if not self.worker_enabled:
            return self
        for name, target in self.model_registry.items():
            why = missing_module(target)
            if why is not None:
                raise ValueError(
                    f"BATCHPLAN_CHECK_MODELS: check model {name!r} ({target}): {why} in this environment; "
                    f"install its package (or add its folder to PYTHONPATH), or drop the entry"
                )
        return self

    @property
    def model_registry(self) -> dict[str, str]:
        return parse_models(self.check_models or "")
