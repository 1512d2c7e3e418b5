"""Azure AKS adapter."""

from adapters.clouds.aks.provider import AksProvider, build

__all__ = ["AksProvider", "build"]
