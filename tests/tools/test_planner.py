"""The layout planner (infinitrain.plan): every layout it proposes is one the engine builds,
its memory is the memory plan's, its time model's arithmetic on hand-computed cases (the
alpha-beta collectives, compute from FLOPs, the pipeline's bubble from the simulator), the
command line and --explain; calibrate on two ranks (mpi)."""
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

import infinitrain as it
from infinitrain.models import GPT2, GPT2_PRESETS, LLAMA3_PRESETS, LLaMA3
from infinitrain.nn.parallel.context_parallel import ContextParallel
from infinitrain.nn.parallel.expert_parallel import ExpertParallel
from infinitrain.nn.parallel.memory_plan import stage_estimates, stage_parameters
from infinitrain.nn.parallel.pp import simulate
from infinitrain.nn.parallel.pp.schedules import placement
from infinitrain.nn.parallel.pp.stage import PipelineStage
from infinitrain.nn.parallel.tensor_parallel import TensorParallel
from infinitrain.plan import Cluster, Profile, enumerate_candidates, parse, predict, refusal
from infinitrain.plan.__main__ import main
from infinitrain.plan.profile import collective_time, fit_alpha_beta
from helpers import launch, run

CLUSTER = Cluster(nodes=1, ranks_per_node=4, cores_per_node=4, memory_per_node=64 * 2**30)
R = 1e10  # a flat rate, FLOP/s
FLAT = Profile({"matmul": [[1, R]], "attention": [[1, R]], "memory_bandwidth": 1e30, "optimizer": 1e30, "cores": 1,
                "intra_node": {c: {"alpha": 1e-5, "beta": 1e-9} for c in
                               ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")}})


def _group(size, rank=0):
    return SimpleNamespace(size=size, rank=rank)


def _build(cls, config, c, T):
    """The real model of a candidate's layout, built on stand-in groups (each pipeline stage's,
    the last holding the head), and its batch check: what the examples do before training."""
    plan = c.plan()
    tp = TensorParallel(_group(c.tp), c.sequence_parallel) if c.tp > 1 else None
    cp = ContextParallel(_group(c.cp), c.cp_comm) if c.cp > 1 else None
    ep = {"ep": ExpertParallel(_group(c.ep))} if c.ep > 1 else {}
    for stage in range(c.pp):
        pp = (PipelineStage(_group(c.pp, stage), c.virtual_pipeline_parallel, None, "balanced",
                            placement(plan.pipeline_schedule)) if c.pp > 1 else None)
        model = cls(config, tp=tp, pp=pp, cp=cp, **ep)
        model.check_batch(it.zeros(1, T, dtype=it.int64))


@pytest.mark.parametrize("cls,config", [(GPT2, GPT2_PRESETS["tiny"]), (LLaMA3, LLAMA3_PRESETS["tiny"]),
                                        (LLaMA3, LLAMA3_PRESETS["moe-tiny"])], ids=["gpt2", "llama3", "moe"])
def test_every_layout_proposed_is_one_the_model_builds_and_one_it_refuses_is_refused(cls, config):
    """On 4 ranks: each distinct layout the planner keeps builds (the constructors' own checks),
    and TP over more heads than the model has, which it refuses, the constructor refuses too
    (a 1024-token vocabulary keeps the builds fast; the planner is asked about the same model)."""
    config = replace(config, vocab_size=1024)
    kept, refused = enumerate_candidates(4, config, cls, 8, 64, zero_stages=(0,), recompute=("none",),
                                         cp_comms=("p2p", "a2a"), micro_batches=[2])
    assert kept and refused
    layouts = {}
    for c in kept:
        layouts.setdefault((c.tp, c.sequence_parallel, c.pp, c.pipeline_schedule, c.cp, c.cp_comm, c.ep), c)
    for c in layouts.values():
        _build(cls, config, c, 64)
    c = parse("dp=1,tp=4,sp=1,mb=2")
    assert refusal(c, config, cls, 8, 64) is not None and c not in kept
    with pytest.raises(ValueError, match="tensor parallel 4 does not divide"):
        _build(cls, config, c, 64)


def test_every_component_of_every_layout_is_a_positive_figure():
    cfg = GPT2_PRESETS["tiny"]
    kept, _ = enumerate_candidates(4, cfg, GPT2, 8, 64, micro_batches=[2])
    for c in kept:
        pred = predict(c, cfg, GPT2, CLUSTER, Profile({}), 8, 64)
        assert min(pred.time.values()) >= 0 and min(pred.memory.values()) >= 0 and min(pred.passes) > 0, c.name


def test_the_planner_runs_on_every_preset():
    from infinitrain.plan import best_layouts
    cluster = Cluster(nodes=1, ranks_per_node=2, cores_per_node=2, memory_per_node=2**50)
    for cls, presets in ((GPT2, GPT2_PRESETS), (LLaMA3, LLAMA3_PRESETS)):
        for name, cfg in presets.items():
            ranked = best_layouts(2, cfg, cls, cluster, FLAT, 4, 128, micro_batches=[1], zero_stages=(0,),
                                  recompute=("none",))
            assert ranked and ranked[0].fits and ranked[0].step_time > 0, name


def test_refusals_are_the_engines_messages():
    cfg = GPT2_PRESETS["tiny"]
    assert "does not compose with --pipeline_parallel" in refusal(parse("dp=2,pp=2,zero=3,mb=1"), cfg, GPT2, 8, 64)
    assert "does not divide n_head (2)" in refusal(parse("tp=4,mb=2"), cfg, GPT2, 8, 64)
    assert "needs at least as many micro-batches" in refusal(parse("pp=2,schedule=zb-h1,mb=8"), cfg, GPT2, 8, 64)
    assert "must be a multiple of 4" in refusal(parse("cp=2,mb=8"), cfg, GPT2, 8, 62)
    assert "query heads must be a multiple of 4" in refusal(parse("cp=4,cp_comm=a2a,mb=8"), cfg, GPT2, 8, 64)
    assert "block size 256" in refusal(parse("mb=8"), cfg, GPT2, 8, 512)
    assert refusal(parse("dp=2,pp=2,schedule=zbv,vpp=2,mb=1"), GPT2_PRESETS["small"], GPT2, 8, 64) is None


def test_a_layouts_name_and_flags_round_trip():
    c = parse("dp=2,tp=2,sp=1,pp=2,schedule=interleaved,vpp=2,cp=1,zero=1,recompute=full,mb=2")
    assert parse(c.name) == c and c.world_size == 8
    assert c.flags(16, 128) == ["--batch_size", "2", "--sequence_length", "128", "--total_batch_size", "2048",
                                "--tensor_parallel", "2", "--pipeline_parallel", "2", "--zero_stage", "1",
                                "--recompute", "full", "--sequence_parallel", "--pipeline_schedule", "interleaved",
                                "--virtual_pipeline_parallel", "2"]
    with pytest.raises(ValueError, match="'dq=2' is not one of"):
        parse("dq=2")


def test_memory_is_the_memory_plans_busiest_stage():
    cfg = GPT2_PRESETS["small"]
    for text in ("dp=4,zero=2,mb=2", "dp=2,pp=2,schedule=1f1b,zero=1,mb=1", "tp=2,sp=1,cp=2,mb=8"):
        c = parse(text)
        pred = predict(c, cfg, GPT2, CLUSTER, FLAT, 8, 128)
        M = 8 // (c.batch_size * c.dp)
        busiest = max((parts for parts, *_ in stage_estimates(c.plan(), cfg, GPT2, c.batch_size, 128, M, "float32")),
                      key=lambda parts: sum(parts.values()))
        assert pred.memory == busiest and pred.fits


def test_the_alpha_beta_model_and_its_fit():
    link = {"alpha": 2e-6, "beta": 1e-9}
    assert collective_time(link, "all_reduce", 4, 8e6) == pytest.approx(6 * 2e-6 + 1.5 * 8e6 * 1e-9)
    assert collective_time(link, "all_gather", 4, 8e6) == pytest.approx(3 * 2e-6 + 0.75 * 8e6 * 1e-9)
    assert collective_time(link, "send_recv", 2, 8e6) == pytest.approx(2e-6 + 8e6 * 1e-9)
    assert collective_time(link, "all_reduce", 1, 8e6) == 0
    sizes = [4096, 65536, 1 << 20]
    fitted = fit_alpha_beta("all_reduce", 4, sizes, [collective_time(link, "all_reduce", 4, s) for s in sizes])
    assert fitted["alpha"] == pytest.approx(2e-6) and fitted["beta"] == pytest.approx(1e-9)


def test_compute_is_the_models_flops_at_the_rate():
    """One rank, a flat rate, free memory traffic and optimizer: compute is llm.c's 6 N + 6 L C T
    FLOPs per token (N: the blocks' and the head's weights, which the products use) over R."""
    cfg = GPT2_PRESETS["tiny"]
    pred = predict(parse("mb=4"), cfg, GPT2, CLUSTER, FLAT, 8, 64)
    first, block, last = GPT2.parameter_parts(cfg)
    L, C, T = cfg.n_layer, cfg.n_embd, 64
    n = L * (GPT2.active_parameters(cfg) - first - last) / L + cfg.padded_vocab_size * C
    assert pred.time["compute"] == pytest.approx(8 * T * (6 * n + 6 * L * C * T) / R, rel=1e-9)
    assert pred.time["optimizer"] == pytest.approx(0, abs=1e-12)


def test_backward_products_and_the_loss_at_their_measured_rates_and_the_head_not_recomputed():
    """The backward's products (twice forward's FLOPs) at matmul_backward's rate, the logits
    through the loss at its rate; full recomputation reruns the blocks' forward, not the head's."""
    cfg = GPT2_PRESETS["tiny"]
    profile = Profile({**FLAT.data, "matmul_backward": [[1, R / 2]], "loss": 1e9})
    pred = predict(parse("mb=4"), cfg, GPT2, CLUSTER, profile, 8, 64)
    first, block, last = GPT2.parameter_parts(cfg)
    L, C, T = cfg.n_layer, cfg.n_embd, 64
    n = L * (GPT2.active_parameters(cfg) - first - last) / L + cfg.padded_vocab_size * C
    logits = 8 * T * cfg.padded_vocab_size
    assert pred.time["compute"] == pytest.approx(8 * T * (2 * n + 4 * n * 2 + 6 * L * C * T) / R + logits / 1e9,
                                                 rel=1e-9)
    none, full = (predict(parse(f"mb=4,recompute={r}"), cfg, GPT2, CLUSTER, FLAT, 8, 64) for r in ("none", "full"))
    f = none.passes[0]  # one block's forward on one micro-batch
    assert full.time["compute"] - none.time["compute"] == pytest.approx(2 * L * f, rel=1e-9)


def test_tps_loss_at_the_vocabulary_parallel_rate():
    """Under TP the head's logits go through the vocabulary-parallel cross-entropy at its own
    measured rate (separate passes, not the fused kernel); without TP, or unmeasured, the loss's."""
    cfg, two = GPT2_PRESETS["tiny"], Cluster(1, 2, 2, 64 * 2**30)
    fused = Profile({**FLAT.data, "loss": 1e9})
    split = Profile({**FLAT.data, "loss": 1e9, "loss_parallel": 2.5e8})
    logits = 8 * 64 * cfg.padded_vocab_size / 2  # a rank's half of the vocabulary
    tp_fused, tp_split = (predict(parse("tp=2,mb=8"), cfg, GPT2, two, p, 8, 64) for p in (fused, split))
    assert tp_split.time["compute"] - tp_fused.time["compute"] == pytest.approx(logits / 2.5e8 - logits / 1e9,
                                                                                rel=1e-9)
    dp = [predict(parse("dp=2,mb=4"), cfg, GPT2, two, p, 8, 64).time["compute"] for p in (fused, split)]
    assert dp[0] == dp[1]
    with pytest.raises(ValueError, match="loss_parallel"):
        Profile({**FLAT.data, "loss_parallel": -1.0})


def test_a_ranks_rates_are_its_threads_and_its_share_of_the_cores():
    """A CPU rank runs cores // ranks threads at the "threads" entry's rates (else the tables
    scaled by threads / cores); ranks beyond the cores share them at the node's measured
    throughput, and their collectives stretch by the busy share of the cores they wait for."""
    shared = Profile({**FLAT.data, "threads": {"2": {"matmul": [[1, 1.5 * R]]}}, "shared_cores": [[1, 1.0], [2, 0.8]],
                      "communication_cpu": 0.5})
    two_threads = shared.rates(cores_per_node=2, ranks_per_node=1)
    assert two_threads.matmul(1e9) == pytest.approx(1.5 * R)  # measured: not twice one thread's
    assert two_threads.attention(1e9) == pytest.approx(2 * R)  # no figure for 2 threads: scaled
    one_each = shared.rates(2, 2)
    assert (one_each.matmul(1e9), one_each.stretch) == (pytest.approx(R), 1.0)
    two_per_core = shared.rates(2, 4)  # half a core each, at 0.8 of the node's throughput
    assert two_per_core.matmul(1e9) == pytest.approx(R * 0.8 / 2)
    assert two_per_core.stretch == pytest.approx(1 + 0.5 * (2 / 0.8 - 1))
    old = FLAT.rates(4, 8)  # a profile without them: the rates scale with the cores a rank gets
    assert (old.matmul(1e9), old.stretch) == (pytest.approx(R / 2), 1.0)
    pred = predict(parse("dp=4,mb=2"), GPT2_PRESETS["tiny"], GPT2, Cluster(1, 4, 2, 64 * 2**30), shared, 8, 64)
    link = FLAT["intra_node"]["all_reduce"]
    params = stage_parameters(parse("dp=4,mb=2").plan(), GPT2_PRESETS["tiny"], GPT2)[0][0]
    assert pred.time["DP communication"] == pytest.approx(
        collective_time(link, "all_reduce", 4, params * 4) * two_per_core.stretch, rel=1e-3)
    with pytest.raises(ValueError, match="communication_cpu"):
        Profile({**FLAT.data, "communication_cpu": 2})


def test_pipeline_stages_waiting_leave_the_shared_cores_to_the_busy_ones():
    """Ranks beyond the cores: a stage waiting for its neighbour takes only the measured share of
    its core (pipeline_wait_cpu: its wait sleeps in short backoffs, and waking takes a share;
    absent, the share a rank waiting in MPI keeps); all of it (1) is the plain share, none (0)
    the busy time alone, a quarter between the two."""
    cfg, c = GPT2_PRESETS["tiny"], parse("dp=2,pp=2,schedule=1f1b,mb=2")
    alone, node = Cluster(1, 4, 4, 64 * 2**30), Cluster(1, 4, 2, 64 * 2**30)
    polling, sleeping = (Profile({**FLAT.data, "pipeline_wait_cpu": share}) for share in (1.0, 0.0))
    base = predict(c, cfg, GPT2, alone, polling, 8, 64)
    assert predict(c, cfg, GPT2, node, polling, 8, 64).time["compute"] == pytest.approx(2 * base.time["compute"])
    total = base.time["compute"] + base.time["pipeline bubble"]
    busy = [s / total for s in _stage_busy(base)]
    for profile, share in ((sleeping, 0.0), (Profile({**FLAT.data, "pipeline_wait_cpu": 0.25}), 0.25),
                           (Profile({**FLAT.data, "communication_cpu": 0.25}), 0.25)):
        used = 2 * sum(u + share * (1 - u) for u in busy) / 2  # ranks per core x the stages' mean share of a core
        pred = predict(c, cfg, GPT2, node, profile, 8, 64)
        assert pred.time["compute"] == pytest.approx(base.time["compute"] * max(1.0, used), rel=1e-6)
    with pytest.raises(ValueError, match="pipeline_wait_cpu"):
        Profile({**FLAT.data, "pipeline_wait_cpu": 1.5})


def test_calibrate_keeps_each_figures_median_over_its_passes():
    from infinitrain.plan.calibrate import _median
    passes = [{"matmul": [[1, 10.0], [2, 20.0]], "loss": 3.0, "threads": {"2": {"optimizer": 5.0}}, "cores": 1},
              {"matmul": [[1, 30.0], [2, 21.0]], "loss": 1.0, "threads": {"2": {"optimizer": 7.0}}, "cores": 1},
              {"matmul": [[1, 20.0], [2, 99.0]], "loss": 2.0, "threads": {"2": {"optimizer": 6.0}}, "cores": 1}]
    assert _median(passes) == {"matmul": [[1, 20.0], [2, 21.0]], "loss": 2.0, "threads": {"2": {"optimizer": 6.0}},
                               "cores": 1}


def test_calibrate_turns_the_throughput_beside_waiting_ranks_into_their_share_of_a_core():
    """With one busy and one waiting rank per core, the busy ones at 0.8 of their rate alone, and
    the node's throughput at 2 ranks per core 0.9: (1 - 0.1 w) / (1 + w) = 0.8, so w = 2/9."""
    from infinitrain.plan.calibrate import _waiting_share
    assert _waiting_share(0.8, [[1, 1.0], [2, 0.9]]) == pytest.approx(2 / 9, abs=1e-9)
    assert _waiting_share(1.05, [[1, 1.0], [2, 0.9]]) == pytest.approx(0.0, abs=1e-9)  # no cost measured: none


def test_the_heads_product_at_the_head_tables_rate_the_blocks_at_theirs():
    """The head's [C, vocab] product is rated from matmul_head / matmul_backward_head (measured at
    its own shape), the blocks' from matmul / matmul_backward, however close their FLOPs."""
    cfg = GPT2_PRESETS["tiny"]
    split = Profile({**FLAT.data, "matmul_backward": [[1, R]], "matmul_head": [[1, R / 2]],
                     "matmul_backward_head": [[1, R / 4]]})
    rates = split.rates(1, 1)
    assert (rates.matmul(1e9), rates.matmul(1e9, head=True)) == (pytest.approx(R), pytest.approx(R / 2))
    assert rates.matmul_backward(1e9, head=True) == pytest.approx(R / 4)
    assert FLAT.rates(1, 1).matmul(1e9, head=True) == pytest.approx(R)  # no head table: the blocks'
    one = Cluster(1, 1, 1, 64 * 2**30)
    flat, pred = (predict(parse("mb=4"), cfg, GPT2, one, p, 8, 64) for p in (FLAT, split))
    head = 8 * 64 * cfg.padded_vocab_size * cfg.n_embd * 2  # the head's forward FLOPs, one step
    # forward at R / 2 (one head's time more), backward's 2 x FLOPs at R / 4 (three heads' times more)
    assert pred.time["compute"] - flat.time["compute"] == pytest.approx(head / R + 3 * 2 * head / R, rel=1e-6)
    with pytest.raises(ValueError, match="matmul_head"):
        Profile({**FLAT.data, "matmul_head": [[1, -1]]})


def _stage_busy(pred) -> list:
    """Each stage's busy time of a two-stage 1F1B prediction (the busiest is time["compute"])."""
    f, b = pred.passes
    M = 2  # 8 sequences / (dp 2 x mb 2)
    return [M * (f + b) * w for w in pred.chunk_work]


def test_tensor_and_data_parallel_traffic_is_the_alpha_beta_models():
    cfg = GPT2_PRESETS["tiny"]
    pred = predict(parse("dp=2,tp=2,sp=1,mb=2"), cfg, GPT2, CLUSTER, FLAT, 8, 64)
    link = FLAT["intra_node"]
    tp = 2 * cfg.n_layer * 4 * collective_time(link["all_reduce"], "all_reduce", 2, 2 * 64 * cfg.n_embd * 4)
    assert pred.time["TP communication"] == pytest.approx(tp)
    params = stage_parameters(parse("dp=2,tp=2,sp=1,mb=2").plan(), cfg, GPT2)[0][0] / 2  # its TP half
    dp = collective_time(link["all_reduce"], "all_reduce", 2, params * 4)
    assert pred.time["DP communication"] == pytest.approx(dp, rel=1e-3)


def test_each_blocking_call_waits_the_measured_synchronization():
    """synchronization: seconds a blocking collective waits for the slowest computing rank, once
    per call (TP: four a block and micro-batch; DP: one a 25 MB bucket)."""
    cfg, c = GPT2_PRESETS["tiny"], parse("dp=2,tp=2,sp=1,mb=2")
    plain = predict(c, cfg, GPT2, CLUSTER, FLAT, 8, 64)
    waits = predict(c, cfg, GPT2, CLUSTER, Profile({**FLAT.data, "synchronization": 1e-3}), 8, 64)
    M = 8 // (2 * 2)
    assert waits.time["TP communication"] - plain.time["TP communication"] == pytest.approx(
        M * cfg.n_layer * 4 * 1e-3)
    assert waits.time["DP communication"] - plain.time["DP communication"] == pytest.approx(1e-3)  # one bucket


def test_the_pipeline_bubble_is_the_simulators():
    cfg = GPT2_PRESETS["small"]
    for text in ("pp=2,schedule=1f1b,mb=1", "pp=2,schedule=zbv,vpp=2,mb=1", "pp=4,schedule=gpipe,mb=2"):
        c = parse(text)
        pred = predict(c, cfg, GPT2, CLUSTER, FLAT, 8, 64)
        f, b = pred.passes
        sim = simulate(c.pipeline_schedule, c.pp, c.virtual_pipeline_parallel, 8 // c.batch_size, forward_cost=f,
                       backward_cost=b, chunk_work=pred.chunk_work)
        assert pred.time["compute"] + pred.time["pipeline bubble"] == pytest.approx(sim["time"])
        assert pred.time["pipeline bubble"] > 0


def test_the_command_line_lists_ranked_layouts_and_explains_one(capsys, tmp_path):
    path = tmp_path / "p.json"
    FLAT.save(path)
    common = ["--model", "tiny", "--global_batch", "8", "--sequence_length", "64", "--cores_per_node", "4",
              "--ranks_per_node", "2", "--memory_per_node", "8", "--profile", str(path), "--top", "3"]
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "layouts the examples accept" in out and out.count("mpiexec -n 2 python -m infinitrain.examples.gpt2") == 3
    assert main(common + ["--explain", "dp=2,zero=1,mb=2"]) == 0
    out = capsys.readouterr().out
    assert "DP communication: 1 x reduce_scatter" in out and "step: compute" in out and "--zero_stage 1" in out
    with pytest.raises(SystemExit, match="the examples refuse this layout: sequence parallelism splits the sequence "
                                         "over tensor parallel 2, which does not divide the sequence length 63"):
        main(common + ["--explain", "tp=2,sp=1,mb=8", "--sequence_length", "63"])
    assert main(common[:-2] + ["--simulate", "1", "2", "--weak_scaling", "--micro_batches", "2", "--zero_stages", "0",
                               "--recompute", "none"]) == 0
    lines = capsys.readouterr().out.splitlines()[-2:]
    assert [ln.split()[:3] for ln in lines] == [["1", "2", "8"], ["2", "4", "16"]] and "100%" in lines[0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"memory_bandwidth": -1}))
    with pytest.raises(SystemExit, match="'memory_bandwidth' must be a positive number, got -1"):
        main(common[:-4] + ["--profile", str(bad)])



def test_the_shipped_gpu_profiles_load_by_name_and_price_bf16_products_at_their_rates(capsys, tmp_path):
    from infinitrain.plan.profile import SHIPPED
    assert {"h100-sxm", "a100-sxm-80gb"} <= set(SHIPPED)
    h100, a100 = Profile.load("h100-sxm"), Profile.load("a100-sxm-80gb")
    assert h100["dtype"] == "bfloat16" and h100["source"] and h100.matmul_rate(1e11, 1) == pytest.approx(7.0e14, 0.01)
    assert a100.matmul_rate(1e11, 1) < h100.matmul_rate(1e11, 1)  # and the rates are the files', not placeholders
    common = ["--model", "gpt2", "--global_batch", "64", "--sequence_length", "1024", "--gpus_per_node", "8",
              "--memory_per_node", "640", "--dtype", "bfloat16", "--explain", "dp=8,zero=1,mb=8"]
    assert main(common + ["--profile", "h100-sxm"]) == 0
    assert "rates from h100-sxm\n" in capsys.readouterr().out  # (no dtype note: the profile's are bf16's)
    assert main(common[:-4] + ["--dtype", "float32", "--explain", "dp=8,zero=1,mb=8", "--profile", "h100-sxm"]) == 0
    assert "its rates are bfloat16's, the job's products float32" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="profile h200-made-up: cannot be read as JSON"):
        main(common + ["--profile", "h200-made-up"])


