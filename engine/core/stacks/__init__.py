"""Where each rank is: taking stacks (``capture``: py-spy or the rank's own faulthandler
dump) and judging them (``diagnosis``: each rank's state and innermost frame, and the culprit).
"""
