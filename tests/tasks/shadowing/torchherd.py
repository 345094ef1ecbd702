"""A user's own module named `torchherd` in the working directory: it must not shadow the package."""
raise ImportError("the user's torchherd.py was imported instead of the torchherd package")
