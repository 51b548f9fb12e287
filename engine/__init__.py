"""ddptui's training engine: trains, launches and supervises data-parallel runs.

Two halves with a boundary that ``lint-imports`` checks: ``engine.core`` (plain Python, the only
part the UI imports) and ``engine.train`` (everything that imports torch). The engine never imports
textual or ddptui.
"""
