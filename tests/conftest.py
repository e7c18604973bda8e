"""Shared pytest configuration. Fixture modules of each area are listed here."""
pytest_plugins = []
