"""The records of reconciling a cluster: the objects gpufleet owns there, and what `reconcile` found and did."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.kubernetes.manifest_model import ApiResource


@dataclass(frozen=True)
class OwnedObject:
    resource: ApiResource
    name: str
    run_id: str
    epoch: int | None
    expected_objects: int | None


@dataclass(frozen=True)
class Drift:
    run_id: str
    reason: str  # missing | incomplete | epoch
    detail: str


@dataclass(frozen=True)
class ReconcileReport:
    orphans_deleted: tuple[str, ...] = ()
    drift: tuple[Drift, ...] = ()
    errors: tuple[str, ...] = ()
