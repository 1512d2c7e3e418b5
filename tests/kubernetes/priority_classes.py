"""PriorityClasses (`scheduling.k8s.io/v1`, cluster-scoped) on the fake API server.

Every real API server serves them, and gpufleet's driver creates its `gpufleet-<class>` ones
before a run's pods, so the fake must serve them too. Registered here, at import of the
`tests.kubernetes` package, only if the fake does not serve them itself; validated like any
built-in kind (the client model's strict round trip) plus the API server's own PriorityClass
rules: a DNS-1123 subdomain name, a value within the user range, a known preemption policy.
"""

from __future__ import annotations

import re
from typing import Any

from tests.kubernetes import fake_apiserver as fake

KEY: fake.ResourceKey = ("scheduling.k8s.io", "v1", "priorityclasses")
USER_MAX = 1_000_000_000  # higher values are reserved for system classes
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_priority_class(body: dict[str, Any]) -> None:
    fake._round_trip(body, "V1PriorityClass")
    name = (body.get("metadata") or {}).get("name", "")
    if not _SUBDOMAIN.match(name) or len(name) > 253:
        raise fake.Invalid(f"metadata.name {name!r} is not a DNS-1123 subdomain")
    if name.startswith("system-"):
        raise fake.Invalid("priority class names with the prefix 'system-' are reserved")
    value = body.get("value")
    if not isinstance(value, int) or isinstance(value, bool) or not -USER_MAX <= value <= USER_MAX:
        raise fake.Invalid(f"value {value!r} must be an integer within ±{USER_MAX}")
    if body.get("preemptionPolicy", "PreemptLowerPriority") not in ("PreemptLowerPriority", "Never"):
        raise fake.Invalid(f"preemptionPolicy {body.get('preemptionPolicy')!r} is not supported")


if KEY not in fake.RESOURCES:
    fake.RESOURCES[KEY] = fake.ResourceType("PriorityClass", False, validate_priority_class, "V1PriorityClass")
