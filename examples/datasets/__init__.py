"""Small raw datasets for ``streampilot dataset prepare``: see :mod:`.sample`."""
