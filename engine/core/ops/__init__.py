"""Acting on one run: start it (``run_start``), follow it to its end (``follower``), take its
stacks from outside (``run_snapshot``) and kill exactly its processes (``kill``).
"""
