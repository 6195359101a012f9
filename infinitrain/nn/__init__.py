"""Neural-network building blocks, named as in torch.nn."""
from . import functional, init, utils
from .module import Module
from .modules import (GELU, CrossEntropyLoss, Dropout, Embedding, Identity, LayerNorm, Linear, ModuleDict,
                      ModuleList, MSELoss, ReLU, RMSNorm, Sequential, Sigmoid, SiLU, Softmax, Tanh)
from .modules import BCELoss, BCEWithLogitsLoss, L1Loss, NLLLoss
from .modules import ParameterDict, ParameterList
from .parameter import Parameter
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase
from .conv import Conv1d, Conv2d
from .conv import ConvTranspose2d
from .modules import LeakyReLU
from .modules import Dropout2d
from .pooling import AdaptiveAvgPool2d, AvgPool2d, MaxPool2d
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm
from .flatten import Flatten, Unflatten
from .transformer import (MultiheadAttention, Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)

__all__ = ["Module", "Parameter", "Linear", "Embedding", "LayerNorm", "RMSNorm", "Dropout",
           "GELU", "SiLU", "ReLU", "Sigmoid", "Tanh", "Softmax", "Identity", "CrossEntropyLoss", "MSELoss",
           "Sequential",
           "ModuleList", "ModuleDict", "MultiheadAttention", "TransformerEncoderLayer",
           "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "Transformer",
           "functional", "init", "utils"]
__all__ += ["ParameterList", "ParameterDict"]
__all__ += ["NLLLoss", "L1Loss", "BCELoss", "BCEWithLogitsLoss"]
__all__ += ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
__all__ += ["Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "BatchNorm1d", "BatchNorm2d",
            "GroupNorm", "Flatten", "Unflatten"]
__all__ += ["ConvTranspose2d"]
__all__ += ["LeakyReLU"]
__all__ += ["Dropout2d"]
