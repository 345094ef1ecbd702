"""The background validation process: scores weight snapshots while workers train."""
