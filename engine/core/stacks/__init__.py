"""Where each rank is: taking stacks (``capture``: py-spy or the rank's own faulthandler
dump), judging them (``diagnosis``: each rank's state and innermost frame, and the culprit), a
snapshot as plain data and where it is kept (``snapshot``) and the launcher's probe of a silent
rank (``stall_probe``).
"""
