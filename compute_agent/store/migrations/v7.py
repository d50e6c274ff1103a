"""Version 7: the one-time-use devices a claim chose and no cleaning has
given back since (claims.model.DeviceUse), so that a device waiting to be
cleaned stays out of scheduling across restarts."""

STATEMENTS = [
    """CREATE TABLE device_uses (
    address TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('used', 'cleaning_failed')),
    reason TEXT NOT NULL,
    updated_at REAL NOT NULL
)""",
]
