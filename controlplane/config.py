"""Settings from environment variables (`GPUFLEET_*`) or a YAML config file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, TypeAdapter, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from controlplane.core.snapshot import Policy

POLICY_FIELDS = {f.name for f in dataclasses.fields(Policy)}


def default_state_dir() -> Path:
    return Path.home() / ".gpufleet"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="forbid")

    database_url: str = Field(
        default="", description="postgresql://... or sqlite:///path; default: SQLite in the state dir"
    )
    nats_url: str = "nats://127.0.0.1:4222"
    subject_prefix: str = Field(default="gpufleet", pattern=r"^[A-Za-z0-9_-]+$")
    state_dir: Path = Field(default_factory=default_state_dir)
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    scheduler_interval: float = Field(default=1.0, gt=0)
    lease_ttl: float = Field(default=15.0, gt=0)
    dispatcher_interval: float = Field(default=0.3, gt=0)
    orphan_gc_interval: float = Field(default=30.0, gt=0)
    relay_interval: float = Field(default=0.2, gt=0)
    sim_start_delay: float = Field(default=1.0, ge=0)
    check_invariants: bool = False
    # Scheduling policy knobs (fields of `controlplane.core.snapshot.Policy`), e.g. fair-share
    # history or opt-in rebalancing; unset fields keep their defaults.
    policy: dict[str, Any] = Field(default_factory=dict)

    @field_validator("policy")
    @classmethod
    def _known_policy_fields(cls, policy: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(policy) - POLICY_FIELDS)
        if unknown:
            raise ValueError(f"unknown policy field(s) {', '.join(unknown)}; known: {', '.join(sorted(POLICY_FIELDS))}")
        TypeAdapter(Policy).validate_python(policy)
        return policy

    def scheduling_policy(self) -> Policy:
        return TypeAdapter(Policy).validate_python(self.policy)

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'gpufleet.db'}"

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Settings:
        """Values: explicit overrides, then the config file, then the environment, then defaults."""
        values: dict[str, Any] = {}
        if config_file is not None:
            loaded = yaml.safe_load(config_file.read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{config_file}: expected a mapping of settings")
            values.update(loaded)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
