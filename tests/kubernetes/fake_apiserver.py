"""A small, strict fake of the Kubernetes API server for the Kubernetes adapter's tests.

It speaks the REST paths the official client uses (core `/api/v1`, groups `/apis/<g>/<v>`),
stores objects per (group/version/resource, namespace, name), answers 201 / 409 AlreadyExists /
404 NotFound / 422 Invalid / 401 with proper `Status` bodies, lists with label selectors, deletes
with cascading garbage collection through ownerReferences, and streams watch events as
newline-delimited `{"type", "object"}` JSON, with 410 Gone for a compacted resourceVersion.

Every object written is validated: built-in kinds are deserialized into the client's models and
serialized back, and any field the model does not know (a typo, a wrong nesting level) makes the
round trip differ and the request fail with 422, like `fieldValidation=Strict` on a real server.
Custom resources get the required-field checks of their CRDs.
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

from kubernetes import client

ResourceKey = tuple[str, str, str]  # (group, version, plural)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)


class Invalid(Exception):
    """A write the real API server would refuse with 422."""


@dataclass(frozen=True)
class ResourceType:
    kind: str
    namespaced: bool
    validate: Callable[[dict[str, Any]], None]
    model: str | None = None  # client model name for built-in kinds


_api = client.ApiClient()


def _round_trip(body: dict[str, Any], model: str) -> None:
    """Deserialize into the client's model and back; any dropped or mistyped field is an error."""
    try:
        obj = _api.deserialize(json.dumps(body), model, "application/json")
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        raise Invalid(f"{model}: {exc}") from exc
    back = _api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    if back != body:
        raise Invalid(f"{model}: fields not in the schema or of the wrong type: {_diff(body, back)}")


def _diff(want: Any, got: Any, path: str = "") -> str:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in got:
                return f"{path}.{key} unknown"
            if key not in want:
                return f"{path}.{key} added"
            sub = _diff(want[key], got[key], f"{path}.{key}")
            if sub:
                return sub
        return ""
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            sub = _diff(a, b, f"{path}[{i}]")
            if sub:
                return sub
        return ""
    return "" if want == got else f"{path}: {want!r} became {got!r}"


def _check_meta(body: dict[str, Any], *, name_max: int = 63) -> None:
    meta = body.get("metadata") or {}
    name = meta.get("name", "")
    if not DNS_LABEL.match(name) or len(name) > name_max:
        raise Invalid(f"metadata.name {name!r} is not a DNS-1123 label of at most {name_max} characters")
    for what in ("labels", "annotations"):
        for key, value in (meta.get(what) or {}).items():
            prefix, _, local = key.rpartition("/")
            if (prefix and not DNS_SUBDOMAIN.match(prefix)) or not LABEL_NAME.match(local) or len(local) > 63:
                raise Invalid(f"metadata.{what} key {key!r} is invalid")
            if not isinstance(value, str):
                raise Invalid(f"metadata.{what}[{key}] must be a string")
            if what == "labels" and (len(value) > 63 or not LABEL_VALUE.match(value)):
                raise Invalid(f"label value {value!r} of {key} is invalid")


def _check_pod_spec(spec: dict[str, Any], where: str) -> None:
    containers = spec.get("containers") or []
    if not containers:
        raise Invalid(f"{where}.containers: at least one container is required")
    for c in containers:
        if not c.get("image"):
            raise Invalid(f"{where}.containers[{c.get('name')}].image is required")
        resources = c.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for name, value in requests.items():
            if "/" in name and name not in limits:
                raise Invalid(f"extended resource {name} must have a limit")
            if "/" in name and limits[name] != value:
                raise Invalid(f"extended resource {name}: request must equal limit")


def _validate_job(body: dict[str, Any]) -> None:
    _round_trip(body, "V1Job")
    _check_meta(body)
    spec = body.get("spec") or {}
    template = spec.get("template") or {}
    pod_spec = template.get("spec") or {}
    if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
        raise Invalid("spec.template.spec.restartPolicy must be Never or OnFailure for a Job")
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        raise Invalid("spec.completions is required for an Indexed Job")
    _check_pod_spec(pod_spec, "spec.template.spec")
    _check_meta({"metadata": {"name": body["metadata"]["name"], **(template.get("metadata") or {})}})


