"""Controllers attached to jobs: upload, lifecycle, and the host that runs them.

- :mod:`.models`, :mod:`.schemas`, :mod:`.service`, :mod:`.routes`: the resource
  (``/api/v1/controllers``): a controller row per attached script or built-in, its
  decisions and its log lines.
- :mod:`.host`: :class:`~.host.ControllerHost` runs every ``running`` controller in its own
  subprocess (:mod:`.child`), sends it views, checks its plans (safety limits, then the
  same validation as REST) and records what became of them. An uploaded script is loaded
  at upload by the process that then runs it, never in a throwaway one.
- :mod:`.process`: a controller's process, started in a bubblewrap sandbox
  (:mod:`controlplane.sandbox`).

Exceptions::

    controlplane.errors.Unavailable
    └── service.SandboxUnavailable   an uploaded script where no sandbox can start (503)
    process.ChildFailed (Exception)  the host's: a child died, hung or answered an error;
    │                                recorded as the controller's failure (or, loading an
    │                                upload, turned into its 422), never raised out of
    │                                the host
    ├── process.ChildHung            it did not answer in time (and was killed)
    └── process.ChildExited          its process ended without answering
"""
