"""The lowest layer of ``engine.core``: what every other part speaks. Status vocabularies as
str-valued enums (``statuses``), JSON any strict parser reads (``strict_json``), how sizes and
durations are written (``formatting``), text from a run made safe for a terminal
(``visible_text``), every path of a run directory and the one rule for what one is
(``run_layout``), the private,
no-follow, size-bounded primitives for a run directory's files (``run_files``), a full disk said in
one sentence (``disk_space``), the environment protocol a run's processes share with whoever
watches them (``run_environment``), the six parts of a training step and a split of seconds
over them (``step_split``) and the one error a bad preset or option raises
(``config_error``). Imports nothing else of ``engine.core``.
"""
