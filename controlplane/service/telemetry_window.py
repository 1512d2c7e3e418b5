"""Telemetry windows and how to ask for them: the values the telemetry repository speaks in.

A leaf module (it imports no other service module), so the ports can name these types and the
telemetry use cases can import the ports without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import NamedTuple


class ActivitySource(StrEnum):
    """Which gauge a window's activity figures come from, best first."""

    SM_ACTIVE = "sm_active"
    GR_ENGINE_ACTIVE = "gr_engine_active"
    GPU_UTIL = "gpu_util"


class TelemetryWindow(NamedTuple):
    """What gpufleet knows about one GPU (or MIG instance) of one run over one window.

    The columns are mergeable accumulators; the properties turn them into figures. `run_id` is
    None for GPUs that no gpufleet run could be attributed to. A NamedTuple rather than a frozen
    dataclass: the consumer builds thousands per transaction, and the tuple is the SQL row.
    """

    run_id: str | None
    gpu_key: str
    window_start: datetime
    window_seconds: int
    cluster: str
    node: str
    gpu_uuid: str
    gpu_index: int
    mig_profile: str | None
    mig_instance: int | None
    pod: str | None
    namespace: str | None
    samples: int
    first_sample_at: datetime
    last_sample_at: datetime
    sm_active_n: int
    sm_active_sum: float
    sm_active_max: float
    gr_engine_n: int
    gr_engine_sum: float
    gr_engine_max: float
    gpu_util_n: int
    gpu_util_sum: float  # as a ratio 0..1, converted from DCGM's percent
    gpu_util_max: float
    tensor_n: int
    tensor_sum: float
    fb_used_n: int
    fb_used_sum: float
    fb_free_n: int
    fb_free_sum: float
    power_n: int
    power_sum: float
    xid_last: int | None
    xid_at: datetime | None
    xid_error_samples: int

    @property
    def window_end(self) -> datetime:
        return self.window_start + timedelta(seconds=self.window_seconds)

    @property
    def activity_source(self) -> ActivitySource | None:
        """SM_ACTIVE, else GR_ENGINE_ACTIVE, else GPU_UTIL (a coarse busy flag), else None."""
        if self.sm_active_n:
            return ActivitySource.SM_ACTIVE
        if self.gr_engine_n:
            return ActivitySource.GR_ENGINE_ACTIVE
        if self.gpu_util_n:
            return ActivitySource.GPU_UTIL
        return None

    def _activity(self) -> tuple[int, float, float]:
        source = self.activity_source
        if source is ActivitySource.SM_ACTIVE:
            return self.sm_active_n, self.sm_active_sum, self.sm_active_max
        if source is ActivitySource.GR_ENGINE_ACTIVE:
            return self.gr_engine_n, self.gr_engine_sum, self.gr_engine_max
        if source is ActivitySource.GPU_UTIL:
            return self.gpu_util_n, self.gpu_util_sum, self.gpu_util_max
        return 0, 0.0, 0.0

    @property
    def activity_samples(self) -> int:
        return self._activity()[0]

    @property
    def activity_mean(self) -> float | None:
        """Mean of the activity signal as a ratio 0..1; None when the window has no such reading."""
        n, total, _ = self._activity()
        return total / n if n else None

    @property
    def activity_max(self) -> float | None:
        n, _, peak = self._activity()
        return peak if n else None

    @property
    def tensor_mean(self) -> float | None:
        return self.tensor_sum / self.tensor_n if self.tensor_n else None

    @property
    def fb_used_mean_mib(self) -> float | None:
        return self.fb_used_sum / self.fb_used_n if self.fb_used_n else None

    @property
    def fb_free_mean_mib(self) -> float | None:
        return self.fb_free_sum / self.fb_free_n if self.fb_free_n else None

    @property
    def power_mean_w(self) -> float | None:
        return self.power_sum / self.power_n if self.power_n else None


@dataclass(frozen=True)
class WindowQuery:
    """Which windows to read. `run_id=None` means any run; `unattributed=True` only GPUs without one."""

    run_id: str | None = None
    unattributed: bool = False
    cluster: str | None = None
    node: str | None = None
    since: datetime | None = None  # windows that start at or after this
    until: datetime | None = None  # windows that start before this
    limit: int = 10_000
