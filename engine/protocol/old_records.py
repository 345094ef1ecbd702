"""The one reader of what older versions wrote differently: records of `events.jsonl` are brought to today's form
before they are decoded, so nothing else in torchherd knows the old forms.

Before trial states had names of their own, a trial waiting at a rung, one taking over another's checkpoint and
one yielding its slot ended `pruned`, told apart by the first words of the reason; an early stop was `stopped`
with a reason beginning 'early stopping', and an end before any attempt ran was said only at the reason's end.
"""
from __future__ import annotations

from typing import Any

from .jsonvalue import JsonObject

# How versions up to 0.1.0 (commit 15aa107) began or ended those reasons.
_PAUSED_AT = "paused at rung "
_EXPLOITING = "takes over "
_YIELDING = "yields its slot "
_EARLY_STOP = "early stopping"
_BEFORE_START = "before it started"
_NOTICES = (("checkpoint failed", "checkpoint_failed"), ("resuming run ", "resuming"),
            ("its processes write their Python stacks", "stacks_asked"))  # a notice's first words -> its topic


def upgraded(record: JsonObject) -> dict[str, Any]:  # Any out: callers index it freely (rundir)
    """`record` in today's form: an old `pipeline_finished` gets the state and fields the reason stood for, an
    old `notice` the topic its first words stood for; any other record comes back as it is (the same object)."""
    text = record.get("text")
    if record.get("type") == "notice" and "topic" not in record and isinstance(text, str):
        topic = next((t for words, t in _NOTICES if text.startswith(words)), "")
        return dict(record, topic=topic) if topic else record
    if record.get("type") != "pipeline_finished" or "never_ran" in record:  # today's records say never_ran
        return record
    status, reason = record.get("status"), record.get("reason")
    if not isinstance(status, str) or not isinstance(reason, str):
        return record
    out = dict(record, never_ran=reason.endswith(_BEFORE_START))
    if status == "pruned" and reason.startswith(_PAUSED_AT):
        rung = reason[len(_PAUSED_AT):].split(":", 1)[0]
        out.update(status="waiting_at_rung", reason=reason.split(": ", 1)[-1])
        try:
            out["rung"] = float(rung)
        except ValueError:
            pass
    elif status == "pruned" and reason.startswith(_EXPLOITING):
        out["status"] = "exploiting"
    elif status == "pruned" and reason.startswith(_YIELDING):
        out["status"] = "yielding"
    elif status == "stopped" and reason.startswith(_EARLY_STOP):
        out["status"] = "early_stopped"
    return out
