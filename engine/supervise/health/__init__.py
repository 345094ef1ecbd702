"""A session's watch on what goes wrong: the alert rules (`alert_rules.py`), stragglers among a gang's ranks
(`stragglers.py`), the triage of a stall from its stacks (`triage.py`), a validation metric never reported
(`metric_watch.py`), and the policy that feeds them a session's events and sends what they say (`watch.py`)."""
