"""Version 6: each record a state-changing call makes (a build's instance,
a move) keeps a digest of that call's payload (claims.model.RequestDigest),
so a retry is answered from the record only when it asks the same.
Records from before have none (NULL), and their retries are answered as
before."""

STATEMENTS = [
    "ALTER TABLE instances ADD COLUMN request TEXT",
    "ALTER TABLE migrations ADD COLUMN request TEXT",
]
