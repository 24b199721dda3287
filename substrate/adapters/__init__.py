"""substrate.adapters."""
