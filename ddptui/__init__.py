"""ddptui: a terminal application to launch, watch, compare and clean up PyTorch data-parallel runs.

Importing this package loads nothing else: ``from ddptui.report import report`` stays light in a
training script.

The app: ``app`` (the Textual app), its ``screens`` and ``widgets``, the messages its thread
workers post (``messages``), the engine calls it makes (``actions``), what its workers read
(``watch``), the GPU figures it keeps (``gpu_history``) and the launch form as plain values
(``launch_form``). The command line: ``cli`` (``python -m ddptui``: ``__main__``), one module per
command in ``commands``, what they share (``cli_common``, ``cli_table``, ``run_options``,
``exit_codes``, ``terminal_progress``), the options each backend adds to ``ddptui run``
(``backend_options``). Shared by both: where runs are (``runs_location``), how a
script is named (``script_target``), figures as text (``text_figures``), a kill in words
(``kill_report``), stacks in words (``stack_report``), the speedup table (``speedup_text``), two
runs compared (``run_diff_text``) and, for a user's script, ``report``.
"""

__version__ = "0.1.0"
