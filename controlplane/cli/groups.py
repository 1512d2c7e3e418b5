"""The `gpufleet server` and `gpufleet dev` groups: what runs the control plane, and the developers'
tools. Lazy like the top level (`lazy_group`), so `gpufleet server --help` imports no daemon.
"""

from __future__ import annotations

from controlplane.cli.lazy_group import Lazy, LazyGroup

_SERVER = "controlplane.cli.server_commands"

# `gpufleet server ...`: the daemons and the setup steps of a deployed control plane.
SERVER_COMMANDS: dict[str, dict[str, Lazy]] = {
    "Run everything on this machine": {
        "up": Lazy(f"{_SERVER}:up", "Run all of gpufleet locally, with a simulated fleet (the same as `gpufleet up`)."),
    },
    "Set up a deployed control plane": {
        "init": Lazy(f"{_SERVER}:init", "Migrate, seed defaults, issue the first admin token."),
        "migrate": Lazy(f"{_SERVER}:migrate", "Bring the database to the newest schema."),
        "create-admin-token": Lazy(f"{_SERVER}:create_admin_token", "Issue an admin (or metrics) API token."),
        "nats-topology": Lazy(f"{_SERVER}:nats_topology", "Print the JetStream streams and consumers it declares."),
        "nats-auth-config": Lazy(f"{_SERVER}:nats_auth_config", "Write a nats-server config for an external server."),
    },
    "Run one part": {
        "serve": Lazy(f"{_SERVER}:serve", "Run the REST API."),
        "run": Lazy(f"{_SERVER}:run_many", "Run several components in one process."),
        "scheduler": Lazy(f"{_SERVER}:scheduler", "Run the scheduler."),
        "dispatcher": Lazy(f"{_SERVER}:dispatcher", "Run the dispatcher."),
        "ingest": Lazy(f"{_SERVER}:ingest", "Run the ingest."),
        "relay": Lazy(f"{_SERVER}:relay", "Run the relay."),
    },
}

DEV_COMMANDS: dict[str, dict[str, Lazy]] = {
    "Developer tools": {
        "bench": Lazy("controlplane.cli.bench_commands:bench", "Measure the scheduling core and the services."),
        "sim": Lazy("controlplane.cli.sim_commands:sim", "Trace-driven simulations of the scheduling policies."),
        "scenario": Lazy("controlplane.cli.scenario_commands:scenario", "Run scenarios through the scheduling core."),
    },
}

server = LazyGroup(
    name="server",
    sections=SERVER_COMMANDS,
    help="Run the control plane: everything locally (`up`), or its parts and setup steps for a deployment.",
)
dev = LazyGroup(name="dev", sections=DEV_COMMANDS, help="Benchmarks, simulations and scenarios for developers.")
