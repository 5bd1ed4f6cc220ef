"""Workers: ``schemas`` (API shapes) and ``routes`` (/workers). No table and no service
module yet: the coordinator's registry is the truth, and the engine's ``worker_views``,
``add_workers`` and ``drain_worker`` are the service functions."""
