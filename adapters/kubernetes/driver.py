"""`ClusterDriver` for a real Kubernetes cluster, through the official client.

The client is blocking, so every call runs in a worker thread (`asyncio.to_thread`); one apply or
delete is one thread hop doing its few requests in sequence. Credentials arrive in a ready
`kubernetes.client.Configuration` (host, bearer token, CA): this module never reads a kubeconfig,
so no `exec` credential plugin can run inside the control plane.

Idempotency rests on deterministic object names (see `manifests`): AlreadyExists is success for
apply, NotFound is success for delete, and ownership is read back from labels, so a restarted
control plane (a new driver instance) sees exactly what an earlier one created.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from adapters.kubernetes.api_client import json_body
from adapters.kubernetes.manifest_model import (
    ANNOTATION_OBJECTS,
    JOB,
    LABEL_EPOCH,
    LABEL_RUN,
    MANAGED_BY,
    MANAGER,
    OWNED_SELECTOR,
    ApiResource,
    Manifest,
    run_selector,
)
from adapters.kubernetes.manifests import KubeSettings, ManifestError, build_run_manifests
from adapters.kubernetes.reconcile_records import Drift, OwnedObject, ReconcileReport
from controlplane.domain.model import NodePool
from controlplane.service.ports import RunOrder

log = logging.getLogger(__name__)

FIELD_MANAGER = "gpufleet"
PROPAGATION = "Background"  # the Job/JobSet controllers and the GC remove pods after we return


@dataclass
class KubernetesCluster:
    """Implements the dispatcher's `ClusterDriver` protocol for one Kubernetes cluster."""

    name: str
    configuration: client.Configuration
    settings: KubeSettings
    pools: Mapping[str, NodePool]  # by pool name, as the core knows them
    request_timeout: float = 30.0
    created: int = 0  # objects actually created (not AlreadyExists), for tests and stats
    _api: client.ApiClient = field(init=False, repr=False)
    _batch: client.BatchV1Api = field(init=False, repr=False)
    _custom: client.CustomObjectsApi = field(init=False, repr=False)
    _core: client.CoreV1Api = field(init=False, repr=False)
    _scheduling: client.SchedulingV1Api = field(init=False, repr=False)
    # Seconds a PriorityClass known to exist is trusted before it is checked again: one request
    # per class and interval, not one per run, and one deleted by hand comes back within it.
    priority_class_recheck_seconds: float = 300.0
    # PriorityClasses gpufleet owns that are known to exist: name -> (value, monotonic check time).
    _priority_classes: dict[str, tuple[int, float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._api = client.ApiClient(self.configuration)
        self._batch = client.BatchV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._scheduling = client.SchedulingV1Api(self._api)

    @property
    def api_client(self) -> client.ApiClient:
        return self._api

    def update_pools(self, pools: Mapping[str, NodePool]) -> None:
        """New inventory (pools added or retainted); used by the next apply."""
        self.pools = dict(pools)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # -- ClusterDriver ---------------------------------------------------------------------

    async def apply(self, order: RunOrder) -> bool:
        if order.cluster != self.name:
            raise ManifestError(f"run {order.run_id} is for cluster {order.cluster}, not {self.name}")
        manifests = build_run_manifests(order, self.pools, self.settings)
        if manifests.priority_class is not None:
            # Pods naming a PriorityClass that does not exist are refused by the API server.
            await asyncio.to_thread(self._ensure_priority_class, manifests.priority_class)
        created = await asyncio.to_thread(self._create_all, order.run_id, manifests.all())
        self.created += created
        return created > 0

    async def delete(self, run_id: str) -> bool:
        return await asyncio.to_thread(self._delete_run, run_id) > 0

    async def list_owned(self) -> set[str]:
        return {obj.run_id for obj in await asyncio.to_thread(self._list_owned)}

    async def reconcile(self, live: Mapping[str, int] | Set[str]) -> ReconcileReport:
        """Delete objects of runs that are not live; report live runs whose objects drifted.

        `live` maps run id to the epoch its objects must carry (a plain set skips the epoch
        check). Pass only runs already dispatched (dispatch state `applied`), otherwise a run
        still on its way to the cluster is reported missing.
        """
        objects = await asyncio.to_thread(self._list_owned)
        by_run: dict[str, list[OwnedObject]] = {}
        for obj in objects:
            by_run.setdefault(obj.run_id, []).append(obj)
        orphans: list[str] = []
        errors: list[str] = []
        for run_id in sorted(set(by_run) - set(live)):
            try:
                await asyncio.to_thread(self._delete_objects, by_run[run_id])
            except ApiException as exc:  # keep going: one stuck object must not shield the others
                errors.append(f"{run_id}: {exc.status} {exc.reason}")
                continue
            log.info("cluster %s: deleted objects of orphan run %s", self.name, run_id)
            orphans.append(run_id)
        drift: list[Drift] = []
        for run_id in sorted(live):
            found = by_run.get(run_id)
            if not found:
                drift.append(Drift(run_id, "missing", "no objects on the cluster"))
                continue
            expected = max((o.expected_objects or 0) for o in found)
            if len(found) < expected:
                names = ", ".join(sorted(f"{o.resource.plural}/{o.name}" for o in found))
                drift.append(Drift(run_id, "incomplete", f"{len(found)} of {expected} objects ({names})"))
            epochs = {o.epoch for o in found}
            want = live.get(run_id) if isinstance(live, Mapping) else None
            if len(epochs) > 1 or (want is not None and epochs != {want}):
                seen = ", ".join(sorted(str(e) for e in epochs))
                drift.append(Drift(run_id, "epoch", f"objects carry epoch {seen}, run has {want}"))
        return ReconcileReport(tuple(orphans), tuple(drift), tuple(errors))

    # -- blocking helpers (run in a worker thread) -----------------------------------------

    def _create_all(self, run_id: str, manifests: tuple[Manifest, ...]) -> int:
        created = 0
        for manifest in manifests:
            if self._create(manifest):
                created += 1
            else:
                self._check_owner(manifest, run_id)
        return created

    def _create(self, manifest: Manifest) -> bool:
        """True when created, False when it already existed."""
        ns = self.settings.namespace
        try:
            if manifest.resource == JOB:
                self._batch.create_namespaced_job(
                    ns,
                    # model_validate rejects unknown fields instead of dropping them silently
                    client.V1Job.model_validate(manifest.body),
                    field_manager=FIELD_MANAGER,
                    field_validation="Strict",
                    _request_timeout=self.request_timeout,
                )
            else:
                r = manifest.resource
                self._custom.create_namespaced_custom_object(
                    r.group,
                    r.version,
                    ns,
                    r.plural,
                    manifest.body,
                    field_manager=FIELD_MANAGER,
                    field_validation="Strict",
                    _request_timeout=self.request_timeout,
                )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _ensure_priority_class(self, manifest: Manifest) -> None:
        """Create gpufleet's PriorityClass once; replace it when the class value changed.

        A PriorityClass's value is immutable, so a changed gpufleet class is deleted and created
        again; pods already admitted keep the priority they were given. A class of that name that
        gpufleet does not own is never touched: the run is refused until it is mapped or removed.
        """
        value = int(manifest.body["value"])
        known = self._priority_classes.get(manifest.name)
        if (
            known is not None
            and known[0] == value
            and time.monotonic() - known[1] < self.priority_class_recheck_seconds
        ):
            return
        if not self._create_priority_class(manifest):
            existing = self._read_priority_class(manifest.name)
            if existing is not None:
                labels = (existing.get("metadata") or {}).get("labels") or {}
                if labels.get(MANAGED_BY) != MANAGER:
                    raise ManifestError(
                        f"PriorityClass {manifest.name} exists in cluster {self.name} and is not gpufleet's; "
                        "map the class to it with priority_class_map, or remove it"
                    )
                if existing.get("value") != value:
                    log.info(
                        "cluster %s: PriorityClass %s has value %s, the class now %s; replacing it",
                        self.name,
                        manifest.name,
                        existing.get("value"),
                        value,
                    )
                    self._delete_priority_class(manifest.name)
                    self._create_priority_class(manifest)
            else:  # deleted between our create and our read: create it again
                self._create_priority_class(manifest)
        self._priority_classes[manifest.name] = (value, time.monotonic())

    def _create_priority_class(self, manifest: Manifest) -> bool:
        try:
            self._scheduling.create_priority_class(
                client.V1PriorityClass.model_validate(manifest.body),
                field_manager=FIELD_MANAGER,
                field_validation="Strict",
                _request_timeout=self.request_timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _read_priority_class(self, name: str) -> dict[str, Any] | None:
        try:
            resp: object = self._scheduling.read_priority_class(
                name, _preload_content=False, _request_timeout=self.request_timeout
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json_body(resp)

    def _delete_priority_class(self, name: str) -> None:
        try:
            self._scheduling.delete_priority_class(name, _preload_content=False, _request_timeout=self.request_timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _check_owner(self, manifest: Manifest, run_id: str) -> None:
        """An object that already exists must be this run's, not a foreign one with our name."""
        existing = self._get(manifest.resource, manifest.name)
        if existing is None:
            # Deleted between our create and this read (a concurrent teardown): nothing to guard.
            return
        labels = existing.get("metadata", {}).get("labels") or {}
        if labels.get(LABEL_RUN) != run_id:
            raise ManifestError(
                f"{manifest.resource.plural}/{manifest.name} already exists and is not owned by run {run_id}"
            )

    def _get(self, resource: ApiResource, name: str) -> dict[str, Any] | None:
        ns = self.settings.namespace
        resp: object
        try:
            if resource == JOB:
                resp = self._batch.read_namespaced_job(
                    name, ns, _preload_content=False, _request_timeout=self.request_timeout
                )
            else:
                resp = self._custom.get_namespaced_custom_object(
                    resource.group,
                    resource.version,
                    ns,
                    resource.plural,
                    name,
                    _preload_content=False,
                    _request_timeout=self.request_timeout,
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json_body(resp)

    def _list(self, resource: ApiResource, label_selector: str) -> list[dict[str, Any]]:
        ns = self.settings.namespace
        resp: object
        try:
            if resource == JOB:
                resp = self._batch.list_namespaced_job(
                    ns, label_selector=label_selector, _preload_content=False, _request_timeout=self.request_timeout
                )
            else:
                resp = self._custom.list_namespaced_custom_object(
                    resource.group,
                    resource.version,
                    ns,
                    resource.plural,
                    label_selector=label_selector,
                    _preload_content=False,
                    _request_timeout=self.request_timeout,
                )
        except ApiException as exc:
            if exc.status == 404 and resource != JOB:
                # The CRD is not installed, so nothing of that kind can exist.
                log.warning("cluster %s: %s not served: %s", self.name, resource.plural, exc.reason)
                return []
            raise
        items: list[dict[str, Any]] = json_body(resp).get("items") or []
        return items

    def _list_owned(self) -> list[OwnedObject]:
        owned: list[OwnedObject] = []
        for resource in self.settings.owned_resources():
            for item in self._list(resource, OWNED_SELECTOR):
                meta = item.get("metadata") or {}
                labels = meta.get("labels") or {}
                run_id = labels.get(LABEL_RUN)
                if not run_id:
                    continue
                owned.append(
                    OwnedObject(
                        resource,
                        meta["name"],
                        run_id,
                        _int_or_none(labels.get(LABEL_EPOCH)),
                        _int_or_none((meta.get("annotations") or {}).get(ANNOTATION_OBJECTS)),
                    )
                )
        return owned

    def _delete_run(self, run_id: str) -> int:
        objects: list[OwnedObject] = []
        for resource in self.settings.owned_resources():
            for item in self._list(resource, run_selector(run_id)):
                objects.append(OwnedObject(resource, item["metadata"]["name"], run_id, None, None))
        return self._delete_objects(objects)

    def _delete_objects(self, objects: list[OwnedObject]) -> int:
        # Workloads before the gang object, so no pod is left pointing at a missing PodGroup.
        gang = self.settings.gang_resource
        ordered = sorted(objects, key=lambda o: (o.resource == gang, o.name))
        deleted = 0
        for obj in ordered:
            if self._delete(obj.resource, obj.name):
                deleted += 1
        return deleted

    def _delete(self, resource: ApiResource, name: str) -> bool:
        ns = self.settings.namespace
        options = client.V1DeleteOptions(propagation_policy=PROPAGATION)
        try:
            if resource == JOB:
                self._batch.delete_namespaced_job(
                    name,
                    ns,
                    propagation_policy=PROPAGATION,
                    body=options,
                    _preload_content=False,
                    _request_timeout=self.request_timeout,
                )
            else:
                self._custom.delete_namespaced_custom_object(
                    resource.group,
                    resource.version,
                    ns,
                    resource.plural,
                    name,
                    propagation_policy=PROPAGATION,
                    body=options,
                    _preload_content=False,
                    _request_timeout=self.request_timeout,
                )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _int_or_none(raw: str | None) -> int | None:
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None
