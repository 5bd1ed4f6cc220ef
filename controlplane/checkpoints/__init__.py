"""Checkpoints of jobs, as the control plane records them: ``models`` (the checkpoints
table), ``schemas`` (a submission's checkpoint settings, a job's effective policy, the
record of each checkpoint), ``policy`` (a submission's settings over the server's
defaults), ``service`` (record what the coordinator reports, list, get, the latest
completed) and ``routes`` (/jobs/{id}/checkpoints)."""
