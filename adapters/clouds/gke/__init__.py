"""Google GKE adapter."""

from adapters.clouds.gke.provider import GkeProvider, build

__all__ = ["GkeProvider", "build"]
