"""The screens of the ddptui app, one module each: launch, run, runs, processes, results."""
