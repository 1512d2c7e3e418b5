"""AWS EKS adapter."""

from adapters.clouds.eks.provider import EksProvider, build

__all__ = ["EksProvider", "build"]
