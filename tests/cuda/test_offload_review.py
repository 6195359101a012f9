"""Review of the offload's host masters kept between steps and its updates during backward
(issue 53): cases where the offloaded AdamW must give the GPU AdamW's bits, or fail loudly.
Run on a GPU, or on the emulated one:
    INFINITRAIN_CUDA_LIBRARY=/tmp/emu/libinfinitrain_cuda.so python -m pytest -q tests/cuda/test_offload_review.py
"""
import contextlib

import numpy as np
import pytest

import infinitrain as it
from infinitrain import nn
from infinitrain.optim import AdamW, OffloadOptimizer

GPU = it.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="no CUDA device on this machine")


def _weights(model):
    return [p.detach().cpu().numpy().copy() for p in model.parameters()]


def _linear(offload: bool, streamed: bool = False):
    """(model, optimizer, the OffloadOptimizer or None, input): a seeded Linear on the GPU with
    AdamW, offloaded to the host when asked; streamed: each gradient handed over by its own hook,
    as TrainStep does on one rank."""
    it.manual_seed(0)
    model = nn.Linear(8, 4).to("cuda")
    opt = AdamW(model.parameters(), lr=1e-2)
    off = OffloadOptimizer(opt, "cpu") if offload else None
    if off is not None and streamed:
        for p in off.params:
            p.register_post_accumulate_grad_hook(lambda p: off.grads_ready((p,)))
    return model, off or opt, off, it.randn(3, 8).to("cuda")


def _alias(weight, how: str):
    """weight's memory as another library would hold it: through DLPack or the CUDA array interface."""
    if how == "cuda_array_interface":
        return it.dlpack.from_cuda_array_interface(weight.detach())
    return it.from_dlpack(weight.detach().__dlpack__())


# after which steps another library takes a weight's memory, writes it, lets go of it
ALIAS_SCHEDULES = {
    "dlpack-dropped": {0: "take write drop", 1: "take write drop"},    # all between two steps
    "dlpack-held": {0: "take write", 1: "write", 2: "drop"},            # held across steps, written later
    "dlpack-written-then-dropped": {0: "take write", 1: "write drop"},  # the last write just before letting go
    "cuda_array_interface": {0: "take write", 1: "write"},              # its consumer never says it is done
}


