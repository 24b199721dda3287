"""Adapter tier: behaviour outside the port contracts."""
