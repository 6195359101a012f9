"""The GPU step's pieces outside attention (issue 53): the PyTorch benchmark model on any
device, the embedding backward, the bf16 weight copies made once per step, the profiler's GPU
time and the AdamW launch. The GPU tests run on a real GPU or on the emulated one
(tests/cuda/test_cuda_emulated.py); the rest run anywhere."""
import sys
from pathlib import Path

import pytest

import infinitrain as it

pytestmark = pytest.mark.cuda

GPU = it.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device on this machine")
BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def test_the_pytorch_gpt2_takes_its_positions_on_the_inputs_device():
    """benchmarks/torch_gpt2.py on a GPU: positions built on the CPU would meet a CUDA table.
    The meta device stands in for the GPU here: it computes nothing, so only the device seen
    by the position table is checked."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BENCHMARKS))
    from torch_gpt2 import TorchGPT2
    model = TorchGPT2(1, 2, 8, 16, 8, 16).to("meta")
    seen = []
    model.transformer.wpe.register_forward_pre_hook(lambda _, args: seen.append(args[0].device))
    idx = torch.zeros(2, 4, dtype=torch.long, device="meta")
    model(idx, idx)
    assert seen == [idx.device]
