"""Managed-Kubernetes cloud adapters (EKS, AKS, GKE, OKE) behind `controlplane.service.cloud_ports`.

`build_provider` wires an adapter to its real SDK with that SDK's default credential chain; keyword
overrides point its client at another endpoint (a local fake in tests, a sovereign or private cloud in
use) or hand in credentials.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from controlplane.service.cloud_ports import PROVIDERS, CloudProvider


def build_provider(provider: str, **overrides: Any) -> CloudProvider:
    """The adapter for `provider` (eks | aks | gke | oke).

    eks: `endpoint_url` (EKS), `sts_endpoint_url`, `session` (a boto3 Session).
    aks: `base_url` (ARM), `credential` (a TokenCredential; default DefaultAzureCredential),
         `client_kwargs` (extra ContainerServiceClient arguments, e.g. `authentication_policy`).
    gke: `api_endpoint`, `transport` ("grpc" by default; "rest" for HTTP endpoints), `credentials`
         (google.auth credentials; default ADC), `client_credentials` (for the API client, if different).
    oke: `config` (an OCI config dict; default ~/.oci/config), `service_endpoint`.
    """
    if provider not in PROVIDERS:
        raise ValueError(f"provider '{provider}' is not one of {', '.join(PROVIDERS)}")
    # Imported on demand: each SDK takes a second or more and tens of MiB to import, and a deployment
    # usually talks to one or two clouds.
    build: Callable[..., CloudProvider] = importlib.import_module(f"adapters.clouds.{provider}").build
    return build(**overrides)


__all__ = ["build_provider"]
