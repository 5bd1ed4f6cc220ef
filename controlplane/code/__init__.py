"""Uploaded code: Python modules stored in the database and named ``code:<id>:callable`` by
jobs and ``assignLogic`` (see :mod:`runtime.codeload`); and :mod:`.registry`, the rules of
what a job or logic ref may name (uploads, declared entry points, job modules)."""
