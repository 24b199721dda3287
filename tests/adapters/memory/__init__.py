"""Memory adapter tests."""