def test_an_llmc_checkpoint_or_a_transformers_folder_is_the_model_without_its_weights_read(capsys, tmp_path):
    gpt2, llama = GPT2(GPT2_PRESETS["tiny"], seed=0), LLaMA3(LLAMA3_PRESETS["tiny"], seed=0)
    gpt2.save_llmc(tmp_path / "gpt2.bin")
    llama.save_llmc(tmp_path / "llama.bin")
    gpt2.save_pretrained(tmp_path / "hf")
    common = ["--global_batch", "8", "--sequence_length", "64", "--cores_per_node", "2", "--ranks_per_node", "2",
              "--memory_per_node", "8", "--explain", "dp=2,zero=1,mb=2"]
    for path, cls, flag in ((tmp_path / "gpt2.bin", "GPT2", "--llmc_filepath"),
                            (tmp_path / "llama.bin", "LLaMA3", "--llmc_filepath"), (tmp_path / "hf", "GPT2",
                                                                                   "--from_pretrained")):
        assert main(["--model", str(path)] + common) == 0
        out = capsys.readouterr().out
        example = "llama3" if cls == "LLaMA3" else "gpt2"
        assert out.startswith(f"{cls} {path}:") and f"examples.{example} {flag} {path} " in out, out
    preset = main(["--model", "tiny"] + common) == 0 and capsys.readouterr().out
    assert preset.split("\n")[2:4] == out.split("\n")[2:4]  # the folder's model is the preset it was saved from
    (tmp_path / "foreign.bin").write_bytes(b"\x00" * 2048)
    with pytest.raises(SystemExit, match="magic number 0 is neither an llm.c GPT-2 checkpoint's"):
        main(["--model", str(tmp_path / "foreign.bin")] + common)
    (tmp_path / "gpt2.bin").write_bytes((tmp_path / "gpt2.bin").read_bytes()[:4096])
    with pytest.raises(SystemExit, match="truncated"):
        main(["--model", str(tmp_path / "gpt2.bin")] + common)

