"""Checkpoints of jobs, as the control plane records them: ``models`` (the checkpoints
table), ``schemas`` (a submission's checkpoint and restart settings, a job's effective
policies, the record of each checkpoint), ``policy`` (a submission's settings over the
server's defaults, and the documents the jobs table keeps of them), ``service`` (record
what the coordinator reports, list, get, the latest completed) and ``routes``
(/jobs/{id}/checkpoints)."""
