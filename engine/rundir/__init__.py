"""The run directory: where a run writes its config, events, metrics, logs and checkpoints, and how to read one back."""
