"""Replicated shards: where each key range's copies live (``ring``) and how a push reaches every
copy before it is acknowledged (``link``: chain replication)."""
