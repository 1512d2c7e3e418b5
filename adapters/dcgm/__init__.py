"""DCGM telemetry: dcgm-exporter's Prometheus text into gpufleet samples, and its JetStream consumer."""
