"""Version 3: the whole of Placement's view of our tree as last synced,
generations included, so that a restart reads again only the providers
whose generation moved meanwhile. It holds the names version 2 kept."""

STATEMENTS = [
    """CREATE TABLE placement_view (
    uuid TEXT PRIMARY KEY,
    parent_uuid TEXT,
    name TEXT NOT NULL,
    generation INTEGER,
    inventories TEXT NOT NULL,
    traits TEXT NOT NULL,
    aggregates TEXT
)""",
    "INSERT INTO placement_view SELECT uuid, NULL, name, NULL, '{}', '[]', NULL FROM providers",
    "DROP TABLE providers",
]
