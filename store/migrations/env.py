"""Alembic environment for peagle-tune's own tables (configured in code by `store._migrate`, no alembic.ini).

Only tables named ``peagle_*`` are reflected, compared or migrated, and the version lives in
`peagle_alembic_version`, so Optuna's tables in the same database are never touched.
"""

from __future__ import annotations

from alembic import context

from store._engine import create_store_engine
from store._migrate import context_options

config = context.config


def run_migrations_offline() -> None:
    """Emit SQL for the URL in the config (``alembic upgrade --sql``) without connecting."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **context_options(),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate over the connection `store._migrate` passes in, or a fresh one to the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, **context_options())
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("peagle-tune migrations need a connection or sqlalchemy.url in the Alembic config.")
    engine = create_store_engine(url)
    try:
        with engine.begin() as conn:
            context.configure(connection=conn, **context_options())
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
