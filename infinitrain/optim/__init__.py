"""Optimizers and learning-rate schedules, named as in torch.optim."""
from . import lr_scheduler
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .grad_scaler import GradScaler
from .offload import OffloadError, OffloadOptimizer
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "OffloadOptimizer", "OffloadError", "lr_scheduler"]
__all__ += ["Adadelta", "Adagrad", "RMSprop", "GradScaler"]
