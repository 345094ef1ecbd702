"""A sweep's policies in a live session: the rules alone, apart from any process (ASHA, promoting ASHA and the
median rule in `pruning.py`, population-based training in `pbt.py`), and what feeds them a session's events and
sends their decisions (`sweeping.py`, `exploiting.py`)."""
