"""The composition root: the only package that picks adapters and wires them to the service layer.

Its modules: `wiring` (engine, unit of work factory, clock, migrations), `components` (which loops
and servers each component runs), `sim_fleet` and `real_fleet` (the cluster drivers a dispatcher
uses). This module re-exports what the CLI and the tests use from the composition root, so they
reach adapters only through it.
"""

from __future__ import annotations

from adapters.nats import secrets as nats_secrets
from adapters.nats.connection import INBOUND_ID_HEADER, connect
from adapters.nats.server import NatsClusterMember, NatsServerProcess
from adapters.nats.topology import as_json as topology_json
from controlplane.bootstrap.components import COMPONENTS, run_components
from controlplane.bootstrap.wiring import Wiring, migrate, utc_now
from controlplane.config import Settings
from controlplane.workers import loops

__all__ = [
    "COMPONENTS",
    "INBOUND_ID_HEADER",
    "NatsClusterMember",
    "NatsServerProcess",
    "Settings",
    "Wiring",
    "connect",
    "loops",
    "migrate",
    "nats_secrets",
    "run_components",
    "topology_json",
    "utc_now",
]
