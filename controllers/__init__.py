"""Controllers: the SDK (a Controller base, view and plan types) and the built-in policies.

Not built yet (issue 5). Controllers will import only this package and
``controlplane.abstraction``.
"""
