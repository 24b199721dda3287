"""Thin daemons: ateapi, atelet, ateworker, router (composition roots only)."""
