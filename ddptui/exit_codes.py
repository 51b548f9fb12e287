"""Exit codes every ddptui command uses."""

OK = 0
FAILED = 1  # the run (or the operation) failed
BAD_INPUT = 2  # bad preset, override, run id or argument: nothing was started
