"""A background thread that keeps the next batches ready, as BasePrefetchingDataLayer does.

The thread only holds the batch-producing callable (never the layer module), runs as a daemon,
stops when ``stop()`` is called or its owner is garbage collected, and hands an exception raised
while reading to the consumer, which re-raises it at its next ``get()``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from ..errors import DataError


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher:
    """Runs ``produce()`` ahead in a daemon thread, up to ``depth`` results queued."""

    def __init__(self, produce: Callable[[], Any], depth: int = 4, name: str = "prefetch") -> None:
        self._produce = produce
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = self._produce()
            except BaseException as err:  # handed to the consumer; the thread then ends
                item = _Failed(err)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failed):
                return

    def get(self) -> Any:
        while True:
            try:
                item = self._queue.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise DataError(
                        "the prefetch thread stopped without a batch or an error"
                    ) from None
        if isinstance(item, _Failed):
            self.stop()
            raise item.error
        return item

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Ask the thread to end and wait for it (it finishes the batch it is reading)."""
        self._stop.set()
        while True:  # unblock a put() waiting on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
