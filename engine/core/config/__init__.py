"""What a run is asked to be: the typed, validated config schema (``schema``) and its TOML form
in and out, overrides included (``toml_io``), the one check for an unknown key
(``known_keys``), how often a checkpoint is written (``checkpoint_every``), device sets
(``devices``), fault specs
(``faults``), where presets and suites live (``presets``, ``suites``), where the user's own
code is (``user_code``) and a backend's own section of a run config (``backend_sections``). Reads files, never the machine.
"""
