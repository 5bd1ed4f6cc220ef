"""Controllers attached to jobs: upload, lifecycle, and the host that runs them.

- :mod:`.models`, :mod:`.schemas`, :mod:`.service`, :mod:`.routes`: the resource
  (``/api/v1/controllers``): a controller row per attached script or built-in, its
  decisions and its log lines.
- :mod:`.host`: :class:`~.host.ControllerHost` runs every ``running`` controller in its own
  subprocess (:mod:`.child`), sends it views, checks its plans (safety limits, then the
  same validation as REST) and records what became of them.
- :mod:`.process`: a controller's process, started in a bubblewrap sandbox
  (:mod:`controlplane.sandbox`).

Exceptions::

    controlplane.errors.Unavailable
    └── service.SandboxUnavailable   an uploaded script where no sandbox can start (503)
    process.ChildFailed (Exception)  the host's: a child died, hung or answered an error;
                                     recorded as the controller's failure, never raised
                                     out of the host
"""
