"""ddptui: a terminal application to launch, watch, compare and clean up PyTorch data-parallel runs.

Importing this package loads nothing else: ``from ddptui.report import report`` stays light in a
training script.
"""

__version__ = "0.1.0"
