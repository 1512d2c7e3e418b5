"""A strict fake of the Kubernetes API server for the Kubernetes adapter's tests.

It speaks the REST paths the official client uses (core `/api/v1`, groups `/apis/<g>/<v>`),
stores objects per (group/version/resource, namespace, name), answers 201 / 409 AlreadyExists /
404 NotFound / 422 Invalid / 403 Forbidden / 401 with proper `Status` bodies, lists with label
selectors, replaces (PUT) and merge-patches (PATCH), deletes with cascading garbage collection
through ownerReferences, and streams watch events as newline-delimited `{"type", "object"}` JSON,
with 410 Gone for a compacted resourceVersion.

Every object written, by a client or by a test through `put`, is validated the way a real
cluster validates it (`admission.py`, `schemas.py`):
- built-in kinds against the OpenAPI schemas of Kubernetes `KUBERNETES_VERSION` shipped by the
  PyPI package `kubernetes-validate`, strict (an unknown field is refused, not silently pruned);
- custom resources against the real CRDs vendored in `tests/kubernetes/crds/`;
- the rules the schemas miss: name rules per kind, label and annotation syntax, Indexed Job
  rules, resource requests (extended resources integers, requests == limits), tolerations and
  node affinity syntax, the JobSet webhook (generated Job and pod names within 63 characters);
- admission on create: the Priority plugin (403 for a priorityClassName no PriorityClass has),
  the JobSet webhook's defaulting, the Job's generated selector and labels; with
  `require_namespaces`, NamespaceLifecycle (404 for a namespace that does not exist).

The cluster's actors (JobSet/Job controllers, scheduler, kubelet, PodGC, Kueue) are functions in
`controllers.py`, re-exported here; a test calls them when it wants them to act.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.kubernetes.admission import (
    Denied,
    Forbidden,
    Invalid,
    default_job,
    default_jobset,
    priority_of,
    validate_coscheduling_pod_group,
    validate_job,
    validate_jobset,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_priority_class,
    validate_volcano_pod_group,
    volcano_queue_admission,
)
from tests.kubernetes.controllers import (
    admit_kueue,
    collect_orphaned_pods,
    finish_pods,
    run_job_controller,
    run_kubelet,
    schedule,
    set_pod_status,
    validate_jobset_and_children,
)
from tests.kubernetes.kinds import (
    COSCHEDULING_PODGROUPS,
    JOBS,
    JOBSETS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    VOLCANO_PODGROUPS,
    FailedCreate,
    ResourceKey,
    api_version,
)
from tests.kubernetes.schemas import KUBERNETES_VERSION

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)


@dataclass(frozen=True)
class ResourceType:
    kind: str
    namespaced: bool
    validate: Callable[[dict[str, Any]], None]
    default: Callable[[dict[str, Any]], None] | None = None  # mutating admission on create


RESOURCES: dict[ResourceKey, ResourceType] = {
    PODS: ResourceType("Pod", True, validate_pod),
    NODES: ResourceType("Node", False, validate_node),
    NAMESPACES: ResourceType("Namespace", False, validate_namespace),
    JOBS: ResourceType("Job", True, validate_job, default_job),
    PRIORITY_CLASSES: ResourceType("PriorityClass", False, validate_priority_class),
    JOBSETS: ResourceType("JobSet", True, validate_jobset, default_jobset),
    VOLCANO_PODGROUPS: ResourceType("PodGroup", True, validate_volcano_pod_group),
    COSCHEDULING_PODGROUPS: ResourceType("PodGroup", True, validate_coscheduling_pod_group),
}

# Names kept for the tests written against the first version of this fake.
_validate_job = validate_job
_validate_jobset = validate_jobset_and_children
_validate_volcano_pod_group = validate_volcano_pod_group
_validate_coscheduling_pod_group = validate_coscheduling_pod_group
SERVER_FIELDS = ("creationTimestamp", "resourceVersion", "uid", "generation")


def _split_selector(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def matches_selector(labels: dict[str, str], selector: str | None) -> bool:
    """Kubernetes label selector semantics: =, ==, !=, in, notin, exists, !exists."""
    if not selector:
        return True
    for term in _split_selector(selector):
        set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if set_match:
            key, op, values = set_match.group(1), set_match.group(2), {v.strip() for v in set_match.group(3).split(",")}
            inside = key in labels and labels[key] in values
            if (op == "in") != inside:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


# Field labels each resource supports in fieldSelector (pkg/registry/*/strategy.go *ToSelectableFields;
# every resource has metadata.name and metadata.namespace); any other is a 400.
FIELD_LABELS: dict[str, tuple[str, ...]] = {
    "pods": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "nodes": ("spec.unschedulable",),
    "jobs": ("status.successful",),
    "namespaces": ("status.phase",),
}


def _field_value(obj: dict[str, Any], label: str) -> str:
    value: Any = obj
    for part in label.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if label == "spec.unschedulable" or label == "spec.hostNetwork":
        return "true" if value else "false"
    return "" if value is None else str(value)


def parse_field_selector(plural: str, text: str | None) -> list[tuple[str, str, bool]]:
    """(field, value, equal) terms of a field selector; ValueError for an unsupported field."""
    terms: list[tuple[str, str, bool]] = []
    for term in (text or "").split(","):
        if not term.strip():
            continue
        negate = "!=" in term
        field_label, _, value = term.partition("!=" if negate else "=")
        field_label, value = field_label.strip(), value.lstrip("=").strip()
        if field_label not in ("metadata.name", "metadata.namespace", *FIELD_LABELS.get(plural, ())):
            raise ValueError(f"field label not supported: {field_label}")
        terms.append((field_label, value, not negate))
    return terms


def matches_fields(obj: dict[str, Any], terms: list[tuple[str, str, bool]]) -> bool:
    return all((_field_value(obj, f) == v) == equal for f, v, equal in terms)


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclass
class Event:
    rv: int
    resource: ResourceKey
    namespace: str
    type: str
    obj: dict[str, Any]


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class FakeApiServer:
    """Start with `start()` (or as a context manager); `url` is what a client Configuration needs."""

    token: str | None = "fake-token"
    served: set[ResourceKey] = field(default_factory=lambda: set(RESOURCES))
    objects: dict[ResourceKey, dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    creations: list[tuple[ResourceKey, str, str]] = field(default_factory=list)  # successful POSTs
    responses: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status) answered
    deletions: list[tuple[ResourceKey, str, str, str | None]] = field(default_factory=list)  # + propagation
    failed_creates: list[FailedCreate] = field(default_factory=list)  # refused controller creates
    # Scheduler names someone serves; pods naming another scheduler stay Pending, untouched.
    schedulers: set[str] = field(
        default_factory=lambda: {"default-scheduler", "volcano", "scheduler-plugins-scheduler"}
    )
    # Real pod names carry a 5-character random suffix (`<job>-<index>-x7k2p`); off, the Job
    # controller names pods `<job>-<index>` (what the first tests were written against).
    generated_pod_names: bool = False
    # Volcano queues and their state: its webhook refuses PodGroups of a missing or closed queue.
    volcano_queues: dict[str, str] = field(default_factory=lambda: {"default": "Open"})
    # Nodes whose device plugin runs time-slicing with failRequestsGreaterThanOne (MPS always does).
    strict_time_slicing_nodes: set[str] = field(default_factory=set)
    # NamespaceLifecycle: refuse objects in a namespace that does not exist (404), as real clusters do.
    require_namespaces: bool = False
    # Called before each request is handled: lets a test make another actor race the client.
    before_request: Callable[[Request], None] | None = None
    rv: int = 0
    oldest_rv: int = 0  # watches from before this get 410 Gone
    lock: threading.Condition = field(default_factory=threading.Condition)
    _closing: bool = False
    _watch_generation: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    kubernetes_version = KUBERNETES_VERSION

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> FakeApiServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self._closing = True
            self.lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @staticmethod
    def now() -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- direct access for tests (what controllers and kubelets would do) ----------------

    def put(self, resource: ResourceKey, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would; validated like an API write
        (a new object also meets the create-time admission: defaulting, Priority plugin)."""
        rtype = RESOURCES[resource]
        body: dict[str, Any] = json.loads(json.dumps(obj))
        meta = body.setdefault("metadata", {})
        ns = meta.get("namespace", "") if rtype.namespaced else ""
        with self.lock:
            existing = self.objects.get(resource, {}).get((ns, meta.get("name", "")))
            if existing is None:
                self._admit_create(resource, body, ns)
            else:
                self._validate(rtype, body)
            self._stamp(body, existing)
            self.objects.setdefault(resource, {})[(ns, meta["name"])] = body
            self._emit(resource, ns, "MODIFIED" if existing else "ADDED", body)
        return body

    def create_as_controller(
        self, resource: ResourceKey, obj: dict[str, Any], controller: str
    ) -> dict[str, Any] | None:
        """A controller's create: refused objects are recorded in `failed_creates`, not raised."""
        meta = obj.get("metadata") or {}
        try:
            return self.put(resource, obj)
        except Invalid as exc:
            code, message = 422, str(exc)
        except Forbidden as exc:
            code, message = 403, str(exc)
        except Denied as exc:
            code, message = 400, str(exc)
        self.failed_creates.append(
            FailedCreate(resource, meta.get("namespace", ""), meta.get("name", ""), controller, code, message)
        )
        return None

    def get(self, resource: ResourceKey, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.objects.get(resource, {}).get((namespace, name))

    def objects_of(self, resource: ResourceKey, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                obj
                for (ns, _), obj in sorted(self.objects.get(resource, {}).items())
                if namespace is None or ns == namespace
            ]

    def remove(self, resource: ResourceKey, namespace: str, name: str) -> None:
        with self.lock:
            self._delete_locked(resource, namespace, name, cascade=True)

    def compact(self) -> None:
        """Forget the event history, like etcd compaction: older resourceVersions become 410 Gone."""
        with self.lock:
            self.events.clear()
            self.oldest_rv = self.rv + 1
            self.lock.notify_all()

    def close_watches(self) -> None:
        """End every open watch (as an API server restart or a load balancer timeout would)."""
        with self.lock:
            self._watch_generation += 1
            self.lock.notify_all()

    def requests_to(self, method: str, plural: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and f"/{plural}" in r.path]

    # -- admission -----------------------------------------------------------------------

    def _validate(self, rtype: ResourceType, body: dict[str, Any]) -> None:
        # Fields the server itself stamps are not the writer's and are not revalidated.
        check = json.loads(json.dumps(body))
        for server_field in SERVER_FIELDS:
            check.get("metadata", {}).pop(server_field, None)
        rtype.validate(check)

    def _admit_create(self, resource: ResourceKey, body: dict[str, Any], ns: str) -> None:
        """Create path of the real API server: mutating admission (defaulting, Priority),
        validation, then the namespace must exist. Raises Invalid / Forbidden / LookupError."""
        rtype = RESOURCES[resource]
        meta = body.setdefault("metadata", {})
        if rtype.namespaced:
            meta["namespace"] = ns
        if self.require_namespaces and rtype.namespaced and self.get(NAMESPACES, "", ns) is None:
            raise LookupError(f'namespaces "{ns}" not found')
        self._validate(rtype, body)  # a request must be valid as sent, before defaults hide its faults
        if resource == PODS:
            body.setdefault("status", {}).setdefault("phase", "Pending")
            spec = body.setdefault("spec", {})
            spec["priority"] = priority_of(
                body, ns, lambda name: self.get(PRIORITY_CLASSES, "", name), self._default_priority()
            )
        if resource == VOLCANO_PODGROUPS:
            volcano_queue_admission(body, self.volcano_queues)
        if rtype.default is not None:
            meta.setdefault("uid", str(uuid.uuid4()))
            rtype.default(body)
            self._validate(rtype, body)

    def _default_priority(self) -> int:
        defaults = [pc for pc in self.objects_of(PRIORITY_CLASSES) if pc.get("globalDefault")]
        return int(defaults[0].get("value", 0)) if defaults else 0

    # -- internals -----------------------------------------------------------------------

    def _stamp(self, body: dict[str, Any], existing: dict[str, Any] | None) -> None:
        self.rv += 1
        meta = body["metadata"]
        meta["resourceVersion"] = str(self.rv)
        meta["uid"] = (existing or {}).get("metadata", {}).get("uid") or meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = (existing or {}).get("metadata", {}).get("creationTimestamp") or datetime.now(
            UTC
        ).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def _emit(self, resource: ResourceKey, namespace: str, kind: str, obj: dict[str, Any]) -> None:
        self.events.append(Event(self.rv, resource, namespace, kind, json.loads(json.dumps(obj))))
        self.lock.notify_all()

    def _delete_locked(self, resource: ResourceKey, namespace: str, name: str, *, cascade: bool) -> bool:
        obj = self.objects.get(resource, {}).pop((namespace, name), None)
        if obj is None:
            return False
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(resource, namespace, "DELETED", obj)
        if cascade:  # the garbage collector: dependents go with their owner
            uid = obj["metadata"]["uid"]
            for res, store in list(self.objects.items()):
                for (ns, dep_name), dep in list(store.items()):
                    owners = dep["metadata"].get("ownerReferences") or []
                    if any(o.get("uid") == uid for o in owners):
                        self._delete_locked(res, ns, dep_name, cascade=True)
        return True


def _handler_for(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 for chunked watch streams: the client hands over each event as its chunk arrives.
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
            return

        def _send(self, code: int, body: dict[str, Any]) -> None:
            api.responses.append((self.command, urlsplit(self.path).path, code))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[ResourceKey, ResourceType, str, str | None, dict[str, str]] | None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            request = Request(self.command, parts.path, query, body)
            api.requests.append(request)
            if api.before_request is not None:
                api.before_request(request)
            self._body = body
            if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
                self._send(401, status_body(401, "Unauthorized", "Unauthorized"))
                return None
            m = _PATH.match(parts.path)
            if m is None:
                self._send(404, status_body(404, "NotFound", f"the server could not find {parts.path}"))
                return None
            key: ResourceKey = ("", "v1", m["plural"]) if m["core"] else (m["group"], m["version"], m["plural"])
            rtype = RESOURCES.get(key)
            if rtype is None or key not in api.served:
                self._send(404, status_body(404, "NotFound", f"the server could not find the requested resource {key}"))
                return None
            return key, rtype, m["ns"] or "", m["name"], query

        def _refuse(self, exc: Exception, kind: str, name: str | None) -> None:
            if isinstance(exc, Invalid):
                causes = [{"message": cause} for cause in exc.causes]
                details = {"name": name, "kind": kind, "causes": causes}
                self._send(422, status_body(422, "Invalid", str(exc), details))
            elif isinstance(exc, Forbidden):
                self._send(403, status_body(403, "Forbidden", str(exc), {"name": name, "kind": kind}))
            elif isinstance(exc, Denied):
                self._send(400, status_body(400, "BadRequest", str(exc), {"name": name, "kind": kind}))
            else:
                self._send(404, status_body(404, "NotFound", str(exc).strip("'\""), {"name": name, "kind": kind}))

        def do_POST(self) -> None:
            routed = self._route()
            if routed is None:
                return
            key, rtype, ns, name, _ = routed
            body = self._body
            if name is not None or not isinstance(body, dict):
                self._send(405, status_body(405, "MethodNotAllowed", "POST a collection"))
                return
            # The API server decodes with the path's group/version/kind as defaults.
            body.setdefault("apiVersion", api_version(key))
            body.setdefault("kind", rtype.kind)
            meta = body.setdefault("metadata", {})
            if rtype.namespaced and meta.get("namespace", ns) != ns:
                self._send(
                    400,
                    status_body(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ),
                )
                return
            obj_name = meta.get("name")
            with api.lock:
                store = api.objects.setdefault(key, {})
                if (ns, obj_name) in store:
                    group = key[0]
                    qualified = f"{key[2]}.{group}" if group else key[2]
                    self._send(
                        409,
                        status_body(
                            409,
                            "AlreadyExists",
                            f'{qualified} "{obj_name}" already exists',
                            {"name": obj_name, "group": group, "kind": key[2]},
                        ),
                    )
                    return
                try:
                    api._admit_create(key, body, ns if rtype.namespaced else "")
                except (Invalid, Forbidden, Denied, LookupError) as exc:
                    self._refuse(exc, rtype.kind, obj_name)
                    return
                api._stamp(body, None)
                store[(ns, obj_name)] = body
                api.creations.append((key, ns, obj_name))
                api._emit(key, ns, "ADDED", body)
            self._send(201, body)

        def _write_existing(self, patch: bool) -> None:
            routed = self._route()
            if routed is None:
                return
            key, rtype, ns, name, _ = routed
            if name is None or not isinstance(self._body, dict):
                self._send(405, status_body(405, "MethodNotAllowed", "PUT or PATCH one object"))
                return
            with api.lock:
                existing = api.get(key, ns, name)
                if existing is None:
                    self._send(404, status_body(404, "NotFound", f'{key[2]} "{name}" not found'))
                    return
                body = merge_patch(json.loads(json.dumps(existing)), self._body) if patch else self._body
                sent_rv = (self._body.get("metadata") or {}).get("resourceVersion")
                if sent_rv and sent_rv != existing["metadata"]["resourceVersion"]:
                    message = f'Operation cannot be fulfilled on {key[2]} "{name}": the object has been modified'
                    self._send(409, status_body(409, "Conflict", message, {"name": name, "kind": key[2]}))
                    return
                meta = body.setdefault("metadata", {})
                if meta.get("name") != name:
                    self._send(
                        400, status_body(400, "BadRequest", "the name of the object does not match the name on the URL")
                    )
                    return
                if rtype.namespaced:
                    meta["namespace"] = ns
                try:
                    stored = api.put(key, body)
                except (Invalid, Forbidden, Denied) as exc:
                    self._refuse(exc, rtype.kind, name)
                    return
            self._send(200, stored)

        def do_PUT(self) -> None:
            self._write_existing(patch=False)

        def do_PATCH(self) -> None:
            if "merge-patch" not in (self.headers.get("Content-Type") or "") and "strategic" not in (
                self.headers.get("Content-Type") or ""
            ):
                self._route()
                self._send(415, status_body(415, "UnsupportedMediaType", "only merge patches are supported"))
                return
            self._write_existing(patch=True)

        def do_GET(self) -> None:
            routed = self._route()
            if routed is None:
                return
            key, rtype, ns, name, query = routed
            if name is not None:
                obj = api.get(key, ns, name)
                if obj is None:
                    self._send(404, status_body(404, "NotFound", f'{key[2]} "{name}" not found'))
                else:
                    self._send(200, obj)
                return
            selector = query.get("labelSelector")
            try:
                fields = parse_field_selector(key[2], query.get("fieldSelector"))
            except ValueError as exc:
                self._send(400, status_body(400, "BadRequest", str(exc)))
                return
            self._fields = fields
            if query.get("watch", "").lower() in ("true", "1"):
                self._watch(key, ns, selector, query)
                return
            with api.lock:
                items = [
                    obj
                    for (obj_ns, _), obj in sorted(api.objects.get(key, {}).items())
                    if (not rtype.namespaced or not ns or obj_ns == ns)
                    and matches_selector(obj["metadata"].get("labels") or {}, selector)
                    and matches_fields(obj, fields)
                ]
                rv = str(api.rv)
            self._send(
                200,
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": "/".join(p for p in key[:2] if p),
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                },
            )

        def do_DELETE(self) -> None:
            routed = self._route()
            if routed is None:
                return
            key, _, ns, name, query = routed
            if name is None:
                self._send(405, status_body(405, "MethodNotAllowed", "DELETE one object"))
                return
            options = self._body if isinstance(self._body, dict) else {}
            policy = query.get("propagationPolicy") or options.get("propagationPolicy")
            with api.lock:
                found = api._delete_locked(key, ns, name, cascade=policy != "Orphan")
                if found:
                    api.deletions.append((key, ns, name, policy))
            if not found:
                self._send(404, status_body(404, "NotFound", f'{key[2]} "{name}" not found'))
                return
            self._send(200, status_body(200, "", "deleted", {"name": name, "kind": key[2]}))

        def _watch(self, key: ResourceKey, ns: str, selector: str | None, query: dict[str, str]) -> None:
            timeout = float(query.get("timeoutSeconds") or 30)
            deadline = time.monotonic() + timeout
            since = int(query.get("resourceVersion") or 0)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            try:
                self._stream(key, ns, selector, query, deadline, since)
                self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client went away (or stopped its watch)
                return

        def _stream(
            self, key: ResourceKey, ns: str, selector: str | None, query: dict[str, str], deadline: float, since: int
        ) -> None:
            with api.lock:
                generation = api._watch_generation
                if since and since < api.oldest_rv - 1:
                    gone = status_body(410, "Expired", f"too old resource version: {since} ({api.oldest_rv})")
                    self._write({"type": "ERROR", "object": gone})
                    return
                cursor = since
            for line in self._events(key, ns, selector, cursor, deadline, generation):
                self._write(line)
            if query.get("allowWatchBookmarks", "").lower() == "true":
                with api.lock:
                    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(api.rv)}}
                self._write({"type": "BOOKMARK", "object": bookmark})

        def _events(
            self, key: ResourceKey, ns: str, selector: str | None, cursor: int, deadline: float, generation: int
        ) -> Iterator[dict[str, Any]]:
            while True:
                with api.lock:
                    batch = [
                        e
                        for e in api.events
                        if e.rv > cursor
                        and e.resource == key
                        and (not ns or e.namespace == ns)
                        and matches_selector(e.obj["metadata"].get("labels") or {}, selector)
                        and matches_fields(e.obj, self._fields)
                    ]
                    if batch:
                        cursor = max(e.rv for e in batch)
                    elif not api._closing and api._watch_generation == generation:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return
                        api.lock.wait(min(remaining, 0.5))
                        # anything newer than what we saw, even of another kind, moves no cursor
                        continue
                    else:
                        return
                for e in batch:
                    yield {"type": e.type, "object": e.obj}

        def _write(self, event: dict[str, Any]) -> None:
            data = json.dumps(event).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


__all__ = [
    "COSCHEDULING_PODGROUPS",
    "JOBS",
    "JOBSETS",
    "NAMESPACES",
    "NODES",
    "PODS",
    "PRIORITY_CLASSES",
    "RESOURCES",
    "VOLCANO_PODGROUPS",
    "Denied",
    "FailedCreate",
    "FakeApiServer",
    "Forbidden",
    "Invalid",
    "Request",
    "ResourceKey",
    "admit_kueue",
    "collect_orphaned_pods",
    "finish_pods",
    "matches_selector",
    "run_job_controller",
    "run_kubelet",
    "schedule",
    "set_pod_status",
    "status_body",
]
