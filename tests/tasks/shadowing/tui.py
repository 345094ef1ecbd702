"""A user's own module named `tui`: it must not stand in for torchherd's app."""
raise ImportError("the user's tui.py was imported by torchherd")
