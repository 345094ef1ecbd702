"""The script runner: a training script of the user's own, unchanged or with `torchherd.client`."""
