"""A run as a service: the supervisor in a session of its own, its control socket, and the clients that attach."""
