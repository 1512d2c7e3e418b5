"""The `gpufleet` command: run the control plane, or talk to its REST API."""

from __future__ import annotations

import click

from controlplane.cli import (
    agent_commands,
    audit_commands,
    bench_commands,
    client_commands,
    report_commands,
    scenario_commands,
    server_commands,
    sim_commands,
    sim_run_commands,
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpufleet")
def main() -> None:
    """gpufleet: one queue and one quota ledger for a fleet of GPU clusters."""


server_commands.register(main)
client_commands.register(main)
scenario_commands.register(main)
bench_commands.register(main)
sim_commands.register(main)
sim_run_commands.add_commands(sim_commands.sim)
agent_commands.register(main)
report_commands.register(main)
audit_commands.register(main)

if __name__ == "__main__":
    main()
