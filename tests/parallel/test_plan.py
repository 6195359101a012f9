"""ParallelPlan: every fact of a layout derived once, and every impossible combination refused
by its constructor with the message the examples show (a plan built from a bare Layout needs no
process groups, so these run in one process)."""
import pytest

from infinitrain.nn.parallel import Layout, ParallelPlan


def plan(world=1, rank=0, tp=1, pp=1, cp=1, ep=1, **options):
    return ParallelPlan(Layout(world, tp=tp, pp=pp, cp=cp, ep=ep), rank, **options)


@pytest.mark.parametrize("layout,options,message", [
    ({"world": 2, "pp": 2}, {"zero_stage": 3}, "--zero_stage 3 does not compose with --pipeline_parallel yet"),
    ({}, {"virtual_pipeline_parallel": 2}, "--virtual_pipeline_parallel 2 splits each pipeline stage into chunks"),
    ({"world": 2, "pp": 2}, {"pipeline_schedule": "interleaved"}, "interleaved needs --virtual_pipeline_parallel 2"),
    ({"world": 2, "pp": 2}, {"pipeline_schedule": "1f1b", "virtual_pipeline_parallel": 2}, "runs one chunk per stage"),
    ({"world": 2, "pp": 2}, {"pipeline_schedule": "zigzag"}, "unknown pipeline schedule 'zigzag'"),
    ({}, {"pipeline_split": "random"}, "pipeline split must be 'balanced' or 'even'"),
    ({}, {"cp_comm": "ulysses"}, "context parallel communication must be one of"),
    ({}, {"zero_stage": 4}, "ZeRO stage must be 0, 1, 2 or 3"),
    ({}, {"offload_optimizer": "disk"}, "offload device must be 'none', 'cpu' or 'nvme'"),
    ({}, {"offload_param": "nvme", "offload_optimizer": "nvme", "offload_path": "/tmp"},
     "--offload_param nvme offloads ZeRO-3's pieces of the parameters: add --zero_stage 3"),
    ({}, {"zero_stage": 3, "offload_param": "nvme"}, "keeps the parameters with the AdamW state"),
    ({}, {"offload_optimizer": "cpu", "device": "cpu"}, "--offload_optimizer cpu moves the AdamW state off the GPU"),
    ({}, {"offload_optimizer": "nvme"}, "--offload_optimizer nvme needs --offload_path DIR"),
    ({}, {"offload_path": "/tmp"}, "--offload_path is for --offload_optimizer nvme"),
    ({"world": 4, "tp": 2, "ep": 2}, {}, "--expert_parallel 2 with --tensor_parallel 2 needs --sequence_parallel"),
    ({"world": 2, "ep": 2}, {"zero_stage": 3, "offload_param": "cpu", "offload_optimizer": "cpu"},
     "--offload_param does not compose with --expert_parallel 2 yet"),
])
def test_an_impossible_combination_is_refused_when_the_plan_is_made(layout, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(**layout, **options)


def test_the_gradient_group_spans_dp_and_cp_and_zero_is_active_only_where_it_shards():
    p = plan(8, tp=2, cp=2, zero_stage=2)  # DP 2 x CP 2
    assert (p.dp, p.cp, p.dp_cp) == (2, 2, 4) and p.zero and p.active_zero_stage == 2
    assert p.data_parallel_wrapper == "zero" and not p.zero_has_no_effect
    one = plan(2, tp=2, zero_stage=2)  # one DP x CP rank: nothing to shard
    assert not one.zero and one.active_zero_stage == 0 and one.zero_has_no_effect
    assert one.data_parallel_wrapper is None
    # ZeRO-3 on one rank still runs when it offloads its parameters (ZeRO-Infinity)
    alone = plan(zero_stage=3, offload_optimizer="nvme", offload_param="nvme", offload_path="/tmp")
    assert alone.zero and alone.shards_parameters and alone.data_parallel_wrapper == "zero"
    assert plan(2).data_parallel_wrapper == "ddp" and plan(4, pp=2).data_parallel_wrapper == "pipeline"


def test_the_sequence_is_split_by_cp_and_by_tp_under_sp():
    assert plan(8, tp=2, cp=2, sequence_parallel=True).sequence_divisor == 4
    assert plan(8, tp=2, cp=2, sequence_parallel=True).tokens_per_rank(64) == 16
    assert plan(4, tp=2, cp=2).sequence_divisor == 2  # TP without SP keeps whole sequences
    p = plan(sequence_parallel=True)  # SP needs TP > 1 to split anything
    assert not p.sp and p.sequence_divisor == 1


def test_the_schedule_defaults_by_the_virtual_stages():
    assert plan().pipeline_schedule is None and not plan().pipelined
    assert plan(2, pp=2).pipeline_schedule == "1f1b"
    assert plan(2, pp=2, virtual_pipeline_parallel=2).pipeline_schedule == "interleaved"
    assert plan(2, pp=2, virtual_pipeline_parallel=2, pipeline_schedule="gpipe").pipeline_schedule == "gpipe"


def test_who_writes_files_saves_and_samples():
    # world 16: TP 2 (fastest), CP 2, DP 2, PP 2; rank = tp + 2 cp + 4 dp + 8 pp
    layout = dict(world=16, tp=2, cp=2, pp=2)
    writers = [r for r in range(16) if plan(rank=r, **layout).writes_files]
    assert writers == [0, 8]  # TP 0, CP 0, DP 0 of each stage
    assert [r for r in range(16) if plan(rank=r, **layout).saves_checkpoint] == [0, 1, 8, 9]
    assert all(plan(rank=r, zero_stage=1, **layout).saves_checkpoint for r in range(16))  # each holds a shard
    assert [r for r in range(16) if plan(rank=r, **layout).runs_generation] == [0, 1, 2, 3, 8, 9, 10, 11]


def test_the_log_line_and_variants():
    p = plan(8, tp=2, pp=2, sequence_parallel=True, virtual_pipeline_parallel=2)
    assert p.describe() == "DP=2, TP=2, SP=2, PP=2, CP=1, VPP=2"
    assert plan(2, tp=2).describe() == "DP=1, TP=2, SP=0, PP=1, CP=1"
    assert p.with_options(zero_stage=2).zero_stage == 2 and p.zero_stage == 0
    with pytest.raises(ValueError, match="does not compose"):
        p.with_options(zero_stage=3)


def test_a_plan_without_process_groups_says_so_when_they_are_needed():
    with pytest.raises(RuntimeError, match="without process groups"):
        plan(2).gradient_group
    assert plan(1).tensor_parallel() is None and plan(1).pipeline_stage() is None  # nothing to build


def test_each_fact_of_a_layout_has_one_home():
    """A grep of the package: the facts the plan (or TensorParallel's sequence_split) answers are
    not derived again elsewhere."""
    import re
    from helpers import ROOT
    homes = {"nn/parallel/plan.py", "nn/parallel/tensor_parallel/shard.py"}
    derivations = [r"sequence_parallel else 1", r"tp\.size if .*sequence_parallel", r"first_replica and",
                   r"coords\.tp == 0", r"zero_stage == 3 and .*pipeline", r"\.dp \* .*\.cp\b",
                   r"\.dp_cp_group\b", r"offload_\w+ (?:not )?in \(None, \"none\"\)", r"interleaved\" if .*virtual"]
    found = []
    for path in (ROOT / "infinitrain").rglob("*.py"):
        rel = path.relative_to(ROOT / "infinitrain").as_posix()
        if rel in homes:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(re.search(d, line) for d in derivations):
                found.append(f"{rel}:{n}: {line.strip()}")
    # (the groups themselves are made where the other groups are)
    found = [f for f in found if not f.startswith(("nn/parallel/global_env.py", "nn/parallel/layout.py"))
             or "dp_cp_group" not in f]
    assert not found, "derived again outside ParallelPlan:\n" + "\n".join(found)


def test_expert_parallelism_is_carved_out_of_dp_x_cp_in_blocks_of_neighbours():
    L = Layout(16, tp=2, cp=2, ep=2)  # DP 4 x CP 2 = 8 ranks per TP coordinate
    assert L.ep == 2 and L.dp == 4 and "EP=2" in L.describe() and "ep=2" in repr(L)
    assert L.dp_cp_group(0) == [0, 2, 4, 6, 8, 10, 12, 14]
    # EP neighbours in the DP x CP order; the ranks at the same place of each block hold the same experts
    assert L.ep_group(0) == [0, 2] and L.ep_group(6) == [4, 6] and L.ep_group(3) == [1, 3]
    assert L.expert_dp_group(0) == [0, 4, 8, 12] and L.expert_dp_group(6) == [2, 6, 10, 14]
    for kind, size in (("ep", 2), ("expert_dp", 4)):
        groups = L.all_groups(kind)
        assert len(groups) == 16 // size and sorted(r for g in groups for r in g) == list(range(16))
    four = Layout(8, ep=4)  # EP 4 x expert DP 2
    assert four.ep_group(5) == [4, 5, 6, 7] and four.expert_dp_group(5) == [1, 5]
    assert Layout(4).ep_group(2) == [2] and Layout(4).expert_dp_group(2) == [0, 1, 2, 3]


@pytest.mark.parametrize("sizes,message", [
    ({"world": 4, "ep": 3}, "--expert_parallel 3 must divide data parallel 4 x context parallel 1 (= 4)"),
    ({"world": 12, "tp": 2, "cp": 2, "ep": 4}, "--expert_parallel 4 must divide data parallel 3 x context parallel 2"),
    ({"world": 8, "tp": 4, "ep": 4}, "--expert_parallel 4 must divide data parallel 2"),
    ({"world": 2, "ep": 0}, "expert parallel size must be a positive integer, got 0"),
])
def test_an_expert_parallel_size_that_does_not_divide_dp_x_cp_is_refused(sizes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Layout(sizes.pop("world"), **sizes)


def test_the_plan_knows_the_expert_sizes_and_groups():
    p = plan(8, tp=2, ep=2, sequence_parallel=True)  # DP 4, EP 2 x expert DP 2
    assert (p.ep, p.expert_dp, p.dp_cp) == (2, 2, 4)
    assert p.describe() == "DP=4, TP=2, SP=2, PP=1, CP=1, EP=2"
    assert plan(2).describe() == "DP=2, TP=1, SP=0, PP=1, CP=1"  # EP 1 is not shown
    with pytest.raises(RuntimeError, match="without process groups"):
        p.expert_parallel()
    assert plan(2).expert_parallel() is None  # EP 1: no ExpertParallel, no groups needed
