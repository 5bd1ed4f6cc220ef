"""Events: what happened, in order (jobs submitted and ended, reconfigurations ended,
workers registered and lost, code uploaded, controllers attached, failed or stopped)."""
