"""What the records say: selecting runs by id, name, tag or setting, comparing them, and
replaying a run's ElasticBSP decisions.

Below both faces that show it, the CLI (``psctl compare``, ``psctl runs``) and the dashboard, so
that each asks the same functions and neither imports the other; above the database layer.
"""
