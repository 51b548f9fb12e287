"""Widgets of the ddptui app: they render what handlers give them and never read files or NVML.

Modals: the frame they share (``dialog``), a question (``confirm``), every key (``keys_dialog``),
a user's script (``script_prompt``), two runs compared (``run_diff_dialog``). The Launch screen's:
its texts (``launch_texts``), the device picker (``gpu_picker``), where to run
(``where_to_run``), when to start (``when_to_start``: now, or when free), a whole-number field
(``number_input``). The Runs screen's: the machine's queue (``queue_line``). A run's: its ranks (``rank_table``),
step split (``step_split``) and curves (``step_curves``), its GPUs (``gpu_panel``) and every
node's (``node_gpus``), a rank's log tail (``log_tail``), how it ended (``run_summary``). The GPU
processes (``gpu_process_list``); the cursor of such row lists (``list_cursor``); a DataTable
that keeps its rows whole (``fitted_table``).
"""
