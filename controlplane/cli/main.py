"""The `gpufleet` command: run the control plane, or talk to its REST API.

Commands are listed here by name, section and summary and imported only when used (see
lazy_group): the client commands start in a fraction of a second instead of importing the
daemons', benchmarks' and agent's libraries first.
"""

from __future__ import annotations

import click

from controlplane.cli.lazy_group import Lazy, LazyGroup

_SERVER = "controlplane.cli.server_commands"
_CLIENT = "controlplane.cli.client_commands"
_OBJECTS = "controlplane.cli.object_commands"
_CONTEXTS = "controlplane.cli.context_commands"

SECTIONS: dict[str, dict[str, Lazy]] = {
    "Run the control plane": {
        "up": Lazy(f"{_SERVER}:up", "Run all of gpufleet locally, with a simulated fleet."),
        "init": Lazy(f"{_SERVER}:init", "Migrate, seed defaults, issue the first admin token."),
        "migrate": Lazy(f"{_SERVER}:migrate", "Bring the database to the newest schema."),
        "serve": Lazy(f"{_SERVER}:serve", "Run the REST API."),
        "run": Lazy(f"{_SERVER}:run_many", "Run several components in one process."),
        "scheduler": Lazy(f"{_SERVER}:scheduler", "Run the scheduler."),
        "dispatcher": Lazy(f"{_SERVER}:dispatcher", "Run the dispatcher."),
        "ingest": Lazy(f"{_SERVER}:ingest", "Run the ingest."),
        "relay": Lazy(f"{_SERVER}:relay", "Run the relay."),
        "create-admin-token": Lazy(f"{_SERVER}:create_admin_token", "Issue an admin (or metrics) API token."),
        "nats-topology": Lazy(f"{_SERVER}:nats_topology", "Print the JetStream streams and consumers it declares."),
        "nats-auth-config": Lazy(f"{_SERVER}:nats_auth_config", "Write a nats-server config for an external server."),
    },
    "Use it": {
        "job": Lazy("controlplane.cli.job_commands:job", "Workload files: `job init` writes a commented sample."),
        "login": Lazy(f"{_CONTEXTS}:login", "Save an API and its token as the current context."),
        "context": Lazy(f"{_CONTEXTS}:context", "Saved APIs and tokens: list, use, delete."),
        "completion": Lazy("controlplane.cli.completion_commands:completion", "Print the shell's completion script."),
        "status": Lazy(f"{_CLIENT}:status", "The fleet at a glance: GPUs, teams and queues, the scheduler."),
        "submit": Lazy(f"{_CLIENT}:submit", "Submit the workload described in a YAML file."),
        "list": Lazy(f"{_CLIENT}:list_workloads", "List workloads, newest first."),
        "show": Lazy(f"{_CLIENT}:show", "Show one workload: state, reason, placement, runs."),
        "cancel": Lazy(f"{_CLIENT}:cancel", "Cancel a workload that has not finished."),
        "watch": Lazy(f"{_CLIENT}:watch", "Follow one workload until it finishes."),
        "queues": Lazy(f"{_CLIENT}:queues", "List queues with their quotas."),
        "report": Lazy("controlplane.cli.report_commands:report", "Reports over the fleet's history."),
        "audit": Lazy("controlplane.cli.audit_commands:audit", "Check the fleet against the GPU-fleet checklist."),
    },
    "Manage the fleet": {
        "cohort": Lazy(f"{_OBJECTS}:cohort", "Create, list, show, update and delete cohorts."),
        "team": Lazy(f"{_OBJECTS}:team", "Create, list, show, update and delete teams."),
        "queue": Lazy(f"{_OBJECTS}:queue", "Create, list, show, update and delete queues."),
        "priority-class": Lazy(f"{_OBJECTS}:priority_class", "Apply, list and delete priority classes."),
        "token": Lazy(f"{_OBJECTS}:token", "Issue, list and revoke API tokens."),
        "cluster": Lazy(f"{_OBJECTS}:cluster", "Register, list, show, update and delete clusters."),
    },
    "Clusters and agents": {
        "clusters": Lazy(f"{_CLIENT}:clusters", "List clusters and their node pools."),
        "agent": Lazy("controlplane.cli.agent_commands:agent", "Publish a cluster's dcgm-exporter GPU samples."),
    },
    "Developer tools": {
        "bench": Lazy("controlplane.cli.bench_commands:bench", "Measure the scheduling core and the services."),
        "sim": Lazy("controlplane.cli.sim_commands:sim", "Trace-driven simulations of the scheduling policies."),
        "scenario": Lazy("controlplane.cli.scenario_commands:scenario", "Run scenarios through the scheduling core."),
    },
}


@click.group(
    cls=LazyGroup,
    sections=SECTIONS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="gpufleet")
def main() -> None:
    """gpufleet: one queue and one quota ledger for a fleet of GPU clusters."""


if __name__ == "__main__":
    main()
