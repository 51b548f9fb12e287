"""Two runs side by side: what each recorded, read for comparing (``compared_run``, with the spread
of its step times from its step reports, ``step_spread``), what differs between them and the one
sentence naming the biggest cause (``run_diff``, ``diff_cause``). Pure comparisons over typed
values; reading only."""
