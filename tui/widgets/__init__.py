"""Reusable widgets of the torchherd app; each carries its DEFAULT_CSS."""
