"""What a real API server refuses beyond the OpenAPI schemas: validation, defaulting and admission.

Every rule names its upstream source. Kubernetes sources are `kubernetes/kubernetes` (v1.3x):
- `apimachinery/pkg/util/validation/validation.go`: IsDNS1123Label (63), IsDNS1123Subdomain (253),
  IsDNS1035Label, IsQualifiedName (prefix <= 253 + name <= 63), IsValidLabelValue (63);
- `apimachinery/pkg/api/validation/objectmeta.go`: ValidateObjectMeta, annotations <= 256 KiB;
- `pkg/apis/core/validation/validation.go`: ValidatePodSpec (hostname and subdomain are DNS-1123
  labels, tolerations, node affinity, priorityClassName), validateResourceRequirements
  ("must be an integer", "must be equal to <r> limit", "Limit must be set for non overcommitable
  resources", "must be less than or equal to <r> limit"), validateContainersOnlyForPod (image);
- `pkg/apis/batch/validation/validation.go`: ValidateJob (name a DNS subdomain; the generated
  `job-name` / `batch.kubernetes.io/job-name` labels must be label values, so <= 63; an Indexed
  Job's longest pod hostname `<name>-<completions-1>` must be a DNS-1123 label), validateJobSpec
  (Indexed needs completions; parallelism <= 100000 when Indexed; backoffLimitPerIndex /
  maxFailedIndexes rules; restartPolicy Never|OnFailure; podFailurePolicy needs Never);
- `plugin/pkg/admission/priority/admission.go`: a pod naming a PriorityClass that does not exist is
  Forbidden ("no PriorityClass with name X was found"); system classes only in kube-system;
  `pkg/apis/scheduling/validation`: user classes <= 1000000000, not named `system-*`.
JobSet: `kubernetes-sigs/jobset` `pkg/webhooks/jobset_webhook.go` (Default and ValidateCreate) and
`pkg/util/placement/placement.go` (GenJobName `<js>-<rjob>-<i>`, GenPodName `<js>-<rjob>-<i>-<j>`).

Kubernetes does NOT refuse an Indexed Job whose parallelism exceeds its completions (the Job
controller simply never runs more pods than remaining indexes), nor completions above 100000
(only a warning, unless backoffLimitPerIndex is set): this module does not either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from tests.kubernetes.quantity import QuantityError, format_quantity, parse_quantity
from tests.kubernetes.schemas import builtin_schema_errors, custom_schema_errors

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
QUALIFIED_NAME_MAX = 63
TOTAL_ANNOTATION_SIZE = 256 * 1024  # objectmeta.go TotalAnnotationSizeLimitB
MAX_PARALLELISM_INDEXED = 100_000  # batch validation maxParallelismForIndexedJob
MAX_FAILED_INDEXES = 100_000  # maxFailedIndexesForIndexedJob
COMPLETIONS_SOFT_LIMIT = 100_000  # completionsSoftLimit
PARALLELISM_HIGH_COMPLETIONS = 10_000  # parallelismLimitForHighCompletions
MAX_FAILED_INDEXES_HIGH_COMPLETIONS = 10_000  # maxFailedIndexesLimitForHighCompletions
HIGHEST_USER_PRIORITY = 1_000_000_000  # scheduling.HighestUserDefinablePriority
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
MAX_INT32 = 2**31 - 1
JOBSET_POD_SUFFIX = "-abcde"  # the webhook's stand-in for the 5-character random pod name suffix

NATIVE_RESOURCES = {"cpu", "memory", "ephemeral-storage", "pods"}
TOLERATION_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
SELECTOR_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}


class Invalid(Exception):
    """A write the real API server refuses with 422 Invalid."""

    def __init__(self, message: str, causes: list[str] | None = None) -> None:
        super().__init__(message)
        self.causes = causes or [message]


class Forbidden(Exception):
    """A write an admission plugin refuses with 403 Forbidden."""


class Denied(Exception):
    """An admission webhook without its own status code refused the write: 400 (webhook ToStatusErr)."""

    def __init__(self, webhook: str, message: str) -> None:
        super().__init__(f'admission webhook "{webhook}" denied the request: {message}')


def volcano_queue_admission(body: Mapping[str, Any], queues: Mapping[str, str]) -> None:
    """Volcano's PodGroup validating webhook (pkg/webhooks/admission/podgroups/validate,
    checkQueueState): the queue must exist and be Open. The CRD defaults the queue to `default`,
    which a Volcano install creates."""
    queue = (body.get("spec") or {}).get("queue", "default")
    if not queue:
        return
    if queue not in queues:
        raise Denied(
            "validatepodgroup.volcano.sh", f'unable to find queue: queue.scheduling.volcano.sh "{queue}" not found'
        )
    if queues[queue] != "Open":
        raise Denied(
            "validatepodgroup.volcano.sh",
            f"can only submit PodGroup to queue with state `Open`, queue `{queue}` status is `{queues[queue]}`.",
        )


class Errors:
    """Field errors collected like `field.ErrorList`, raised as one Invalid."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")

    def extend(self, messages: list[str]) -> None:
        self.items.extend(messages)

    def raise_for(self, kind: str, name: str) -> None:
        if not self.items:
            return
        joined = self.items[0] if len(self.items) == 1 else "[" + ", ".join(self.items) + "]"
        raise Invalid(f'{kind} "{name}" is invalid: {joined}', list(self.items))


