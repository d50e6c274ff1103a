"""Version 2: the provider names and UUIDs last seen in Placement, so that
claims still resolve providers when Placement cannot be reached at
start-up."""

STATEMENTS = [
    "CREATE TABLE providers (name TEXT PRIMARY KEY, uuid TEXT NOT NULL)",
]
