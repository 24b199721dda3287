"""substrate.testing."""
