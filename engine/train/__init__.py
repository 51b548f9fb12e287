"""The torch half of the engine: the launcher, the rank entry, the training loop, data and models.

Only training processes import these modules (``python -m engine.train.launch RUN_DIR``, and
``python -m engine.train.worker`` under torchrun); the UI never does. This package's own import is
free of torch, so that ``engine.train.rank_bootstrap`` (standard library only) can run first in
every rank, before torch is loaded.
"""
