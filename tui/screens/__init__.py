"""Screens of the torchherd app, one module and one .tcss each."""
