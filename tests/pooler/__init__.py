"""Through PgBouncer: the paths that work in transaction pooling, and the executor's refusal."""
