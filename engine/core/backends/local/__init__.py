"""The local backend: a run's ranks on this machine. ``start`` checks the config, makes the run
directory and starts the launcher in its own session; ``kill`` stops exactly the run's processes,
verified; ``snapshot`` takes every live rank's stack from outside; ``backend`` is the
``LocalBackend`` over them.
"""
