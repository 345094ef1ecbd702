"""Runners: how a pipeline of each kind trains inside its worker, is checked, probed and scored
(Task, Lightning, script)."""
