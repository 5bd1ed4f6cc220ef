"""Metrics: ``schemas`` (API shapes), ``service`` (a job's recent window, summarized from
the coordinator's worker snapshots; the Prometheus exposition), ``checkpoints`` (the
exposition's checkpoint and recovery families, read from the database) and ``routes``
(``/jobs/{id}/metrics`` and ``/metrics``). No table of its own: live metrics are in the
coordinator, checkpoints and recoveries in their tables."""
