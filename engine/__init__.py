"""ddptui's training engine: trains, launches and supervises data-parallel runs.

The plain-Python modules (config, devices, plan, presets, events, rundir, summary, gpus, faults,
rank_bootstrap, ...) never import torch, so the UI can use them; the rest (data, models, training,
worker, launch) do.
This package never imports textual or ddptui.
"""
