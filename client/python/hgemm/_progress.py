"""A tqdm progress bar for large transfers, when tqdm is installed (python3-tqdm; optional)."""
import threading

PROGRESS_THRESHOLD_BYTES = 256 << 20


class _Bar:
    def __init__(self, total: int, desc: str):
        from tqdm import tqdm
        self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         leave=False)
        self._lock = threading.Lock()  # the sync client sends and receives on two threads

    def update(self, n: int) -> None:
        with self._lock:
            self._bar.update(n)

    def close(self) -> None:
        with self._lock:
            self._bar.close()


def bar(setting, total_bytes: int, desc: str):
    """A bar (with update(n) and close()) or None. setting: None (auto: over 256 MiB), True,
    False."""
    if setting is False or (setting is None and total_bytes < PROGRESS_THRESHOLD_BYTES):
        return None
    try:
        return _Bar(total_bytes, desc)
    except ImportError:
        return None


def close(b) -> None:
    if b is not None:
        b.close()
