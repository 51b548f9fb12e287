"""The plain-Python half of the engine: everything the UI and the CLI may import.

Sub-packages by domain, lowest first, kept by an import-linter ``layers`` contract in
pyproject.toml: ``common`` · ``host`` · ``procs`` · ``config`` · ``plan`` and ``stacks`` · ``runs`` ·
``backends`` (where a run runs: this machine, or a scheduler's nodes, behind one interface) ·
``ops`` and ``jobs`` · ``queue`` (runs waiting for their devices) · ``bench``. A sub-package
imports only those below it (siblings on one line never import each other). Each sub-package's
``__init__`` says what it owns. Nothing here imports torch, torchvision, textual or
``engine.train`` (``lint-imports`` checks it).

Importing ``engine.core`` imports every backend's sub-package
(``engine.core.backends.import_backends``), and each registers what the layers below it need to
know of its runs: its config section and what the run observer asks of them. So every process
that reads a run knows every backend's, without a lower layer naming one.
"""

from engine.core.backends import import_backends

import_backends()