def test_the_memory_refusal_names_the_plans_fitting_layouts():
    from infinitrain.nn.parallel import Layout, ParallelPlan
    from infinitrain.plan.auto import fitting_layouts
    plan = ParallelPlan(Layout(2))
    names = fitting_layouts(plan, GPT2_PRESETS["tiny"], GPT2, 2, 64, 2, "float32", 2, 64 * 2**30)
    assert len(names) == 3 and all(parse(n).world_size == 2 for n in names)
    assert fitting_layouts(plan, GPT2_PRESETS["tiny"], GPT2, 2, 64, 2, "float32", 2, 2**20) == []


@pytest.mark.mpi
def test_layout_auto_trains_with_the_layout_the_plan_picks(tmp_path):
    from helpers import example, write_tokens
    out = example(2, "gpt2", ["--input_bin", write_tokens(tmp_path / "t.bin"), "--model", "tiny", "--layout", "auto",
                              "--sequence_length", "32", "--total_batch_size", "256", "--num_iteration", "1",
                              "--peak_tflops", "1"])
    chosen = parse(out.split("layout auto: ")[1].split(" ")[0])
    assert chosen.world_size == 2 and f"DP={chosen.dp}, TP={chosen.tp}" in out and "step    1/1" in out


@pytest.mark.mpi
def test_calibrate_on_four_ranks_measures_the_collectives_and_the_shared_cores(tmp_path):
    """Four ranks on this 2-core machine (CI's too): two ranks per core, and a pipeline wait
    beside each busy rank."""
    import os
    import sys
    cores = len(os.sched_getaffinity(0))
    out = run(launch(4) + [sys.executable, "-m", "infinitrain.plan", "calibrate", "--output", tmp_path / "p.json",
                           "--repeats", "1", "--passes", "1", "--quick"], timeout=300, check=True)
    assert f"collectives over {min(cores, 4)} ranks" in out.stdout
    profile = Profile.load(tmp_path / "p.json")
    assert profile["measured_ranks"] == 4 and profile["intra_node"]["all_reduce"]["beta"] > 0
    if cores <= 2:
        assert 0 <= profile["pipeline_wait_cpu"] <= 1 and profile["shared_cores"][-1][0] == 4 // cores


