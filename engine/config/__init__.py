"""The run configuration: the typed schema of torchherd's TOML files and its loader."""
