"""Kubernetes syntax rules as the API machinery states them (apimachinery validation)."""

from __future__ import annotations

import pytest

from controlplane.domain import kubernetes_syntax as k8s

LONGEST_PREFIX = ("s" * 63 + ".") * 3 + "s" * 61  # 253 characters


@pytest.mark.parametrize(
    "key",
    [
        "app",
        "app.kubernetes.io/name",
        "a_b.c-d",
        "A",
        "x" * 63,
        ("s" * 63 + ".") * 3 + "s" * 61 + "/n",
        "nvidia.com/gpu",
    ],
)
def test_valid_label_keys(key: str) -> None:
    assert k8s.qualified_name_errors(key) == []


@pytest.mark.parametrize(
    "key",
    # A final newline too: Python's `$` alone would match before it (the patterns are applied whole,
    # as the OpenAPI publishes them for ECMA-262 regular expressions).
    [
        "",
        "-a",
        "a-",
        "a b",
        "x" * 64,
        "/name",
        "Upper.COM/x",
        "a/b/c",
        ("s" * 63 + ".") * 4 + "s/n",
        "éclair",
        "a/",
        "app\n",
    ],
)
def test_invalid_label_keys(key: str) -> None:
    assert k8s.qualified_name_errors(key)


@pytest.mark.parametrize("value", ["", "v", "1.0_rc-2", "x" * 63])
def test_valid_label_values(value: str) -> None:
    assert k8s.label_value_errors(value) == []


@pytest.mark.parametrize("value", ["-v", "v-", "a b", "x" * 64, "a/b", "ü", "v\n"])
def test_invalid_label_values(value: str) -> None:
    assert k8s.label_value_errors(value)


def test_tolerations_follow_core_validation() -> None:
    assert k8s.toleration_errors("nvidia.com/gpu", "Exists", "", "NoSchedule") == []
    assert k8s.toleration_errors("dedicated", "Equal", "llm", "") == []
    assert k8s.toleration_errors("", "Exists", "", "") == []  # tolerates every taint
    assert k8s.toleration_errors("", "Equal", "x", "")  # an empty key needs Exists
    assert k8s.toleration_errors("k", "Exists", "v", "")  # Exists takes no value
    assert k8s.toleration_errors("k", "In", "", "")
    assert k8s.toleration_errors("k", "Equal", "", "Never")
    assert k8s.toleration_errors("bad key", "Exists", "", "")


def test_dns_names() -> None:
    assert k8s.dns1123_label_errors("llm-train") == []
    assert k8s.dns1123_label_errors("LLM")
    assert k8s.dns1123_label_errors("x" * 64)
    assert k8s.dns1123_subdomain_errors("a.b-c.d") == []
    assert k8s.dns1123_subdomain_errors("a..b")


def test_dns_names_and_extended_resources_refuse_a_final_newline() -> None:
    assert k8s.dns1123_label_errors("llm\n")
    assert k8s.dns1123_subdomain_errors("a.b\n")
    assert k8s.is_extended_resource("nvidia.com/gpu.shared")
    assert not k8s.is_extended_resource("nvidia.com/gpu\n")
    assert not k8s.is_extended_resource("kubernetes.io/gpu")
