"""Backends: the contract (`backend.py`: `Backend`, `Handle`, `LaunchSpec`), the registry by `[cluster] backend`
name (`registry.py`), and what starts a supervised child locally (`process.py`), as a DDP gang (`gang.py`) or on a
Ray cluster (`ray/`)."""
