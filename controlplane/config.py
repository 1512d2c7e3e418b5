"""Settings from environment variables (`GPUFLEET_*`) or a YAML config file."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, TypeAdapter, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from controlplane.core.audit import AuditThresholds
from controlplane.core.idle import IdlePolicy, IdleRules
from controlplane.core.snapshot import Policy
from controlplane.paths import default_state_dir
from controlplane.service.audit import parse_audit_settings
from controlplane.service.idle import parse_idle_rules

POLICY_FIELDS = {f.name for f in dataclasses.fields(Policy)}
# Queue heads a cycle decides per queue (`Policy.heads_per_queue`): at least one, and bounded so a
# cycle never goes back to deciding the whole backlog.
MAX_HEADS_PER_QUEUE = 10_000
# The names `gpufleet up` and a local `gpufleet server serve` are reached by (DNS-rebinding defence).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# A list setting: a YAML list, or one string of comma-separated items (how an environment variable
# or a ConfigMap value carries it).
CommaList = Annotated[list[str], NoDecode]


def _comma_list(value: Any) -> Any:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="forbid")

    database_url: str = Field(
        default="", description="postgresql://... or sqlite:///path; default: SQLite in the state dir"
    )
    # One URL, or several separated by commas (the servers of a NATS cluster: any one reachable
    # at start is enough; the client learns the others from the server and fails over to them).
    nats_url: str = "nats://127.0.0.1:4222"
    # Copies of each JetStream stream and consumer: 3 on a three-server JetStream cluster (any one
    # server may fail with nothing lost), 1 on a single server (which refuses more).
    nats_replicas: int = Field(default=1, ge=1, le=5)
    # The control plane's own NATS secrets (fixed users' passwords, the callout signing key), a
    # 0600 JSON file; `up` creates it in the state dir. Unset: connect without credentials (a NATS
    # that is secured some other way, or a test's open server).
    nats_secrets_file: Path | None = None
    # Lifetime of the user JWTs auth callout issues (0: no expiry). At expiry the server disconnects
    # the client; nats-py does not reconnect after that, so it is off by default: revocation closes
    # connections by itself (`nats_revocation_poll`).
    nats_user_ttl: float = Field(default=0.0, ge=0)
    # How often SQL is asked whether the credentials of open NATS connections are still valid; the
    # connections of revoked or deleted ones are disconnected (whichever API process revoked them).
    nats_revocation_poll: float = Field(default=0.25, gt=0)
    # The backstop: how often the servers' connection listings are re-read (connect and disconnect
    # events keep the control plane's view current in between) and checked the same way.
    nats_revocation_sweep: float = Field(default=5.0, gt=0)
    # Open NATS connections one credential may hold (0: no cap): a team or admin API token, and a
    # cluster credential (the telemetry agent connects from every GPU node of its cluster).
    nats_max_connections_per_identity: int = Field(default=16, ge=0)
    # Open NATS connections one cluster credential may hold (the telemetry agent runs on every GPU node; 0: no cap).
    nats_max_connections_per_cluster: int = Field(default=1024, ge=0)
    # A source host with this many failed NATS authentications within the window is refused (0: no
    # limit) until they age out, except with a secret that authenticated before (docs/nats-security.md).
    nats_auth_failures_per_host: int = Field(default=20, ge=0)
    # The window (seconds) of `nats_auth_failures_per_host`.
    nats_auth_failure_window: float = Field(default=60.0, gt=0)
    # First token of every NATS subject.
    subject_prefix: str = Field(default="gpufleet", pattern=r"^[A-Za-z0-9_-]+$")
    # The SQLite file, embedded NATS data, tokens and simulated cluster state.
    state_dir: Path = Field(default_factory=default_state_dir)
    # Where `serve` listens.
    api_host: str = "127.0.0.1"
    # The API's port.
    api_port: int = 8080
    # Bind the API port with SO_REUSEPORT, so several API processes on one host share it (the kernel
    # spreads connections among them), as several replicas behind a Service would.
    api_reuse_port: bool = False
    # Host names (the `Host` header, without port) the API answers: exact names, `*.example.com`
    # suffixes, or `*` for any. Everything else gets a 400, so a web page that rebinds its own DNS
    # name to 127.0.0.1 cannot read the API of `gpufleet up` through the user's browser. /healthz,
    # /readyz and /metrics answer any Host: probes and Prometheus address pods by IP.
    api_trusted_hosts: CommaList = Field(default_factory=lambda: list(LOOPBACK_HOSTS))
    # Peers (addresses or networks: `10.0.0.0/8`) whose `X-Forwarded-Proto` and `X-Forwarded-For`
    # are believed: the TLS-terminating proxy or ingress in front of the API. Empty: none, so the
    # dashboard cookie is `Secure` only on real TLS and failed logins are counted per real peer.
    api_trusted_proxies: CommaList = Field(default_factory=list)
    # Failed authentications (a wrong bearer token, session cookie or login) a client address may
    # make per window before every authenticated request from it gets a 429 with Retry-After.
    # Counted in each API process's memory (IPv6 by /64), so N replicas allow up to N times this.
    auth_failure_limit: int = Field(default=100, ge=1, le=1_000_000)
    # The window (seconds) of `auth_failure_limit`.
    auth_failure_window: float = Field(default=60.0, gt=0, le=86_400)
    # How long a dashboard login lasts (seconds); logging out, revoking the token or deleting its
    # team ends it at once.
    ui_session_ttl: float = Field(default=8 * 3600, ge=60, le=30 * 86_400)
    # Prometheus metrics of this process on http://metrics_host:metrics_port/metrics (0: no metrics
    # port; a process that runs the API also serves them on the API's own /metrics). Both answer
    # only a bearer token of role `metrics` or `admin`.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    # The address of the metrics port.
    metrics_host: str = "127.0.0.1"
    # The SQL gauges (queues, quota, backlog, leases, idle GPUs) are read at most this often, however
    # often Prometheus scrapes; only processes that run the API export them.
    metrics_fleet_interval: float = Field(default=5.0, ge=0)
    # The per-run families on /metrics (effective utilization, serving latency) hold at most this
    # many runs each, the lowest-utilization (or slowest against its objective) first.
    metrics_max_run_series: int = Field(default=2_000, ge=0, le=100_000)
    # Seconds between scheduling cycles.
    scheduler_interval: float = Field(default=1.0, gt=0)
    # The scheduler keeps its snapshot across cycles and reads only what changed (service/
    # snapshot_cache.py); as a safety net it still reloads everything at least this often (seconds).
    snapshot_rebuild_interval: float = Field(default=600.0, gt=0)
    # Leader lease (scheduler, dispatcher), seconds: a dead holder's work stops for at most this long.
    lease_ttl: float = Field(default=15.0, gt=0)
    # Seconds between looks for ended runs to tear down (admitted runs are looked for every 50 ms).
    dispatcher_interval: float = Field(default=0.3, gt=0)
    # Seconds between collections of cluster objects no run owns (orphans).
    orphan_gc_interval: float = Field(default=30.0, gt=0)
    # A run applied this long ago whose objects its cluster no longer lists is requeued (gang_timeout.py).
    vanished_run_grace: float = Field(default=60.0, gt=0)
    # Outbox poll when idle, seconds.
    relay_interval: float = Field(default=0.2, gt=0)
    # `/readyz` fails while the oldest unpublished event is older than this (relay down or stuck).
    relay_ready_lag: float = Field(default=60.0, gt=0)
    # Simulated clusters: seconds before pods run.
    sim_start_delay: float = Field(default=1.0, ge=0)
    # Debug: check the core's invariants after every live cycle.
    check_invariants: bool = False
    # Real clusters. Per-provider keyword overrides for `adapters.clouds.build_provider` (local or
    # sovereign endpoints), e.g. {eks: {endpoint_url: ..., sts_endpoint_url: ...}, gke: {api_endpoint: ...}}.
    cloud_endpoints: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Talk to every real cluster's Kubernetes API at this URL instead of the discovered endpoint (tests,
    # tunnels); credentials still come from the cloud. http:// URLs skip TLS verification.
    kube_api_override: str = ""
    # Seconds between syncs of one cloud cluster, and between node inventories of every real cluster.
    fleet_sync_interval: float = Field(default=60.0, gt=0)
    # Renew Kubernetes tokens this many seconds before they expire.
    credential_refresh_margin: float = Field(default=300.0, ge=0)
    # Seconds a dispatched gang may take to have every pod running; then it is torn down and requeued.
    gang_start_timeout: float = Field(default=600.0, gt=0)
    # Seconds between gang start timeout checks.
    gang_timeout_interval: float = Field(default=5.0, gt=0)
    # An admitted run not applied to its cluster within this many seconds is requeued with a reason.
    dispatch_timeout: float = Field(default=300.0, gt=0)
    # Scale cloud pools up for waiting gangs and down when unused.
    autoscale: bool = True
    # Seconds between autoscaling passes.
    autoscale_interval: float = Field(default=30.0, gt=0)
    # Seconds a pool must be unused before it is scaled down to its minimum.
    autoscale_cooldown: float = Field(default=600.0, ge=0)
    # Scheduling policy knobs (fields of `controlplane.core.snapshot.Policy`), e.g. fair-share
    # history or opt-in rebalancing; unset fields keep their defaults.
    policy: dict[str, Any] = Field(default_factory=dict)

    @field_validator("api_trusted_hosts", "api_trusted_proxies", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("api_trusted_proxies")
    @classmethod
    def _valid_networks(cls, proxies: list[str]) -> list[str]:
        for proxy in proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"{proxy!r} is not an IP address or network (e.g. 10.0.0.0/8)") from None
        return proxies

    @field_validator("policy")
    @classmethod
    def _known_policy_fields(cls, policy: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(policy) - POLICY_FIELDS)
        if unknown:
            raise ValueError(f"unknown policy field(s) {', '.join(unknown)}; known: {', '.join(sorted(POLICY_FIELDS))}")
        TypeAdapter(Policy).validate_python(policy)
        heads = policy.get("heads_per_queue", 1)
        if not 1 <= heads <= MAX_HEADS_PER_QUEUE:
            # 0 would decide no queue's gangs at all; a huge value brings back the whole backlog.
            raise ValueError(f"heads_per_queue must be between 1 and {MAX_HEADS_PER_QUEUE}, not {heads}")
        return policy

    # Anti-hoarding: the idle policy (see `controlplane.service.idle.IdleRulesSpec`) and how often
    # running runs are judged from their telemetry.
    idle: dict[str, Any] = Field(default_factory=dict)
    # Seconds between idle passes (the idle policy judging running runs).
    idle_interval: float = Field(default=60.0, gt=0)
    # Length of the telemetry roll-up windows the consumer writes. The idle policy counts these
    # windows, so its `window_seconds` is this value (setting it to anything else is an error).
    telemetry_window_seconds: int = Field(default=300, ge=1)
    # How often each simulated cluster publishes a DCGM batch for its running pods.
    telemetry_interval: float = Field(default=10.0, gt=0)

    # The audit's thresholds (`controlplane.service.audit.AuditSettings`: lookback_hours,
    # min_utilization, min_measured_gpu_hours, high_utilization); unset fields keep their defaults.
    audit: dict[str, Any] = Field(default_factory=dict)

    @field_validator("audit")
    @classmethod
    def _valid_audit_settings(cls, audit: dict[str, Any]) -> dict[str, Any]:
        parse_audit_settings(audit)
        return audit

    def audit_thresholds(self) -> AuditThresholds:
        return parse_audit_settings(self.audit)

    @field_validator("idle")
    @classmethod
    def _valid_idle_rules(cls, idle: dict[str, Any]) -> dict[str, Any]:
        parse_idle_rules(idle)
        return idle

    @model_validator(mode="after")
    def _idle_windows_match_telemetry(self) -> Settings:
        policies: list[tuple[str, Any]] = [("default", self.idle.get("default"))]
        for table in ("queues", "priority_classes", "kinds"):
            policies += [(f"{table}.{k}", v) for k, v in (self.idle.get(table) or {}).items()]
        for where, policy in policies:
            seconds = (policy or {}).get("window_seconds")
            if seconds is not None and seconds != self.telemetry_window_seconds:
                raise ValueError(
                    f"idle.{where}.window_seconds is {seconds} but telemetry windows are "
                    f"{self.telemetry_window_seconds} s (telemetry_window_seconds); leave it unset"
                )
        return self

    def idle_rules(self) -> IdleRules:
        """The idle policy, every policy counting windows of `telemetry_window_seconds`."""
        rules = parse_idle_rules(self.idle)
        seconds = self.telemetry_window_seconds

        def fit(policy: IdlePolicy) -> IdlePolicy:
            return dataclasses.replace(policy, window_seconds=seconds)

        return dataclasses.replace(
            rules,
            default=fit(rules.default),
            by_queue={k: fit(v) for k, v in rules.by_queue.items()},
            by_priority_class={k: fit(v) for k, v in rules.by_priority_class.items()},
            by_kind={k: fit(v) for k, v in rules.by_kind.items()},
        )

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
