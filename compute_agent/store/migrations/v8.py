"""Version 8: each provider's allocations as the agent last read them,
with the provider's generation in the tree read before, so that a restart
reads again only the providers whose generation moved meanwhile (the
others by age, spread over the refresh interval:
compute_agent/placement/allocations.py)."""

STATEMENTS = [
    """CREATE TABLE allocation_view (
    provider_uuid TEXT PRIMARY KEY,
    generation INTEGER,
    allocations TEXT NOT NULL
)""",
]
