"""Expert parallelism: ExpertParallel's expert blocks and refusals in one process; the
all-to-all, dispatch/combine and the experts' gradient groups on 2 and 4 ranks against one
process (tests/parallel/mpi/expert_parallel.py, expert_grads.py)."""
import numpy as np
import pytest

from infinitrain.nn.parallel.expert_parallel import ExpertParallel
from helpers import (ENV, MPI_SCRIPTS, BatchedRuns, assert_same, losses, mpirun, one_process, parallel_train,
                     parallel_train_runs)


class _Group:  # what ExpertParallel reads of a process group
    def __init__(self, rank, size):
        self.rank, self.size, self.ranks = rank, size, list(range(size))


def test_each_ep_rank_holds_a_contiguous_block_of_experts():
    assert [ExpertParallel(_Group(r, 4)).local_experts(8) for r in range(4)] == \
        [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    for bad in (6, 0):
        with pytest.raises(ValueError, match=f"num_experts {bad} must be a positive multiple of --expert_parallel 4"):
            ExpertParallel(_Group(0, 4)).local_experts(bad)


@pytest.mark.mpi
@pytest.mark.parametrize("n,ep,detail", [(2, 2, False), (4, 4, False), (4, 2, True)])
def test_all_to_all_and_dispatch_combine_against_one_process(n, ep, detail):
    """detail: with TORCH_DISTRIBUTED_DEBUG=DETAIL's argument checks, which must take each
    rank's own number of rows in an all-to-all."""
    env = {**ENV, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"} if detail else None
    assert mpirun(n, [str(MPI_SCRIPTS / "expert_parallel.py"), str(ep)], env=env).count("OK") == n


@pytest.mark.mpi
@pytest.mark.parametrize("n,args", [(2, ["2"]), (4, ["2"]), (4, ["4", "forced"])])
def test_expert_gradients_are_reduced_over_their_group_as_one_process(n, args):
    """EP 2 (expert DP 1), EP 2 x expert DP 2, EP 4 with every token routed to one expert."""
    assert mpirun(n, [str(MPI_SCRIPTS / "expert_grads.py"), *args]).count("OK") == n


# ---- a tiny MoE LLaMA trained in every layout, against one process -------------------------------
MOE = ["--model", "llama3", "--experts", "4", "--layers", "2", "--vocab", "512", "--steps", "4", "--batch", "4",
       "--seq", "16"]
LAYOUTS = [
    (2, ["--ep", "2"]),
    (4, ["--ep", "2"]),                                  # EP 2 x expert DP 2
    (4, ["--ep", "4"]),
    (4, ["--ep", "2", "--tp", "2", "--sp"]),
    (4, ["--ep", "2", "--pp", "2"]),
    (4, ["--ep", "2", "--cp", "2"]),
    (4, ["--ep", "2", "--zero", "2"]),                   # the experts sharded over their 2 holders
    (4, ["--ep", "2", "--zero", "3"]),
    (4, ["--ep", "2", "--zero", "1", "--pp", "2"]),
    (4, ["--ep", "2", "--pp", "2", "--vpp", "2", "--layers", "4", "--micro", "2"]),
    (2, ["--ep", "2", "--recompute", "full"]),
    (2, ["--ep", "2", "--recompute", "selective"]),
    (2, ["--ep", "2", "--moe_aux", "0.01", "--micro", "2"]),  # the load-balancing loss, per sequence
    (4, ["--ep", "2", "--moe_capacity", "1.0"]),         # tokens dropped per sequence, as one process drops them
    (8, ["--ep", "2", "--tp", "2", "--sp"]),             # DP 2 x EP 2 x TP 2
]

MODEL_FLAGS = ("--micro", "--moe_aux", "--moe_capacity", "--layers")  # what the one-process run takes too
BF16 = MOE + ["--dtype", "bfloat16"]
FORCED = MOE + ["--moe_top_k", "1", "--one_expert"]
BIASED = MOE + ["--moe_router", "sigmoid", "--moe_bias_rate", "1e-2"]
BIASED_LAYOUTS = [(4, ["--ep", "2"]), (4, ["--ep", "2", "--tp", "2", "--sp"])]
# every layout against one process below run as one job per rank count (the first test of each
# count starts it)
RUNS = BatchedRuns([(n, MOE + flags) for n, flags in LAYOUTS] + [(n, BIASED + flags) for n, flags in BIASED_LAYOUTS]
                   + [(2, BF16 + ["--ep", "2"]), (4, FORCED + ["--ep", "4"]), (1, BIASED)])


@pytest.mark.mpi
@pytest.mark.parametrize("n,flags", LAYOUTS, ids=[f"{n}ranks{''.join(f)}".replace("--", "-") for n, f in LAYOUTS])
def test_a_moe_llama_trains_as_one_process_in_every_expert_parallel_layout(n, flags):
    model = [v for k, v in zip(flags, flags[1:]) for v in (k, v) if k in MODEL_FLAGS]
    assert_same(losses(RUNS(n, MOE + flags)), one_process(*MOE, *model), "float32", f"{n} ranks {flags}")


@pytest.mark.mpi
def test_expert_parallelism_with_the_optimizer_state_offloaded_to_disk(tmp_path):
    flags = ["--ep", "2", "--zero", "2", "--offload", "nvme", "--offload_path", str(tmp_path)]
    assert_same(losses(parallel_train(2, MOE + flags)), one_process(*MOE), "float32", "EP 2, ZeRO-2, nvme")


@pytest.mark.mpi
def test_a_moe_llama_trains_as_one_process_in_bf16_under_expert_parallelism():
    assert_same(losses(RUNS(2, BF16 + ["--ep", "2"])), one_process(*BF16), "bfloat16", "bf16 EP 2")


@pytest.mark.mpi
def test_every_token_routed_to_one_expert_leaves_the_other_ranks_idle_not_hung():
    """Routers at zero with top-1 (the weight is 1, so they stay at zero): every token goes to
    expert 0 on EP rank 0; the other ranks' experts receive nothing, every step."""
    assert_same(losses(RUNS(4, FORCED + ["--ep", "4"])), one_process(*FORCED), "float32", "one expert")


@pytest.mark.mpi
def test_an_ep4_checkpoint_resumes_at_one_process_ep2_tp_pp_and_zero(tmp_path):
    """The experts are written under one process's names, every EP rank's (and ZeRO-2's
    optimizer state at EP 2 resumes at EP 4 the other way)."""
    whole = one_process(*MOE, "--steps", "6")[0][::2]
    save = ["--steps", "3", "--save"]

    def resume(flags, ck):
        return MOE + flags + ["--steps", "6", "--load", str(tmp_path / ck), "--first", "4"]
    at_4 = [(4, ["--ep", "2", "--tp", "2", "--sp"], "ep4"), (4, ["--ep", "2", "--pp", "2"], "ep4"),
            (4, ["--ep", "4"], "ep2zero")]  # resumed in the job of 4 that saved, one run after another
    _, _, *outs = parallel_train_runs(4, [MOE + ["--ep", "4"] + save + [str(tmp_path / "ep4")],
                                          MOE + ["--ep", "2", "--zero", "2"] + save + [str(tmp_path / "ep2zero")]]
                                      + [resume(flags, ck) for _, flags, ck in at_4])
    others = [(1, [], "ep4"), (2, ["--ep", "2"], "ep4")]
    outs += [parallel_train(n, resume(flags, ck)) for n, flags, ck in others]
    for (n, flags, ck), out in zip(at_4 + others, outs):
        np.testing.assert_allclose(losses(out)[0][::2], whole[3:], rtol=1e-5, atol=0,
                                   err_msg=f"{n} ranks {flags} from {ck}")


@pytest.mark.mpi
def test_the_example_trains_a_moe_preset_at_ep2_as_one_process_and_exports_every_expert(tmp_path):
    """The front door: `mpirun -np 2 python -m infinitrain.examples.llama3 --model moe-tiny
    --expert_parallel 2` prints the one-process losses, and its transformers export holds all
    four experts of each layer (the EP ranks' halves gathered)."""
    from safetensors import safe_open
    from helpers import example, step_losses, write_tokens
    shard = write_tokens(tmp_path / "t.bin")
    args = ["--model", "moe-tiny", "--input_bin", str(shard), "--batch_size", "2", "--sequence_length", "32",
            "--total_batch_size", "128", "--num_iteration", "3", "--learning_rate", "3e-3"]
    one = step_losses(example(1, "llama3", args))
    out = example(2, "llama3", args + ["--expert_parallel", "2", "--save_pretrained", str(tmp_path / "hf")])
    assert "EP=2" in out and "imbalance" in out, out
    np.testing.assert_allclose(step_losses(out), one, rtol=1e-5, atol=0)
    with safe_open(tmp_path / "hf" / "model.safetensors", "np") as f:
        experts = {k.split(".experts.")[1].split(".")[0] for k in f.keys() if ".experts." in k}
    assert experts == {"0", "1", "2", "3"}, experts


def _biases(stdout: str) -> list:
    import re
    return re.search(r"biases (.*)$", stdout, re.M).group(1).split()


@pytest.mark.mpi
@pytest.mark.parametrize("n,flags", BIASED_LAYOUTS, ids=["ep2-dp2", "ep2-tp2sp"])
def test_the_selection_biases_move_as_in_one_process(n, flags):
    """DeepSeek-V3's bias balancing (a sigmoid router): each step's loads summed over DP x CP
    (and the sequence-parallel TP ranks) move the biases; after the steps they are the one
    process's, bit for bit, and so are the losses. (PP and CP sum the loads over the same
    group as DP: checked by hand, left out for the suite's time.)"""
    one, got = RUNS(1, BIASED), RUNS(n, BIASED + flags)
    assert _biases(got) == _biases(one) and len(set(_biases(one))) > 1, (_biases(got), _biases(one))
    assert_same(losses(got), losses(one), "float32", f"biased routing, {n} ranks {flags}")


def test_a_wrapper_not_told_the_expert_group_refuses_instead_of_mixing_experts():
    import infinitrain as it
    from infinitrain import nn
    from infinitrain.nn.parallel.expert_parallel import require_expert_group
    from infinitrain.nn.utils import clip_grad_norm_
    expert = nn.Linear(2, 2)
    expert.weight.expert_parallel = True
    expert(it.ones(1, 2)).sum().backward()
    with pytest.raises(ValueError, match="clip_grad_norm_: the model's experts are split .* pass expert_group="):
        clip_grad_norm_(expert.parameters(), 1.0)
    with pytest.raises(ValueError, match="DistributedDataParallel: .* pass expert_process_group="):
        require_expert_group(expert.parameters(), None, "DistributedDataParallel", "expert_process_group",
                             _Group(0, 2))
    require_expert_group(expert.parameters(), None, "DistributedDataParallel", "expert_process_group", _Group(0, 1))
    require_expert_group(nn.Linear(2, 2).parameters(), None, "clip_grad_norm_", "expert_group")  # no experts
