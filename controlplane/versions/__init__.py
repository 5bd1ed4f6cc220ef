"""Abstraction versions: ``models`` (every version of every job's abstraction),
``schemas`` (the abstraction and diff as JSON), ``service`` and ``routes``
(/jobs/{id}/abstraction, /versions, /diff)."""
