"""The PostgreSQL adapters (asyncpg): the ateapi store and its schema migrations."""

from substrate.adapters.postgres.migrate import load_migrations, migrate
from substrate.adapters.postgres.store import PostgresStore

__all__ = ["PostgresStore", "load_migrations", "migrate"]
