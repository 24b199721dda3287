"""PostgreSQL adapter tests."""
