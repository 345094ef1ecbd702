"""The `Task` runner: a user's factory returning a `Task`, trained by torchherd's own loop."""
