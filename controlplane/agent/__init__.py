"""The in-cluster agent: scrapes dcgm-exporter and reports to the control plane over NATS (its own composition root)."""
