"""The everyday PyTorch names a program brought over with `import infinitrain as torch` touches:
each must exist at PyTorch's path (issue 44's probe, kept as a list so a missing one is named)."""
from __future__ import annotations

import importlib

import pytest

# (module path under infinitrain, attribute) for `torch.<path>.<attribute>`
EVERYDAY = {
    "": """Tensor tensor as_tensor from_numpy zeros ones empty full arange linspace eye rand randn randint
        randperm zeros_like ones_like empty_like full_like rand_like randn_like randint_like manual_seed
        initial_seed Generator float32 float float64 double bfloat16 float16 half int32 int64 long uint8 bool
        dtype device no_grad enable_grad inference_mode set_grad_enabled is_grad_enabled is_tensor
        is_floating_point numel finfo iinfo get_default_dtype set_default_dtype cat stack split chunk
        reshape flatten squeeze unsqueeze transpose permute where masked_fill gather index_select tril triu
        matmul mm bmm einsum outer sum mean max min amax amin argmax argmin sort argsort topk cumsum
        softmax log_softmax logsumexp exp log sqrt rsqrt sin cos tanh sigmoid abs pow clamp maximum minimum
        roll repeat_interleave isnan isfinite isinf norm allclose multinomial add sub mul div save load
        compile set_float32_matmul_precision get_float32_matmul_precision use_deterministic_algorithms
        autocast nn optim cuda amp backends distributed utils linalg multiprocessing accelerator""",
    "nn": """Module Parameter Linear Embedding LayerNorm RMSNorm Dropout ReLU GELU SiLU Tanh Sigmoid Softmax
        Sequential ModuleList ModuleDict ParameterList ParameterDict Identity CrossEntropyLoss MSELoss
        NLLLoss BCELoss BCEWithLogitsLoss L1Loss Conv1d Conv2d MaxPool2d AvgPool2d AdaptiveAvgPool2d
        BatchNorm1d BatchNorm2d GroupNorm Flatten Unflatten RNN LSTM GRU RNNCell LSTMCell GRUCell functional
        init utils parallel""",
    "nn.functional": """linear relu gelu silu softmax log_softmax cross_entropy nll_loss mse_loss l1_loss
        binary_cross_entropy binary_cross_entropy_with_logits normalize dropout layer_norm embedding
        scaled_dot_product_attention conv1d conv2d max_pool2d avg_pool2d adaptive_avg_pool2d batch_norm
        group_norm pad""",
    "nn.init": "normal_ zeros_ ones_ uniform_ xavier_uniform_ kaiming_uniform_ orthogonal_ constant_",
    "nn.utils": "clip_grad_norm_",
    "nn.utils.rnn": "pad_sequence",
    "nn.parallel": "DistributedDataParallel",
    "optim": "SGD Adam AdamW Adadelta RMSprop Adagrad Optimizer lr_scheduler",
    "optim.lr_scheduler": "LambdaLR StepLR CosineAnnealingLR",
    "amp": "GradScaler autocast",
    "cuda": "is_available device_count manual_seed manual_seed_all synchronize amp",
    "cuda.amp": "GradScaler autocast",
    "backends.cuda.matmul": "allow_tf32",
    "backends.cudnn": "allow_tf32 benchmark deterministic",
    "distributed": """init_process_group destroy_process_group is_initialized get_rank get_world_size
        all_reduce broadcast all_gather barrier ReduceOp""",
    "utils.data": """Dataset IterableDataset TensorDataset DataLoader Sampler RandomSampler SequentialSampler
        BatchSampler Subset random_split default_collate""",
    "utils.data.distributed": "DistributedSampler",
    "utils.checkpoint": "checkpoint",
    "linalg": "norm vector_norm",
    "multiprocessing": "spawn Process get_context",
}
CASES = [(path, name) for path, names in EVERYDAY.items() for name in names.split()]


def test_the_list_is_the_probe():
    assert len(CASES) >= 134


def _resolve(path: str):
    """infinitrain.<path>: a module where PyTorch's is one (import torch.backends.cudnn), else an
    attribute of one (torch.backends.cuda.matmul)."""
    parts = ["infinitrain", *(path.split(".") if path else [])]
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(path)


@pytest.mark.parametrize("path", list(EVERYDAY))
def test_everyday_names_exist(path):
    module = _resolve(path)
    missing = [name for name in EVERYDAY[path].split() if not hasattr(module, name)]
    assert not missing, f"infinitrain{'.' + path if path else ''} lacks {missing}"