@needs_gpu
@pytest.mark.parametrize("how", list(ALIAS_SCHEDULES))
def test_a_weight_written_through_a_dlpack_alias_between_steps_is_not_overwritten(how):
    """A GPU weight written by another library between steps (torch/CuPy through DLPack or
    __cuda_array_interface__, loading weights, an EMA swap) moves no version of the parameter's
    storage, so the host master was stale and the next offloaded step updated (and wrote back) the
    old weights instead of the written ones. The storage counts who holds its memory now: the step
    reads a weight back while another library holds it, and once after one took it or let it go;
    then the master is kept again (for a DLPack alias: the interface's consumer never lets go).
    The GPU AdamW updates what was written."""
    runs = []
    for offload in (False, True):
        model, opt, off, x = _linear(offload)
        alias = None
        for step in range(4):
            model(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
            for action in ALIAS_SCHEDULES[how].get(step, "").split():
                if action == "take":
                    alias = _alias(model.weight, "cuda_array_interface" if how == "cuda_array_interface" else "dlpack")
                elif action == "write":
                    with it.no_grad():
                        alias.mul_(0.5)
                else:
                    alias = None
        runs.append(_weights(model))
        if off is not None:
            assert off._current(0) is (how != "cuda_array_interface")
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@needs_gpu
def test_a_gradient_that_arrives_again_after_its_early_update_is_an_error():
    """arm(update=True) promises each gradient once per backward; commit afdc9ad says a second
    arrival is an error. It is only when the worker has not yet queued the first update's copy
    back: once it has, the parameter's storage version moved, EarlyUpdates.submit filters it out
    as 'written behind the optimizer's back' before checking `done`, and the step (which skips
    everything in `done`) silently drops the second contribution. Here the second backward
    comes after the worker has finished (a parameter used by two losses, each backward on its own,
    or used again by a replay after its gradient was accumulated)."""
    runs = []
    for offload in (False, True):
        model, opt, off, x = _linear(offload, streamed=True)
        for step in range(3):
            if off is not None and step > 0:
                off.arm(update=True)
            model(x).square().sum().backward()
            if off is not None and off._early is not None:
                for f in list(off._early.futures):  # the worker has taken and copied back what was handed over
                    f.result()
            try:
                model(x).sum().backward()  # the same parameters' gradients again
            except RuntimeError as e:
                assert "arrived twice" in str(e)
                return  # the error the contract promises
            opt.step()
            opt.zero_grad()
        runs.append(_weights(model))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@needs_gpu
@pytest.mark.parametrize("between", ["arm", "state_dict"])
def test_a_second_backward_of_the_same_step_does_not_update_a_parameter_twice(between):
    """Two backward passes before one step, each armed with update=True (TrainStep.forward_backward
    called twice with step_during_backward=True, accumulating): arm() joined the first EarlyUpdates
    and dropped the set it had updated, so the second backward updated the same parameters again
    (with the accumulated gradient), silently. state_dict() between backward and step read the state
    while the worker could still be writing it. Either is an error now, or the GPU AdamW's bits."""
    runs = []
    for offload in (False, True):
        model, opt, off, x = _linear(offload, streamed=True)
        for step in range(3):
            try:
                for _ in range(2):
                    if off is not None and step > 0 and between == "arm":
                        off.arm(update=True)
                    model(x).square().sum().backward()
                    if off is not None and step > 0 and between == "state_dict":
                        if off._early is None:
                            off.arm(update=True)
                        else:
                            opt.state_dict()  # (a checkpoint taken between backward and step)
            except RuntimeError as e:
                assert "arrived twice" in str(e)
                return
            opt.step()
            opt.zero_grad()
        runs.append(_weights(model))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def _shards_of_one_storage():
    """Two parameters viewing one flat GPU tensor (ZeRO 1/2's shards of a bucket, as
    OffloadOptimizer sees them), their offloaded AdamW and an input: (flat, params, opt, x)."""
    from infinitrain.optim import AdamW, OffloadOptimizer
    it.manual_seed(0)
    flat = it.randn(40).to("cuda")
    params = [nn.Parameter(flat[:32].view(4, 8)), nn.Parameter(flat[32:])]
    return flat, params, OffloadOptimizer(AdamW(params, lr=1e-2), "cpu"), it.randn(3, 8).to("cuda")


@needs_gpu
def test_parameters_sharing_one_storage_are_not_read_back_every_step():
    """ZeRO 1/2's shards are views of one flat tensor per bucket (as OffloadOptimizer sees them):
    each shard's copy back moves the version of the storage they share, so after a step only the
    last shard's record matches and every later step reads all the others back from the GPU (one
    synchronous copy each), which is what keeping the masters was to save. The same bits either
    way; recording the versions once the step's copies are all queued keeps them current."""
    _, params, opt, x = _shards_of_one_storage()
    for _ in range(2):
        (x @ params[0].t() + params[1][:4]).square().sum().backward()
        opt.step()
        opt.zero_grad()
        assert all(opt._pushed[i] == opt._written(i) for i in range(2)), "a weight the step wrote looks foreign"


@needs_gpu
def test_the_shards_zero_gathers_after_the_step_are_not_read_back():
    """ZeRO 1/2 all-gather every rank's updated shard into the flat parameters after the step,
    which moves the version of the storage the offloaded shards view: same_weights() says the
    write leaves this optimizer's weights as it wrote them (ZeRO's step wraps its all-gather in
    it), where a write outside it makes the next step read them back."""
    flat, params, opt, x = _shards_of_one_storage()
    for step in range(2):
        (x @ params[0].t() + params[1][:4]).square().sum().backward()
        opt.step()
        opt.zero_grad()
        with it.no_grad(), opt.same_weights() if step == 0 else contextlib.nullcontext():
            flat.copy_(flat.clone())  # the all-gather's write, its values unchanged
        assert all(opt._current(i) for i in range(2)) is (step == 0)


@needs_gpu
def test_a_failed_update_during_backward_still_orders_the_copies_back_before_what_follows():
    """arm(update=True): the worker updates the parameters and queues their copies back, then a
    later batch of its fails. The step raises the failure, and the weights already queued for the
    GPU are ordered before what the current stream does next (the emulated GPU's copy stream runs
    only when something waits for it: read unordered, a weight would be the old one); no master
    is taken as current after (the next step reads the weights back)."""
    model, opt, off, x = _linear(True, streamed=True)
    model(x).square().sum().backward()
    opt.step()
    opt.zero_grad()
    off.arm(update=True)
    model(x).square().sum().backward()
    for f in list(off._early.futures):  # every parameter updated, its copy back queued
        f.result()

    def fail():
        raise RuntimeError("the host update failed")
    off._early.futures.append(off._pool.submit(fail))  # a later batch's failure
    with pytest.raises(RuntimeError, match="the host update failed"):
        opt.step()
    for i in range(2):
        np.testing.assert_array_equal(off.params[i].detach().cpu().numpy(), off.masters[i].numpy())
    assert not any(off._current(i) for i in range(2))
