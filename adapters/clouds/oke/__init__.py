"""Oracle OKE adapter."""

from adapters.clouds.oke.provider import OkeProvider, build

__all__ = ["OkeProvider", "build"]
