"""Worker processes: the errors they raise, and arrays they hand over uncopied.

`MultiprocessingOptions` lives in `chute`; it is named here too because Grain has it in
both places (`grain.multiprocessing.MultiprocessingOptions`).
"""

from chute._src.core.options import MultiprocessingOptions as MultiprocessingOptions
from chute._src.core.outbuf import empty as empty
from chute._src.exec.mp.errors import NotPicklableError as NotPicklableError
from chute._src.exec.mp.errors import SharedMemoryWarning as SharedMemoryWarning
from chute._src.exec.mp.errors import WorkerDiedError as WorkerDiedError
from chute._src.exec.mp.errors import WorkerError as WorkerError
from chute._src.exec.mp.errors import WorkerStallWarning as WorkerStallWarning
from chute._src.exec.mp.errors import WorkerTimeoutError as WorkerTimeoutError
from chute._src.exec.mp.shared_memory import SharedMemoryArray as SharedMemoryArray
from chute._src.exec.mp.shared_memory import SharedMemoryArrayMetadata as SharedMemoryArrayMetadata

__all__ = [
    "MultiprocessingOptions",
    "NotPicklableError",
    "SharedMemoryArray",
    "SharedMemoryArrayMetadata",
    "SharedMemoryWarning",
    "WorkerDiedError",
    "WorkerError",
    "WorkerStallWarning",
    "WorkerTimeoutError",
    "empty",
]
