"""What a run is asked to be: the typed, validated config schema (``schema``) and its TOML form
in and out, overrides included (``toml_io``), the one check for an unknown key
(``known_keys``), how often a checkpoint is written (``checkpoint_every``), device sets
(``devices``), fault specs
(``faults``), where presets and suites live (``presets``, ``suites``) and where the user's own
code is (``user_code``). Reads files, never the machine.
"""
