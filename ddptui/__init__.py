"""ddptui: a terminal application to launch, watch, compare and clean up PyTorch data-parallel runs."""

__version__ = "0.1.0"
