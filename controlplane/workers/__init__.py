"""Workers: ``models`` (the ``workers`` table: every registration, per control-plane run),
``schemas``, ``service`` (mirroring the registry, history) and ``routes`` (/workers). The
coordinator's registry is the truth for live workers (the engine's ``worker_views``,
``add_workers`` and ``drain_worker``); the table keeps their history."""
