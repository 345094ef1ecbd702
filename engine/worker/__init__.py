"""What every training process shares whatever its runner: the entry, commands, data, checkpoints and weight
snapshots."""
