"""Version 5: a live migration's source records the move when it is
announced (state 'announced'), before the conductor swaps the
allocations. SQLite cannot change a CHECK constraint: the table is copied
into a new one."""

STATEMENTS = [
    """CREATE TABLE migrations_v5 (
    uuid TEXT PRIMARY KEY,
    instance_uuid TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('resize', 'live_migration', 'evacuation')),
    role TEXT NOT NULL CHECK (role IN ('source', 'destination', 'both')),
    state TEXT NOT NULL CHECK (state IN ('announced', 'active', 'finished',
                                         'confirmed', 'reverted')),
    old_spec TEXT,
    updated_at REAL NOT NULL
)""",
    "INSERT INTO migrations_v5 SELECT * FROM migrations",
    "DROP TABLE migrations",
    "ALTER TABLE migrations_v5 RENAME TO migrations",
]
