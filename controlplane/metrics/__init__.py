"""Metrics: ``schemas`` (API shapes), ``service`` (a job's recent window, summarized from
the coordinator's worker snapshots; the Prometheus exposition) and ``routes``
(``/jobs/{id}/metrics`` and ``/metrics``). No table: metrics live in the coordinator."""
