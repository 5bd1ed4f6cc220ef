"""The M/M/k queueing model of Elasticutor's scheduler (pure).

An operator with ``k`` tasks, each serving ``mu`` records per second, receiving ``lam``
records per second in all, is modelled as an M/M/k queue: a record's expected time in the
operator (waiting plus service) is ``C(k, a) / (k*mu - lam) + 1/mu`` with ``a = lam/mu``
the offered load and ``C`` Erlang's C formula (the probability that a record waits). With
``lam >= k*mu`` the queue grows without bound and the time is infinite.

For an exponential sojourn time the 99th percentile is ``ln(100) ~ 4.6`` times the mean
(:data:`P99_OVER_MEAN`), which turns a p99 latency target into a mean the model can aim at.
"""

from __future__ import annotations

import math

__all__ = ["P99_OVER_MEAN", "erlang_c", "sojourn_s"]

P99_OVER_MEAN = math.log(100.0)


def erlang_c(k: int, a: float) -> float:
    """The probability that an arrival waits in an M/M/k queue with offered load ``a``
    (``lam/mu``); 1.0 when ``a >= k`` (unstable). Computed through Erlang B's recursion,
    which stays exact for large ``k``."""
    if k < 1:
        raise ValueError(f"an M/M/k queue needs k >= 1 servers, got {k}")
    if a < 0:
        raise ValueError(f"offered load must be >= 0, got {a}")
    if a >= k:
        return 1.0
    b = 1.0
    for i in range(1, k + 1):
        b = a * b / (i + a * b)
    rho = a / k
    return b / (1.0 - rho * (1.0 - b))


def sojourn_s(lam: float, mu: float, k: int) -> float:
    """Expected seconds a record spends in an M/M/k operator (waiting plus service); ``inf``
    when ``lam >= k*mu``. ``lam`` is the operator's total input rate and ``mu`` one task's
    service rate, both in records per second (``mu > 0``)."""
    if mu <= 0:
        raise ValueError(f"service rate must be > 0, got {mu}")
    if lam <= 0:
        return 1.0 / mu
    if lam >= k * mu:
        return math.inf
    return erlang_c(k, lam / mu) / (k * mu - lam) + 1.0 / mu
