"""The screens of the ddptui app, one module each (launch, runs, run, stacks, processes, gpus,
results), over ``base``: what every screen shares (the typed app, how a worker ends, polling),
and ``resuming``: the resume key of the Run and Runs screens."""
