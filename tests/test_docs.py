"""The README documents every config key and every event type the engine has."""
from pathlib import Path

from torchherd.engine.config.schema import describe_fields
from torchherd.engine.protocol.messages import Event
from torchherd.engine.protocol.records import message_types

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_config_key_is_in_the_readme():
    missing = [f"{table}.{key}" for table, keys in describe_fields().items() for key in keys
               if not any(form in README for form in (f"`{key}`", f"[{key}]", f"[[{key}]]"))]
    assert missing == []


def test_every_event_type_is_in_the_readme():
    # Telemetry and heartbeats never reach events.jsonl, so the table leaves them out; so are the control
    # socket's own messages (hello, welcome, request, reply), which are not events.
    internal = {"event", "message", "command", "heartbeat", "telemetry"}
    missing = [t for t, cls in message_types().items()
               if t not in internal and issubclass(cls, Event) and f"`{t}`" not in README]
    assert missing == []
