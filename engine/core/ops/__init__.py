"""Acting on one run through its backend (``engine.core.backends``): follow a started run to its
end (``follower``) and remove finished runs (``run_removal``).
"""
