"""How DDP reduces: PyTorch's mixed_precision=_MixedPrecision(reduce_dtype=) and the examples'
--grad_reduce_dtype, and the buckets repacked in backward's order. The arguments in process;
under MPI, the averaged gradients bit for bit against the ranks' own and the buckets' order
(tests/parallel/mpi/ddp_reduction.py), and the example's flag reaching the reduction."""
import dataclasses

import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.nn.parallel import DistributedDataParallel as DDP
from infinitrain.nn.parallel.ddp import _MixedPrecision

from helpers import MPI_SCRIPTS, example, mpirun, step_losses, write_tokens


def test_mixed_precision_has_pytorchs_fields():
    torch_ddp = pytest.importorskip("torch.nn.parallel.distributed")
    assert [f.name for f in dataclasses.fields(_MixedPrecision)] == \
        [f.name for f in dataclasses.fields(torch_ddp._MixedPrecision)][:3]


@pytest.mark.parametrize("policy, error, match", [
    (_MixedPrecision(param_dtype=it.bfloat16), ValueError, "param_dtype=.*autocast"),
    (_MixedPrecision(buffer_dtype="bfloat16"), ValueError, "buffer_dtype=bfloat16"),
    (_MixedPrecision(reduce_dtype="int32"), ValueError, "floating-point dtype, got int32"),
    (_MixedPrecision(reduce_dtype="fp8"), TypeError, "unknown dtype 'fp8'"),
    (object(), ValueError, "mixed_precision=<object .*> is not supported: give a _MixedPrecision"),
])
def test_mixed_precision_refusals_name_the_value(policy, error, match):
    with pytest.raises(error, match=match):  # before any process group is needed
        DDP(nn.Linear(2, 2), mixed_precision=policy)


@pytest.mark.mpi
def test_reduce_dtype_and_buckets_in_backwards_order():
    assert mpirun(2, [str(MPI_SCRIPTS / "ddp_reduction.py")]).count("OK") == 2


@pytest.mark.mpi
def test_the_examples_grad_reduce_dtype(tmp_path):
    args = ["--input_bin", str(write_tokens(tmp_path / "t.bin")), "--model", "tiny", "--batch_size", "2",
            "--sequence_length", "32", "--num_iteration", "5", "--learning_rate", "3e-3"]
    fp32, bf16 = (np.array(step_losses(example(2, "gpt2", args + ["--grad_reduce_dtype", d])))
                  for d in ("float32", "bfloat16"))
    # the same until AdamW's second update (its first is the gradient's sign whatever the rounding),
    # then apart by bf16's rounding of the gradients, no more
    np.testing.assert_array_equal(bf16[:2], fp32[:2])
    assert np.all(bf16[2:] != fp32[2:]), (fp32, bf16)
    np.testing.assert_allclose(bf16, fp32, rtol=1e-3)
