"""Backends: what starts a supervised child (locally, as a DDP gang, or on a Ray cluster) and the `Handle` the supervisor holds for it."""
