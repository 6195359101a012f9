"""torch.utils's pieces that training programs use: data and checkpoint."""
from . import checkpoint, data  # noqa: F401  (it.utils.data, it.utils.checkpoint)
