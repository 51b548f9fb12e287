"""Whether and how a config can run on this machine, decided before anything starts: the plan
(``run_plan``), the memory it will hold (``memory_estimate``), the resource guard that refuses what
cannot fit (``resource_guard``), a suite's rows planned for this machine (``suite_plan``) and
whether each preset can run here (``preset_check``).
"""