def test_overlap_sets_a_groups_share_from_a_trace_of_the_profiler(tmp_path, capsys):
    """`plan overlap`: the share of a trace's communication during which its rank computed,
    over every rank (rank 0: 4 ms of a 10 ms transfer beside a kernel; rank 1: 0 of 10 ms; an
    asynchronous call only queues and is not counted), written into the profile's overlap."""
    from infinitrain.plan.__main__ import main

    def span(pid, cat, ts, dur, **args):
        return {"name": cat, "cat": cat, "ph": "X", "pid": pid, "tid": 0, "ts": ts, "dur": dur, "args": args}
    events = [span(0, "comm", 0, 10_000), span(0, "kernel", 6_000, 9_000),
              span(0, "comm", 20_000, 5_000, **{"async": True}), span(1, "comm", 0, 10_000),
              span(1, "kernel", 10_000, 1_000)]
    (tmp_path / "dp.json").write_text(json.dumps({"traceEvents": events}))
    FLAT.save(tmp_path / "p.json")
    assert main(["overlap", "--profile", str(tmp_path / "p.json"), f"dp={tmp_path / 'dp.json'}"]) == 0
    assert "dp: " in capsys.readouterr().out
    written = Profile.load(tmp_path / "p.json")
    assert written["overlap"]["dp"] == pytest.approx(0.2) and written["overlap"]["tp"] == FLAT["overlap"]["tp"]
    (tmp_path / "none.json").write_text(json.dumps({"traceEvents": [span(0, "kernel", 0, 5)]}))
    assert main(["overlap", "--profile", str(tmp_path / "p.json"), f"dp={tmp_path / 'none.json'}"]) == 2
    assert "no communication" in capsys.readouterr().err
    assert main(["overlap", "--profile", str(tmp_path / "p.json"), f"pp={tmp_path / 'dp.json'}"]) == 2
    (tmp_path / "bad.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "comm", "ts": 0}]}))
    assert main(["overlap", "--profile", str(tmp_path / "p.json"), f"dp={tmp_path / 'bad.json'}"]) == 2
    assert "no numeric ts and dur" in capsys.readouterr().err
    (tmp_path / "cut.json").write_text(json.dumps({"traceEvents": events})[:100])
    assert main(["overlap", "--profile", str(tmp_path / "p.json"), f"dp={tmp_path / 'cut.json'}"]) == 2
