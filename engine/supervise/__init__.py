"""The supervisor process: the session facade over its event bus, scheduler, attempt lifecycle and validation
service."""
