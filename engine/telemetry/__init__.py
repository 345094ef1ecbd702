"""GPU, worker-process and host telemetry, sampled on a background thread."""
