"""The plain-Python half of the engine: everything the UI and the CLI may import.

Configuration, presets and suites, the run directory and its typed events and summary, the run
observer (the one place that decides a run's and each rank's status), process identity, scanning
and stopping, the NVML layer, the resource guard, the speedup table and the results history.
Nothing here imports torch, torchvision, textual or ``engine.train`` (``lint-imports`` checks it).
"""
