"""substrate.sandbox."""
