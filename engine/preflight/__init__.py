"""What runs before a run launches: the static check of a config and the probe that builds each task in a
fresh interpreter."""
