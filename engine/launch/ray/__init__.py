"""The Ray backend: each attempt is a Ray actor on a cluster node that starts the same child a local run starts."""
