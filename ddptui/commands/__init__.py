"""One module per ``ddptui`` command; ``ddptui.cli`` imports a module only when its command runs:
``run``, ``bench``, ``results``, ``presets``, ``runs`` (and ``rm``), ``show``, ``diff``, ``kill``,
``resume``, ``stacks``, ``gpus``, ``processes`` (``ps`` and ``clean``) and ``queue``."""
