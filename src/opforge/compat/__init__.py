"""Compatibility layers: other frameworks' user-facing names over opforge ops."""
