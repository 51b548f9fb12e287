"""Widgets of the ddptui app: they render what handlers give them and never read files or NVML."""
