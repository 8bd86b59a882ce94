"""The garbage collector of a process that runs an executor and nothing else.

``outbox run`` calls :func:`tune_collector` once its plugins are loaded. An application that
embeds an executor in its own process decides for itself; the executor never changes the
collector on its own.
"""

from __future__ import annotations

import gc

#: The young generation's threshold for an executor process (CPython's default is 700).
YOUNG_THRESHOLD = 10_000


def tune_collector() -> None:
    """Freeze what start-up allocated and collect the young generation less often.

    An executor allocates a few dozen short-lived objects per action (a task, its coroutine,
    the claimed row, the ending), almost none of them in reference cycles. With the default
    threshold the collector ran about 2,000 times per 100,000 no-op actions, and each full
    collection walked every imported module and plugin: 0.7 s of a 5 s burn-down, about 7 us
    per action (``bench/throughput.py``, measured with ``gc.callbacks``). Frozen objects are
    never scanned again; cyclic garbage is still collected, in larger steps.
    """
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young:  # 0: the collector is off; leave it off
        gc.set_threshold(max(young, YOUNG_THRESHOLD), middle, old)
