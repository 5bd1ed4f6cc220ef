"""Events: what happened, in order (jobs submitted, recovering, recovered and ended, a
job's first completed checkpoint and its abandoned ones, reconfigurations ended, workers
registered and lost, code uploaded, controllers attached, failed or stopped)."""
