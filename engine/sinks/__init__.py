"""Sinks: copies of a run's events for the experiment trackers people already use (MLflow, Weights & Biases, a
sink of their own), each fed by the supervisor through a bounded hand-off to a process of its own, so that a slow
or broken tracker never slows or breaks training."""
