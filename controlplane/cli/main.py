"""The `gpufleet` command: run the control plane, or talk to its REST API.

Commands are grouped by what they act on (`gpufleet workload list`, `gpufleet team create`,
`gpufleet server serve`, `gpufleet dev bench`), listed here by name, section and summary, and
imported only when used (see lazy_group): the client commands start in a fraction of a second
instead of importing the daemons', benchmarks' and agent's libraries first.

The flat names of earlier releases (`gpufleet list`, `gpufleet serve`, `gpufleet bench`, ...) are
deprecated aliases for one release: they run the grouped command, say its name on stderr, and are
left out of `--help`. `up` stays top level (it is the first command anyone types), as do `status`,
`login`, `context` and `completion`.
"""

from __future__ import annotations

import click

from controlplane.cli.groups import DEV_COMMANDS, SERVER_COMMANDS
from controlplane.cli.lazy_group import Lazy, LazyGroup

_CLIENT = "controlplane.cli.client_commands"
_OBJECTS = "controlplane.cli.object_commands"
_CONTEXTS = "controlplane.cli.context_commands"

SECTIONS: dict[str, dict[str, Lazy]] = {
    "Run the control plane": {
        "up": Lazy("controlplane.cli.server_commands:up", "Run all of gpufleet locally, with a simulated fleet."),
        "server": Lazy("controlplane.cli.groups:server", "The daemons and setup steps of a deployed control plane."),
        "agent": Lazy("controlplane.cli.agent_commands:agent", "Publish a cluster's dcgm-exporter GPU samples."),
    },
    "Use it": {
        "status": Lazy(f"{_CLIENT}:status", "The fleet at a glance: GPUs, teams and queues, the scheduler."),
        "workload": Lazy(f"{_CLIENT}:workload", "Submit, list, show, cancel and watch workloads."),
        "job": Lazy("controlplane.cli.job_commands:job", "Workload files: `job init` writes a commented sample."),
        "report": Lazy("controlplane.cli.report_commands:report", "Reports over the fleet's history."),
        "audit": Lazy("controlplane.cli.audit_commands:audit", "Check the fleet against the GPU-fleet checklist."),
        "login": Lazy(f"{_CONTEXTS}:login", "Save an API and its token as the current context."),
        "context": Lazy(f"{_CONTEXTS}:context", "Saved APIs and tokens: list, use, delete."),
        "completion": Lazy("controlplane.cli.completion_commands:completion", "Print the shell's completion script."),
    },
    "Manage the fleet": {
        "team": Lazy(f"{_OBJECTS}:team", "Create, list, show, update and delete teams."),
        "queue": Lazy(f"{_OBJECTS}:queue", "Create, list, show, update and delete queues."),
        "cohort": Lazy(f"{_OBJECTS}:cohort", "Create, list, show, update and delete cohorts."),
        "priority-class": Lazy(f"{_OBJECTS}:priority_class", "Apply, list, show and delete priority classes."),
        "token": Lazy(f"{_OBJECTS}:token", "Issue, list and revoke API tokens."),
        "cluster": Lazy(f"{_OBJECTS}:cluster", "Register, list, show, update, delete clusters; agent credentials."),
    },
    "Developer tools": {
        "dev": Lazy("controlplane.cli.groups:dev", "Benchmarks, simulations and scenarios: bench, sim, scenario."),
    },
}

# The flat names of the previous release -> the command that replaced each (kept for one release).
DEPRECATED_ALIASES: dict[str, tuple[str, ...]] = {
    **{verb: ("workload", verb) for verb in ("submit", "list", "show", "cancel", "watch")},
    **{name: ("server", name) for entries in SERVER_COMMANDS.values() for name in entries if name != "up"},
    **{name: ("dev", name) for name in DEV_COMMANDS["Developer tools"]},
    "queues": ("queue", "list"),
    "clusters": ("cluster", "list"),
}


@click.group(
    name="gpufleet",
    cls=LazyGroup,
    sections=SECTIONS,
    aliases=DEPRECATED_ALIASES,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="The flat names of the previous release (`gpufleet list`, `gpufleet serve`, `gpufleet bench`, ...) "
    "still work until the next one and say what to type instead.",
)
@click.version_option(package_name="gpufleet")
def main() -> None:
    """gpufleet: one queue and one quota ledger for a fleet of GPU clusters."""


if __name__ == "__main__":
    main()