def _validate_pod(body: dict[str, Any]) -> None:
    _round_trip(body, "V1Pod")
    _check_meta(body, name_max=253)
    _check_pod_spec(body.get("spec") or {}, "spec")


def _validate_node(body: dict[str, Any]) -> None:
    _round_trip(body, "V1Node")


def _require_int(value: Any, what: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise Invalid(f"{what} must be an integer >= {minimum}, got {value!r}")


def _validate_kind(body: dict[str, Any], api_version: str, kind: str) -> None:
    if body.get("apiVersion") != api_version or body.get("kind") != kind:
        raise Invalid(f"expected {api_version} {kind}, got {body.get('apiVersion')} {body.get('kind')}")


def _validate_volcano_pod_group(body: dict[str, Any]) -> None:
    _validate_kind(body, "scheduling.volcano.sh/v1beta1", "PodGroup")
    _check_meta(body)
    spec = body.get("spec") or {}
    allowed = {"minMember", "minTaskMember", "queue", "priorityClassName", "minResources", "networkTopology"}
    if set(spec) - allowed:
        raise Invalid(f"PodGroup spec fields unknown to Volcano: {sorted(set(spec) - allowed)}")
    _require_int(spec.get("minMember"), "spec.minMember", 1)
    if "queue" in spec and not isinstance(spec["queue"], str):
        raise Invalid("spec.queue must be a string")


def _validate_coscheduling_pod_group(body: dict[str, Any]) -> None:
    _validate_kind(body, "scheduling.x-k8s.io/v1alpha1", "PodGroup")
    _check_meta(body)
    spec = body.get("spec") or {}
    if set(spec) - {"minMember", "minResources", "scheduleTimeoutSeconds"}:
        raise Invalid(f"PodGroup spec fields unknown to scheduler-plugins: {sorted(spec)}")
    _require_int(spec.get("minMember"), "spec.minMember", 1)
    if "scheduleTimeoutSeconds" in spec:
        _require_int(spec["scheduleTimeoutSeconds"], "spec.scheduleTimeoutSeconds", 1)


def _validate_jobset(body: dict[str, Any]) -> None:
    _validate_kind(body, "jobset.x-k8s.io/v1alpha2", "JobSet")
    _check_meta(body)
    spec = body.get("spec") or {}
    allowed = {
        "replicatedJobs",
        "successPolicy",
        "failurePolicy",
        "startupPolicy",
        "network",
        "suspend",
        "coordinator",
        "managedBy",
        "ttlSecondsAfterFinished",
    }
    if set(spec) - allowed:
        raise Invalid(f"JobSet spec fields unknown: {sorted(set(spec) - allowed)}")
    jobs = spec.get("replicatedJobs") or []
    if not jobs:
        raise Invalid("spec.replicatedJobs must not be empty")
    names = [j.get("name", "") for j in jobs]
    if len(set(names)) != len(names):
        raise Invalid("replicatedJobs names must be unique")
    jobset_name = body["metadata"]["name"]
    for job in jobs:
        if set(job) - {"name", "groupName", "replicas", "template", "dependsOn"}:
            raise Invalid(f"replicatedJob fields unknown: {sorted(job)}")
        name = job.get("name", "")
        if not DNS_LABEL.match(name):
            raise Invalid(f"replicatedJob name {name!r} is not a DNS-1123 label")
        _require_int(job.get("replicas"), f"replicatedJobs[{name}].replicas", 1)
        template = job.get("template") or {}
        _round_trip(template, "V1JobTemplateSpec")
        job_spec = template.get("spec") or {}
        pod_spec = (job_spec.get("template") or {}).get("spec") or {}
        if pod_spec.get("restartPolicy") not in ("Never", "OnFailure"):
            raise Invalid("restartPolicy must be Never or OnFailure")
        _check_pod_spec(pod_spec, f"replicatedJobs[{name}]")
        # JobSet's webhook: pod hostnames <jobset>-<rjob>-<jobIndex>-<podIndex> must be DNS labels.
        longest = f"{jobset_name}-{name}-{job['replicas'] - 1}-{(job_spec.get('completions') or 1) - 1}"
        if len(longest) > 63:
            raise Invalid(f"pod hostname {longest!r} would exceed 63 characters")


RESOURCES: dict[ResourceKey, ResourceType] = {
    ("", "v1", "pods"): ResourceType("Pod", True, _validate_pod, "V1Pod"),
    ("", "v1", "nodes"): ResourceType("Node", False, _validate_node, "V1Node"),
    ("batch", "v1", "jobs"): ResourceType("Job", True, _validate_job, "V1Job"),
    ("jobset.x-k8s.io", "v1alpha2", "jobsets"): ResourceType("JobSet", True, _validate_jobset),
    ("scheduling.volcano.sh", "v1beta1", "podgroups"): ResourceType("PodGroup", True, _validate_volcano_pod_group),
    ("scheduling.x-k8s.io", "v1alpha1", "podgroups"): ResourceType("PodGroup", True, _validate_coscheduling_pod_group),
}


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
    deletions: list[tuple[ResourceKey, str, str, str | None]] = field(default_factory=list)  # + propagation
    # Called before each request is handled: lets a test make another actor race the client.
    before_request: Callable[[Request], None] | None = None
    rv: int = 0
    oldest_rv: int = 0  # watches from before this get 410 Gone
    lock: threading.Condition = field(default_factory=threading.Condition)
    _closing: bool = False
    _watch_generation: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

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

    # -- direct access for tests (what controllers and kubelets would do) ----------------

    def put(self, resource: ResourceKey, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would; validated like an API write."""
        rtype = RESOURCES[resource]
        body: dict[str, Any] = json.loads(json.dumps(obj))
        # Fields the server itself stamped are not the writer's and are not revalidated.
        check = json.loads(json.dumps(obj))
        for server_field in ("creationTimestamp", "resourceVersion", "uid"):
            check["metadata"].pop(server_field, None)
        rtype.validate(check)
        meta = body["metadata"]
        ns = meta.get("namespace", "") if rtype.namespaced else ""
        with self.lock:
            existing = self.objects.setdefault(resource, {}).get((ns, meta["name"]))
            self._stamp(body, existing)
            self.objects[resource][(ns, meta["name"])] = body
            self._emit(resource, ns, "MODIFIED" if existing else "ADDED", body)
        return body

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

    # -- internals -----------------------------------------------------------------------

    def _stamp(self, body: dict[str, Any], existing: dict[str, Any] | None) -> None:
        self.rv += 1
        meta = body["metadata"]
        meta["resourceVersion"] = str(self.rv)
        meta["uid"] = (existing or {}).get("metadata", {}).get("uid") or str(uuid.uuid4())
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

        def do_POST(self) -> None:
            routed = self._route()
            if routed is None:
                return
            key, rtype, ns, name, _ = routed
            body = self._body
            if name is not None or not isinstance(body, dict):
                self._send(405, status_body(405, "MethodNotAllowed", "POST a collection"))
                return
            meta = body.setdefault("metadata", {})
            if meta.get("namespace", ns) != ns:
                self._send(400, status_body(400, "BadRequest", "namespace of the body does not match the path"))
                return
            if rtype.namespaced:
                meta["namespace"] = ns
            try:
                rtype.validate(body)
            except Invalid as exc:
                self._send(422, status_body(422, "Invalid", str(exc), {"name": meta.get("name"), "kind": rtype.kind}))
                return
            obj_name = meta["name"]
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
                api._stamp(body, None)
                store[(ns, obj_name)] = body
                api.creations.append((key, ns, obj_name))
                api._emit(key, ns, "ADDED", body)
            self._send(201, body)

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
            if query.get("watch", "").lower() in ("true", "1"):
                self._watch(key, ns, selector, query)
                return
            with api.lock:
                items = [
                    obj
                    for (obj_ns, _), obj in sorted(api.objects.get(key, {}).items())
                    if (not rtype.namespaced or not ns or obj_ns == ns)
                    and matches_selector(obj["metadata"].get("labels") or {}, selector)
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


PODS: ResourceKey = ("", "v1", "pods")
NODES: ResourceKey = ("", "v1", "nodes")
JOBS: ResourceKey = ("batch", "v1", "jobs")
JOBSETS: ResourceKey = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
VOLCANO_PODGROUPS: ResourceKey = ("scheduling.volcano.sh", "v1beta1", "podgroups")
COSCHEDULING_PODGROUPS: ResourceKey = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")


def _owner(api_version: str, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"], "controller": True}


def _pinned_node(pod_spec: dict[str, Any]) -> str | None:
    terms = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for term in terms:
        for field_req in term.get("matchFields") or []:
            if field_req.get("key") == "metadata.name" and field_req.get("operator") == "In":
                values = field_req.get("values") or []
                if len(values) == 1:
                    return str(values[0])
    return None


def run_job_controller(api: FakeApiServer, namespace: str) -> list[dict[str, Any]]:
    """Do what the JobSet and Job controllers plus the scheduler would: child Jobs, then one
    Pending pod per completion index, bound to the node its required affinity names.
    Idempotent; returns the pods created by this call."""
    for jobset in api.objects_of(JOBSETS, namespace):
        if jobset["spec"].get("suspend"):
            continue
        for rjob in jobset["spec"]["replicatedJobs"]:
            for i in range(rjob["replicas"]):
                name = f"{jobset['metadata']['name']}-{rjob['name']}-{i}"
                if api.get(JOBS, namespace, name) is not None:
                    continue
                template = json.loads(json.dumps(rjob["template"]))
                meta = template.get("metadata") or {}
                labels = dict(meta.get("labels") or {}) | {
                    "jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"],
                    "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                }
                api.put(
                    JOBS,
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {
                            "name": name,
                            "namespace": namespace,
                            "labels": labels,
                            "ownerReferences": [_owner("jobset.x-k8s.io/v1alpha2", "JobSet", jobset)],
                        },
                        "spec": template["spec"],
                    },
                )
    created: list[dict[str, Any]] = []
    for job in api.objects_of(JOBS, namespace):
        spec = job["spec"]
        if spec.get("suspend"):
            continue
        template = spec["template"]
        for index in range(spec.get("completions") or 1):
            name = f"{job['metadata']['name']}-{index}"
            if api.get(PODS, namespace, name) is not None:
                continue
            meta = template.get("metadata") or {}
            pod_spec = json.loads(json.dumps(template["spec"]))
            node = _pinned_node(pod_spec)
            if node is not None:
                pod_spec["nodeName"] = node
            created.append(
                api.put(
                    PODS,
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": name,
                            "namespace": namespace,
                            "labels": dict(meta.get("labels") or {})
                            | {
                                "job-name": job["metadata"]["name"],
                                "batch.kubernetes.io/job-completion-index": str(index),
                            },
                            "annotations": dict(meta.get("annotations") or {})
                            | {"batch.kubernetes.io/job-completion-index": str(index)},
                            "ownerReferences": [_owner("batch/v1", "Job", job)],
                        },
                        "spec": pod_spec,
                        "status": {"phase": "Pending"},
                    },
                )
            )
    return created


def set_pod_status(api: FakeApiServer, namespace: str, name: str, phase: str, **status: Any) -> dict[str, Any]:
    """What the kubelet does: move a pod to `phase`, with extra status fields (message, reason, …)."""
    pod = api.get(PODS, namespace, name)
    assert pod is not None, f"no pod {name}"
    pod = json.loads(json.dumps(pod))
    pod["status"] = {"phase": phase, **status}
    return api.put(PODS, pod)
