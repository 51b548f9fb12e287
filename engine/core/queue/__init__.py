"""The queue of a shared machine (issue 30): runs that wait for their devices, in order.

Owns the claim store (``claims``: one system-wide directory of claim files, a file lock for every
decision), the decision who may start now and why the others may not (``line``), what a device is
busy with (``device_state``: the GPUs as the GPUs screen sees them, CPU slots), the detached waiter
that starts a queued run in place (``waiter``) queueing a run (``enqueue``) and where
the queue stands now, every live claim's verdict (``standing``). No daemon: whoever
waits takes the lock and checks. Sits above ``ops`` and ``jobs``: it starts runs as ``ops`` does and
sees the GPUs' holders as ``jobs`` does. Plain Python.
"""
