"""Checkpoints on the worker side: where their files go (:mod:`.store`) and what they
hold (:mod:`.snapshot`). Import from the modules; this package re-exports nothing."""
