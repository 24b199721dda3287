"""Shared bootstrap for the daemons: logging, signals, address parsing."""
