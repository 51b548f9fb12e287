"""Acting on one run through its backend (``engine.core.backends``): follow a started run to its
end (``follower``), remove finished runs (``run_removal``) and go on with a failed, killed or
lost run as its next attempt (``resume``).
"""
