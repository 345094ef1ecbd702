"""What crosses a process boundary, standard library only: events and commands, worker states, child specs,
the status and control pipes, and the fold of events into progress."""
