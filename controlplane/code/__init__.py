"""Uploaded code: Python modules stored in the database and importable as
``code:<id>:callable`` by jobs and ``assignLogic`` (see :mod:`runtime.codeload`)."""
