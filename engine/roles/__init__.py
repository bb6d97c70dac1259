"""The processes of a run, each started from its own entry point: ``python -m engine.roles``."""
