"""The server's and the workers' policies as the rest of psctl sees them before a run: names,
summaries, capabilities, rules and implied settings, each implementation registered ``Lazy``
(engine.registry). ``psctl --help`` and ``engine.plan`` read these without importing the
servers, the workers or torch; the implementations live in ``engine.server`` and
``engine.worker``."""
