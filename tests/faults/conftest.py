"""The fault suite reuses the integration fixtures (REST app over the test database, a tenant)."""

from tests.integration.conftest import admin, client, tenant

__all__ = ["admin", "client", "tenant"]
