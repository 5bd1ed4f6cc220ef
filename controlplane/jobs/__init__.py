"""Jobs: ``models`` (the jobs table), ``schemas`` (API shapes), ``build`` (a job's graph,
built from registered code in a throwaway process, its sinks confined), ``service``
(submit, list, get, stop, status mirroring) and ``routes`` (/jobs)."""
