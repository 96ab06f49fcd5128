"""The HTTP query service."""
