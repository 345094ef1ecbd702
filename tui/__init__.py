"""torchherd's front ends: the Textual app and the headless command line, both consumers of `engine`."""
