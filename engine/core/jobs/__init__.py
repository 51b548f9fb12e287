"""Every training process on the machine, grouped into jobs and judged (``process_table``),
the GPUs with the processes that hold them named (``gpu_view``), and stopping orphaned jobs
(``clean``). Independent of ``ops``: a job is read from /proc, not from one run.
"""
