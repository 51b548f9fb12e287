"""The machine itself: its GPUs through NVML (``gpus``), what this process may use of it (cores
and available memory: ``capacity``, its memory cgroup: ``cgroups``), the facts a bench records
about it (``machine_info``), how busy it is now (``host_usage``: CPU, memory, swap), how busy
other tenants kept it (``outside_load``) and the kernel's word on an out-of-memory kill
(``oom_evidence``). Knows nothing of runs or processes of ours.
"""
