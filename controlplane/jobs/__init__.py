"""Jobs: ``models`` (the jobs table), ``schemas`` (API shapes), ``service`` (submit, list,
get, stop, status mirroring) and ``routes`` (/jobs)."""