# -- names and labels (apimachinery util/validation) -----------------------------------------


def dns1123_label_errors(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_LABEL_MAX:
        errors.append(f"must be no more than {DNS1123_LABEL_MAX} characters")
    if not DNS1123_LABEL.match(value):
        errors.append("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")
    return errors


def dns1123_subdomain_errors(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errors.append(f"must be no more than {DNS1123_SUBDOMAIN_MAX} characters")
    if not DNS1123_SUBDOMAIN.match(value):
        errors.append("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'")
    return errors


def dns1035_label_errors(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_LABEL_MAX:
        errors.append(f"must be no more than {DNS1123_LABEL_MAX} characters")
    if not DNS1035_LABEL.match(value):
        errors.append("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with a letter")
    return errors


def qualified_name_errors(key: str) -> list[str]:
    if key.count("/") > 1:
        return [
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', "
            "with an optional DNS subdomain prefix and '/'"
        ]
    prefix, slash, name = key.rpartition("/")
    errors = []
    if slash and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix:
        errors.extend(f"prefix part {e}" for e in dns1123_subdomain_errors(prefix))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > QUALIFIED_NAME_MAX:
        errors.append(f"name part must be no more than {QUALIFIED_NAME_MAX} characters")
    elif not QUALIFIED_NAME.match(name):
        errors.append("name part must consist of alphanumeric characters, '-', '_' or '.'")
    return errors


def label_value_errors(value: Any) -> list[str]:
    if not isinstance(value, str):
        return ["must be a string"]
    errors = []
    if len(value) > LABEL_VALUE_MAX:
        errors.append(f"must be no more than {LABEL_VALUE_MAX} characters")
    if not LABEL_VALUE.match(value):
        errors.append("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'")
    return errors


def check_labels(errs: Errors, labels: Mapping[str, Any] | None, path: str) -> None:
    for key, value in (labels or {}).items():
        for message in qualified_name_errors(key):
            errs.add(f"{path}", f'Invalid value: "{key}": {message}')
        for message in label_value_errors(value):
            errs.add(f"{path}", f'Invalid value: "{value}": {message} (label {key})')


def check_annotations(errs: Errors, annotations: Mapping[str, Any] | None, path: str) -> None:
    total = 0
    for key, value in (annotations or {}).items():
        for message in qualified_name_errors(key.lower()):
            errs.add(path, f'Invalid value: "{key}": {message}')
        total += len(key) + len(str(value))
    if total > TOTAL_ANNOTATION_SIZE:
        errs.add(path, f"Too long: must have at most {TOTAL_ANNOTATION_SIZE} bytes")


NameRule = Callable[[str], list[str]]


def check_object_meta(errs: Errors, meta: Mapping[str, Any], name_rule: NameRule, path: str = "metadata") -> None:
    name = meta.get("name")
    if not name:
        errs.add(f"{path}.name", "Required value: name or generateName is required")
    else:
        for message in name_rule(str(name)):
            errs.add(f"{path}.name", f'Invalid value: "{name}": {message}')
    check_labels(errs, meta.get("labels"), f"{path}.labels")
    check_annotations(errs, meta.get("annotations"), f"{path}.annotations")


# -- pod spec (core validation) --------------------------------------------------------------


def _is_extended(resource: str) -> bool:
    # helper.IsExtendedResourceName: fully qualified, not in the kubernetes.io domain, not requests.*
    return (
        "/" in resource
        and not resource.split("/", maxsplit=1)[0].endswith("kubernetes.io")
        and not resource.startswith("requests.")
    )


def _is_hugepages(resource: str) -> bool:
    return resource.startswith("hugepages-")


def container_requests(container: Mapping[str, Any]) -> dict[str, Fraction]:
    """Effective requests after defaulting: a resource with only a limit requests its limit."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    out: dict[str, Fraction] = {}
    for name in set(limits) | set(requests):
        raw = requests.get(name, limits.get(name))
        try:
            out[name] = parse_quantity(raw)
        except QuantityError:
            continue
    return out


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """What the scheduler counts: sum over containers, at least the largest init container, plus overhead."""
    total: dict[str, Fraction] = {}
    for container in pod_spec.get("containers") or []:
        for name, amount in container_requests(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in pod_spec.get("initContainers") or []:
        for name, amount in container_requests(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    for name, raw in (pod_spec.get("overhead") or {}).items():
        total[name] = total.get(name, Fraction(0)) + parse_quantity(raw)
    return total


def _check_resources(errs: Errors, container: Mapping[str, Any], path: str) -> None:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    parsed: dict[str, dict[str, Fraction]] = {"limits": {}, "requests": {}}
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, raw in values.items():
            where = f"{path}.resources.{kind}[{name}]"
            if "/" not in name and name not in NATIVE_RESOURCES and not _is_hugepages(name):
                errs.add(where, f'Invalid value: "{name}": must be a standard resource for containers')
                continue
            if "/" in name:
                for message in qualified_name_errors(name):
                    errs.add(where, f'Invalid value: "{name}": {message}')
            try:
                value = parse_quantity(raw)
            except QuantityError as exc:
                errs.add(where, f"Invalid value: {raw!r}: {exc}")
                continue
            if value < 0:
                errs.add(where, f'Invalid value: "{raw}": must be greater than or equal to 0')
            # ValidateResourceQuantityValue: integer resources (extended ones among them)
            if _is_extended(name) and value.denominator != 1:
                errs.add(where, f'Invalid value: "{raw}": must be an integer')
            parsed[kind][name] = value
    for name, value in parsed["requests"].items():
        where = f"{path}.resources.requests[{name}]"
        limit = parsed["limits"].get(name)
        overcommit = not (_is_extended(name) or _is_hugepages(name))  # helper.IsOvercommitAllowed
        if limit is None:
            if not overcommit:
                errs.add(
                    f"{path}.resources.limits[{name}]",
                    "Required value: Limit must be set for non overcommitable resources",
                )
        elif value != limit and not overcommit:
            errs.add(
                where,
                f'Invalid value: "{format_quantity(value)}": must be equal to {name} limit of {format_quantity(limit)}',
            )
        elif value > limit:
            errs.add(
                where,
                f'Invalid value: "{format_quantity(value)}": '
                f"must be less than or equal to {name} limit of {format_quantity(limit)}",
            )


def _check_selector_requirement(errs: Errors, req: Mapping[str, Any], path: str, *, field: bool) -> None:
    op, values, key = req.get("operator"), req.get("values") or [], req.get("key", "")
    if op not in SELECTOR_OPERATORS:
        errs.add(f"{path}.operator", f'Unsupported value: "{op}"')
        return
    if field:
        # validateNodeFieldSelectorRequirement: only metadata.name, In/NotIn, exactly one value
        if key != "metadata.name":
            errs.add(f"{path}.key", f'Invalid value: "{key}": not a valid field selector key')
        if op not in ("In", "NotIn") or len(values) != 1:
            errs.add(
                f"{path}.values",
                "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
            )
        return
    for message in qualified_name_errors(key):
        errs.add(f"{path}.key", f'Invalid value: "{key}": {message}')
    if op in ("In", "NotIn") and not values:
        errs.add(f"{path}.values", "Required value: must be specified when `operator` is 'In' or 'NotIn'")
    if op in ("Exists", "DoesNotExist") and values:
        errs.add(f"{path}.values", "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
    if op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", str(values[0]))):
        errs.add(f"{path}.values", "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'")


def _check_affinity(errs: Errors, affinity: Mapping[str, Any], path: str) -> None:
    required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or None
    if required is None:
        return
    terms = required.get("nodeSelectorTerms") or []
    where = f"{path}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    if not terms:
        errs.add(where, "Required value: must have at least one node selector term")
    for i, term in enumerate(terms):
        for j, req in enumerate(term.get("matchExpressions") or []):
            _check_selector_requirement(errs, req, f"{where}[{i}].matchExpressions[{j}]", field=False)
        for j, req in enumerate(term.get("matchFields") or []):
            _check_selector_requirement(errs, req, f"{where}[{i}].matchFields[{j}]", field=True)


def _check_tolerations(errs: Errors, tolerations: list[Mapping[str, Any]], path: str) -> None:
    for i, tol in enumerate(tolerations):
        where = f"{path}[{i}]"
        key, op, value, effect = (
            tol.get("key", ""),
            tol.get("operator", "Equal"),
            tol.get("value", ""),
            tol.get("effect", ""),
        )
        if key:
            for message in qualified_name_errors(key):
                errs.add(f"{where}.key", f'Invalid value: "{key}": {message}')
        elif op != "Exists":
            errs.add(f"{where}.operator", f'Invalid value: "{op}": operator must be Exists when `key` is empty')
        if op == "Exists" and value:
            errs.add(f"{where}.operator", "Invalid value: value must be empty when `operator` is 'Exists'")
        elif op not in ("Exists", "Equal"):
            errs.add(f"{where}.operator", f'Unsupported value: "{op}"')
        elif op == "Equal":
            for message in label_value_errors(value):
                errs.add(f"{where}.value", f'Invalid value: "{value}": {message}')
        if effect and effect not in TOLERATION_EFFECTS:
            errs.add(f"{where}.effect", f'Unsupported value: "{effect}"')
        if tol.get("tolerationSeconds") is not None and effect != "NoExecute":
            errs.add(f"{where}.effect", "Invalid value: effect must be 'NoExecute' when `tolerationSeconds` is set")


def check_pod_spec(errs: Errors, spec: Mapping[str, Any], path: str, *, is_pod: bool) -> None:
    containers = spec.get("containers") or []
    if not containers:
        errs.add(f"{path}.containers", "Required value")
    names: set[str] = set()
    for kind in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(kind) or []):
            where = f"{path}.{kind}[{i}]"
            name = container.get("name", "")
            for message in dns1123_label_errors(name):
                errs.add(f"{where}.name", f'Invalid value: "{name}": {message}')
            if name in names:
                errs.add(f"{where}.name", f'Duplicate value: "{name}"')
            names.add(name)
            # validateContainersOnlyForPod: templates may leave the image to be filled in later
            if is_pod and not container.get("image"):
                errs.add(f"{where}.image", "Required value")
            _check_resources(errs, container, where)
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure", "Never"):
        errs.add(f"{path}.restartPolicy", f'Unsupported value: "{policy}"')
    for field in ("hostname", "subdomain"):
        if spec.get(field):
            for message in dns1123_label_errors(spec[field]):
                errs.add(f"{path}.{field}", f'Invalid value: "{spec[field]}": {message}')
    for field in ("priorityClassName", "schedulerName", "serviceAccountName"):
        if spec.get(field):
            for message in dns1123_subdomain_errors(spec[field]):
                errs.add(f"{path}.{field}", f'Invalid value: "{spec[field]}": {message}')
    check_labels(errs, spec.get("nodeSelector"), f"{path}.nodeSelector")
    if spec.get("nodeName"):
        for message in dns1123_subdomain_errors(spec["nodeName"]):
            errs.add(f"{path}.nodeName", f'Invalid value: "{spec["nodeName"]}": {message}')
    _check_tolerations(errs, spec.get("tolerations") or [], f"{path}.tolerations")
    if spec.get("affinity"):
        _check_affinity(errs, spec["affinity"], f"{path}.affinity")


def check_pod_template(errs: Errors, template: Mapping[str, Any], path: str) -> None:
    meta = template.get("metadata") or {}
    check_labels(errs, meta.get("labels"), f"{path}.metadata.labels")
    check_annotations(errs, meta.get("annotations"), f"{path}.metadata.annotations")
    check_pod_spec(errs, template.get("spec") or {}, f"{path}.spec", is_pod=False)


# -- kinds -----------------------------------------------------------------------------------


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name", ""))


def validate_pod(body: dict[str, Any]) -> None:
    errs = Errors()
    errs.extend(builtin_schema_errors(body))
    check_object_meta(errs, body.get("metadata") or {}, dns1123_subdomain_errors)
    check_pod_spec(errs, body.get("spec") or {}, "spec", is_pod=True)
    errs.raise_for("Pod", _name(body))


def validate_node(body: dict[str, Any]) -> None:
    errs = Errors()
    errs.extend(builtin_schema_errors(body))
    check_object_meta(errs, body.get("metadata") or {}, dns1123_subdomain_errors)  # ValidateNodeName
    for i, taint in enumerate((body.get("spec") or {}).get("taints") or []):
        for message in qualified_name_errors(taint.get("key", "")):
            errs.add(f"spec.taints[{i}].key", message)
        for message in label_value_errors(taint.get("value", "")):
            errs.add(f"spec.taints[{i}].value", message)
        if taint.get("effect") not in TOLERATION_EFFECTS:
            errs.add(f"spec.taints[{i}].effect", f'Unsupported value: "{taint.get("effect")}"')
    for kind in ("capacity", "allocatable"):
        for name, raw in ((body.get("status") or {}).get(kind) or {}).items():
            try:
                value = parse_quantity(raw)
            except QuantityError as exc:
                errs.add(f"status.{kind}[{name}]", str(exc))
                continue
            if _is_extended(name) and value.denominator != 1:
                errs.add(f"status.{kind}[{name}]", f'Invalid value: "{raw}": must be an integer')
    errs.raise_for("Node", _name(body))


def validate_priority_class(body: dict[str, Any]) -> None:
    errs = Errors()
    errs.extend(builtin_schema_errors(body))
    check_object_meta(errs, body.get("metadata") or {}, dns1123_subdomain_errors)
    name, value = _name(body), body.get("value")
    if name.startswith("system-") and name not in SYSTEM_PRIORITY_CLASSES:
        errs.add("metadata.name", f"Invalid value: \"{name}\": priority class names with 'system-' prefix are reserved")
    if isinstance(value, int) and value > HIGHEST_USER_PRIORITY and name not in SYSTEM_PRIORITY_CLASSES:
        errs.add("value", f"Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_PRIORITY}")
    errs.raise_for("PriorityClass.scheduling.k8s.io", name)


def validate_namespace(body: dict[str, Any]) -> None:
    errs = Errors()
    errs.extend(builtin_schema_errors(body))
    check_object_meta(errs, body.get("metadata") or {}, dns1123_label_errors)  # ValidateNamespaceName
    errs.raise_for("Namespace", _name(body))


def check_job_spec(errs: Errors, spec: Mapping[str, Any], path: str) -> None:
    """validateJobSpec (batch validation), shared by Jobs and JobSet child Jobs."""
    indexed = spec.get("completionMode") == "Indexed"
    completions, parallelism = spec.get("completions"), spec.get("parallelism")
    per_index, max_failed = spec.get("backoffLimitPerIndex"), spec.get("maxFailedIndexes")
    if max_failed is not None and per_index is None:
        errs.add(f"{path}.backoffLimitPerIndex", "Required value: when maxFailedIndexes is specified")
    if indexed:
        if completions is None:
            errs.add(f"{path}.completions", "Required value: when completion mode is Indexed")
        if isinstance(parallelism, int) and parallelism > MAX_PARALLELISM_INDEXED:
            errs.add(
                f"{path}.parallelism",
                f"Invalid value: {parallelism}: "
                f"must be less than or equal to {MAX_PARALLELISM_INDEXED} when completion mode is Indexed",
            )
        if isinstance(completions, int) and isinstance(max_failed, int) and max_failed > completions:
            errs.add(
                f"{path}.maxFailedIndexes", f"Invalid value: {max_failed}: must be less than or equal to completions"
            )
        if isinstance(max_failed, int) and max_failed > MAX_FAILED_INDEXES:
            errs.add(
                f"{path}.maxFailedIndexes",
                f"Invalid value: {max_failed}: must be less than or equal to {MAX_FAILED_INDEXES}",
            )
        if isinstance(completions, int) and completions > COMPLETIONS_SOFT_LIMIT and per_index is not None:
            if max_failed is None:
                errs.add(
                    f"{path}.maxFailedIndexes",
                    f"Required value: must be specified when completions is above {COMPLETIONS_SOFT_LIMIT}",
                )
            if isinstance(parallelism, int) and parallelism > PARALLELISM_HIGH_COMPLETIONS:
                errs.add(
                    f"{path}.parallelism",
                    f"Invalid value: {parallelism}: must be less than or equal to {PARALLELISM_HIGH_COMPLETIONS} "
                    f"when completions are above {COMPLETIONS_SOFT_LIMIT} and used with backoff limit per index",
                )
            if isinstance(max_failed, int) and max_failed > MAX_FAILED_INDEXES_HIGH_COMPLETIONS:
                errs.add(
                    f"{path}.maxFailedIndexes",
                    f"Invalid value: {max_failed}: must be less than or equal to {MAX_FAILED_INDEXES_HIGH_COMPLETIONS} "
                    f"when completions are above {COMPLETIONS_SOFT_LIMIT} and used with backoff limit per index",
                )
    else:
        if per_index is not None:
            errs.add(f"{path}.backoffLimitPerIndex", f"Invalid value: {per_index}: requires indexed completion mode")
        if max_failed is not None:
            errs.add(f"{path}.maxFailedIndexes", f"Invalid value: {max_failed}: requires indexed completion mode")
        if spec.get("successPolicy") is not None:
            errs.add(f"{path}.successPolicy", "Invalid value: requires indexed completion mode")
    template = spec.get("template") or {}
    check_pod_template(errs, template, f"{path}.template")
    policy = (template.get("spec") or {}).get("restartPolicy", "")
    if policy in ("", "Always"):
        errs.add(f"{path}.template.spec.restartPolicy", 'Required value: valid values: "OnFailure", "Never"')
    elif spec.get("podFailurePolicy") is not None and policy != "Never":
        errs.add(
            f"{path}.template.spec.restartPolicy",
            'Invalid value: only "Never" is supported when podFailurePolicy is specified',
        )


def check_job_names(errs: Errors, name: str, spec: Mapping[str, Any]) -> None:
    """ValidateJob: the generated job-name labels and the longest Indexed pod hostname."""
    for message in label_value_errors(name):
        # validateGeneratedSelector: the defaulted template carries job-name=<name>
        errs.add(
            "spec.template.metadata.labels", f'Invalid value: "{name}": {message} (label batch.kubernetes.io/job-name)'
        )
    completions = spec.get("completions")
    if spec.get("completionMode") == "Indexed" and isinstance(completions, int) and completions > 0:
        hostname = f"{name}-{completions - 1}"
        if dns1123_label_errors(hostname):
            errs.add(
                "metadata.name",
                f'Invalid value: "{name}": will not able to create pod with invalid DNS label: {hostname}',
            )


def validate_job(body: dict[str, Any]) -> None:
    errs = Errors()
    errs.extend(builtin_schema_errors(body))
    meta = body.get("metadata") or {}
    check_object_meta(errs, meta, dns1123_subdomain_errors)  # ValidateReplicationControllerName
    spec = body.get("spec") or {}
    check_job_names(errs, _name(body), spec)
    check_job_spec(errs, spec, "spec")
    errs.raise_for("Job.batch", _name(body))


def default_job(body: dict[str, Any]) -> None:
    """What the Job strategy and defaulting add on create (the generated selector and labels)."""
    meta, spec = body["metadata"], body.setdefault("spec", {})
    uid, name = meta["uid"], meta["name"]
    if not spec.get("manualSelector"):
        spec.setdefault("selector", {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
        labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
        for key, value in (
            ("batch.kubernetes.io/controller-uid", uid),
            ("batch.kubernetes.io/job-name", name),
            ("controller-uid", uid),
            ("job-name", name),
        ):
            labels.setdefault(key, value)
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1  # both unset: one pod; parallelism alone: a work queue, no completions
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6 if spec.get("backoffLimitPerIndex") is None else MAX_INT32)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)


# -- custom resources ------------------------------------------------------------------------


def _validate_custom(body: dict[str, Any], group: str, version: str, plural: str, kind: str) -> Errors:
    errs = Errors()
    if body.get("apiVersion") != f"{group}/{version}" or body.get("kind") != kind:
        errs.add("apiVersion", f"expected {group}/{version} {kind}, got {body.get('apiVersion')} {body.get('kind')}")
    errs.extend(custom_schema_errors(body, group, version, plural))
    # customresource strategy: ValidateObjectMetaAccessor with NameIsDNSSubdomain
    check_object_meta(errs, body.get("metadata") or {}, dns1123_subdomain_errors)
    return errs


def validate_volcano_pod_group(body: dict[str, Any]) -> None:
    errs = _validate_custom(body, "scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")
    errs.raise_for("PodGroup.scheduling.volcano.sh", _name(body))


def validate_coscheduling_pod_group(body: dict[str, Any]) -> None:
    errs = _validate_custom(body, "scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
    errs.raise_for("PodGroup.scheduling.x-k8s.io", _name(body))


def default_jobset(body: dict[str, Any]) -> None:
    """jobSetWebhook.Default plus the CRD defaults the checks depend on."""
    spec = body.setdefault("spec", {})
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for rjob in spec.get("replicatedJobs") or []:
        if not isinstance(rjob, dict):
            continue
        rjob.setdefault("groupName", "default")  # CRD default
        rjob.setdefault("replicas", 1)  # CRD default
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        job_spec.setdefault("template", {}).setdefault("spec", {}).setdefault("restartPolicy", "OnFailure")


def _jobset_webhook(errs: Errors, body: Mapping[str, Any]) -> None:
    """jobSetWebhook.ValidateCreate, on the defaulted object."""
    name = _name(body)
    spec = body.get("spec") or {}
    rjobs = [r for r in spec.get("replicatedJobs") or [] if isinstance(r, dict)]
    if rjobs and rjobs[0].get("dependsOn"):
        errs.add("spec.replicatedJobs[0].dependsOn", "DependsOn can't be set for the first ReplicatedJob")
    # CEL rule on spec (the CRD's x-kubernetes-validations)
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder" and any(
        r.get("dependsOn") for r in rjobs
    ):
        errs.add("spec", "Invalid value: StartupPolicy and DependsOn APIs are mutually exclusive")
    subdomain = (spec.get("network") or {}).get("subdomain")
    if subdomain:
        for message in dns1123_subdomain_errors(subdomain) + dns1035_label_errors(subdomain):
            errs.add("spec.network.subdomain", f'Invalid value: "{subdomain}": {message}')
    managed_by = spec.get("managedBy")
    if managed_by is not None and (len(managed_by) > 63 or "/" not in managed_by):
        errs.add(
            "spec.managedBy", f'Invalid value: "{managed_by}": must be a domain-prefixed path of at most 63 characters'
        )
    seen: list[str] = []
    for i, rjob in enumerate(rjobs):
        where = f"spec.replicatedJobs[{i}]"
        rname = str(rjob.get("name", ""))
        replicas = rjob.get("replicas", 1)
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        parallelism = job_spec.get("parallelism", 1)
        if isinstance(replicas, int) and isinstance(parallelism, int) and replicas * parallelism > MAX_INT32:
            errs.add(
                where,
                f"the product of replicas and parallelism must not exceed {MAX_INT32} for replicatedJob '{rname}'",
            )
        for message in dns1035_label_errors(str(rjob.get("groupName", "default"))):
            errs.add(f"{where}.groupName", f'Invalid value: "{rjob.get("groupName")}": {message}')
        if not isinstance(replicas, int):
            continue
        longest_job = f"{name}-{rname}-{replicas - 1}"  # placement.GenJobName
        for problem in dns1035_label_errors(longest_job):
            if "no more than" in problem:
                problem = "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"  # noqa: PLW2901
            errs.add(f"{where}.name", f'Invalid value: "{longest_job}": {problem}')
        completions = job_spec.get("completions")
        if job_spec.get("completionMode") == "Indexed" and isinstance(completions, int):
            # placement.GenPodName plus the 5-character random suffix of the pod name
            longest_pod = f"{name}-{rname}-{replicas - 1}-{completions - 1}{JOBSET_POD_SUFFIX}"
            for problem in dns1035_label_errors(longest_pod):
                if "no more than" in problem:
                    problem = "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"  # noqa: PLW2901
                errs.add(f"{where}.name", f'Invalid value: "{longest_job}": {problem}')
        for dep in rjob.get("dependsOn") or []:
            if dep.get("name") not in seen:
                errs.add(
                    f"{where}.dependsOn", f"replicatedJob: {rname} cannot depend on replicatedJob: {dep.get('name')}"
                )
        seen.append(rname)
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in seen:
            errs.add(
                "spec.successPolicy", f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs"
            )
    for rule in (spec.get("failurePolicy") or {}).get("rules") or []:
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in seen:
                errs.add(
                    "spec.failurePolicy",
                    f"invalid replicatedJob name '{target}' in failure policy does not appear in .spec.ReplicatedJobs",
                )
    coordinator = spec.get("coordinator")
    if coordinator is not None and coordinator.get("replicatedJob") not in seen:
        errs.add("spec.coordinator", f"coordinator replicatedJob {coordinator.get('replicatedJob')} does not exist")


def validate_jobset(body: dict[str, Any]) -> None:
    """What creating a JobSet meets: the CRD schema, then the webhook (after its defaulting).
    The child Jobs are not validated here: a real cluster accepts the JobSet and only its
    controller's Job creation fails (`controllers.validate_jobset_and_children` checks both)."""
    errs = _validate_custom(body, "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
    errs.raise_for("JobSet.jobset.x-k8s.io", _name(body))
    defaulted = _deep_copy(body)
    default_jobset(defaulted)
    _jobset_webhook(errs, defaulted)
    try:
        errs.raise_for("JobSet.jobset.x-k8s.io", _name(body))
    except Invalid as exc:  # controller-runtime passes the webhook's 422 through, named
        raise Invalid(f'admission webhook "vjobset.kb.io" denied the request: {exc}', exc.causes) from None


def _deep_copy(body: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(body))
    return copied


def priority_of(
    pod: dict[str, Any], namespace: str, lookup: Callable[[str], dict[str, Any] | None], default: int
) -> int:
    """The Priority admission plugin on pod create: resolve the class or refuse the pod."""
    spec = pod.get("spec") or {}
    name = spec.get("priorityClassName") or ""
    pod_name = _name(pod)
    if not name:
        priority = default
    elif name in SYSTEM_PRIORITY_CLASSES:
        if namespace != "kube-system":
            raise Forbidden(
                f'pods "{pod_name}" is forbidden: '
                f"pods with {name} priorityClass is not permitted in {namespace} namespace"
            )
        priority = SYSTEM_PRIORITY_CLASSES[name]
    else:
        found = lookup(name)
        if found is None:
            raise Forbidden(f'pods "{pod_name}" is forbidden: no PriorityClass with name {name} was found')
        priority = int(found.get("value", 0))
    given = spec.get("priority")
    if given is not None and given != priority:
        raise Forbidden(
            f'pods "{pod_name}" is forbidden: '
            f"the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {priority} from the given PriorityClass name"
        )
    return priority
