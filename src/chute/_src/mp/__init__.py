"""Worker processes and the shared-memory transport that brings their results back.

Self-contained: nothing here knows about datasets. See README.md for the protocol.
"""

from chute._src.mp.errors import NotPicklableError as NotPicklableError
from chute._src.mp.errors import PoolClosedError as PoolClosedError
from chute._src.mp.errors import PoolUsageError as PoolUsageError
from chute._src.mp.errors import RemoteTraceback as RemoteTraceback
from chute._src.mp.errors import SharedMemoryWarning as SharedMemoryWarning
from chute._src.mp.errors import WorkerDiedError as WorkerDiedError
from chute._src.mp.errors import WorkerError as WorkerError
from chute._src.mp.errors import WorkerStallWarning as WorkerStallWarning
from chute._src.mp.errors import WorkerTimeoutError as WorkerTimeoutError
from chute._src.mp.pool import DEFAULT_START_METHOD as DEFAULT_START_METHOD
from chute._src.mp.pool import WorkerPool as WorkerPool

__all__ = [
    "DEFAULT_START_METHOD",
    "NotPicklableError",
    "PoolClosedError",
    "PoolUsageError",
    "RemoteTraceback",
    "SharedMemoryWarning",
    "WorkerDiedError",
    "WorkerError",
    "WorkerPool",
    "WorkerStallWarning",
    "WorkerTimeoutError",
]
