"""Version 1: the meta table, the instances, their moves and their
device assignments; the database refuses a device held by two live
assignments (a partial unique index)."""

STATEMENTS = [
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE instances (
    uuid TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL
)""",
    """CREATE TABLE migrations (
    uuid TEXT PRIMARY KEY,
    instance_uuid TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('resize', 'live_migration', 'evacuation')),
    role TEXT NOT NULL CHECK (role IN ('source', 'destination', 'both')),
    state TEXT NOT NULL CHECK (state IN ('active', 'finished', 'confirmed', 'reverted')),
    old_spec TEXT,
    updated_at REAL NOT NULL
)""",
    """CREATE TABLE assignments (
    id TEXT PRIMARY KEY,
    consumer_uuid TEXT NOT NULL,
    instance_uuid TEXT NOT NULL,
    owner TEXT NOT NULL CHECK (owner IN ('instance', 'migration')),
    migration_uuid TEXT,
    resource_class TEXT NOT NULL,
    provider_uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    device_id TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0),
    detail TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('claiming', 'claimed', 'released')),
    boot_id TEXT NOT NULL,
    updated_at REAL NOT NULL
)""",
    """CREATE UNIQUE INDEX assignments_one_live_holder
    ON assignments (provider_uuid, resource_class, device_id)
    WHERE state != 'released' AND kind != 'numa'""",
    """CREATE INDEX assignments_live_by_instance
    ON assignments (instance_uuid) WHERE state != 'released'""",
]
