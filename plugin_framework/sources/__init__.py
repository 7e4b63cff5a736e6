"""Sources: the only layer that talks to a PostgreSQL server."""
