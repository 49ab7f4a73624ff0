"""Frontends: other ways of declaring ops, each a thin translation into ``opforge.Op``."""
