"""The plain-Python half of the engine: everything the UI and the CLI may import.

Sub-packages by domain, lowest first, kept by an import-linter ``layers`` contract in
pyproject.toml: ``common`` · ``host`` · ``procs`` · ``config`` · ``plan`` and ``stacks`` · ``runs`` ·
``ops`` and ``jobs`` · ``bench``; beside them ``backends`` (where a run runs: ``local`` and
``slurm`` behind one interface) and ``queue`` (runs waiting for their devices). A sub-package imports only those below it (siblings on one line
never import each other). Each sub-package's ``__init__`` says what it owns. Nothing here imports
torch, torchvision, textual or ``engine.train`` (``lint-imports`` checks it).
"""
