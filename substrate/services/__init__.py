"""substrate.services."""
