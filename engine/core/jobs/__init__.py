"""Every training process on the machine, grouped into jobs (``grouping``) and judged
(``judging``: is its launcher alive, what state is each process in) into one table
(``process_table``), NVML's GPU processes joined once with the open device files (``gpu_join``),
the GPUs with the processes that hold them named (``gpu_view``), and stopping orphaned jobs
(``clean``). Independent of ``ops``: a job is read from /proc, not from one run.
"""
