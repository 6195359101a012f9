"""infinitrain.deepspeed: the config read key by key (the batch sizes' rule, unknown keys warned,
wrong ones refused naming the key, fp16 refused for bf16, the keys with no effect named), DeepSpeed's
schedules against their formulas, the engine's loop against TrainStep (bit-equal: the same code
runs), checkpoints with client_state resuming bit for bit, the examples' --deepspeed_config. On 2
ranks (mpi): the three example configs against TrainStep, and the encoder-decoder under a config
against its flags."""
import argparse
import json
import math
import re

import numpy as np
import pytest

import infinitrain as it
from infinitrain import deepspeed
from infinitrain.deepspeed import ConfigError, parse_config
from infinitrain.deepspeed.lr_schedules import OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR
from infinitrain.models import GPT2Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.nn.parallel import Layout, ParallelPlan
from infinitrain.nn.parallel.train_step import TrainStep
from infinitrain.optim import SGD, Adam, AdamW
from helpers import MPI_SCRIPTS, example, mpirun

CFG = GPT2Config(block_size=16, vocab_size=300, n_layer=2, n_head=2, n_embd=16)
ONE = ParallelPlan(Layout(1))  # this process alone


def config(**extra) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
            "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "weight_decay": 0.1}},
            **extra}


def batches(step):
    tokens = np.random.default_rng(step).integers(0, 300, (2, 2, 9))  # 2 micro-batches of 2 x 8
    return [(it.tensor(t[:, :-1].copy()), it.tensor(t[:, 1:].copy())) for t in tokens]


# ---- the config ---------------------------------------------------------------------------------
def test_any_two_batch_sizes_give_the_third_and_a_contradiction_names_the_three():
    c = parse_config({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, dp=2)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == (32, 4, 4)
    c = parse_config({"train_batch_size": 32, "gradient_accumulation_steps": 2}, dp=4)
    assert c.train_micro_batch_size_per_gpu == 4
    c = parse_config({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, dp=2)
    assert c.train_batch_size == 30
    assert parse_config({"train_batch_size": 8}, dp=2).train_micro_batch_size_per_gpu == 4
    with pytest.raises(ConfigError, match=r"train_batch_size \(16\), train_micro_batch_size_per_gpu \(4\) and "
                                          r"gradient_accumulation_steps \(4\) with 2 data-parallel ranks: they "
                                          "contradict"):
        parse_config({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4},
                     dp=2)
    with pytest.raises(ConfigError, match="not a multiple"):
        parse_config({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4}, dp=1)
    with pytest.raises(ConfigError, match="set train_batch_size or train_micro_batch_size_per_gpu"):
        parse_config({"gradient_accumulation_steps": 2})
    with pytest.raises(ConfigError, match="train_batch_size must be a positive integer"):
        parse_config({"train_batch_size": "16"})


def test_unknown_keys_warn_wrong_ones_are_refused_by_name_and_no_effect_keys_are_named(tmp_path):
    with pytest.warns(UserWarning, match="unknown key 'zero_optimization.stag'"):
        parse_config({"train_batch_size": 4, "zero_optimization": {"stag": 2}})
    with pytest.warns(UserWarning, match="unknown key 'trian_batch_size'"):
        parse_config({"train_batch_size": 4, "trian_batch_size": 4})
    for bad, key in [({"gradient_clipping": -1}, "gradient_clipping"), ({"zero_optimization": {"stage": 4}},
                     "zero_optimization.stage"), ({"bf16": {"enabled": "yes"}}, "bf16.enabled"),
                     ({"optimizer": {"type": "Lamb"}}, "optimizer.type"), ({"steps_per_print": 0}, "steps_per_print"),
                     ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
                      "zero_optimization.offload_optimizer.device nvme needs"),
                     ({"zero_optimization": {"offload_param": {"device": "gpu"}}},
                      "zero_optimization.offload_param.device"),
                     ({"scheduler": {"type": "WarmupLR", "params": []}}, "scheduler.params")]:
        with pytest.raises(ConfigError, match=re.escape(key)):
            parse_config({"train_batch_size": 4, **bad})
    with pytest.raises(ConfigError, match=r"fp16.enabled: float16 is a GPU format.*use \"bf16\""):
        parse_config({"train_batch_size": 4, "fp16": {"enabled": True}})
    c = parse_config(deepspeed.CONFIGS / "ds_config_stage3_offload.json", dp=2)
    assert c.zero_stage == 3 and c.offload_optimizer is None and c.offload_param is None  # CPU: already there
    assert "zero_optimization.stage3_prefetch_bucket_size" in c.notes and "zero_optimization.overlap_comm" in c.notes
    gpu = parse_config(deepspeed.CONFIGS / "ds_config_stage3_offload.json", dp=2, device_type="cuda")
    assert (gpu.offload_optimizer, gpu.offload_param) == ("cpu", "cpu")
    c = parse_config({"train_batch_size": 4, "tensorboard": {"enabled": True, "output_path": "logs", "job_name": "a"},
                      "csv_monitor": {"enabled": False}, "bf16": {"enabled": True}, "wall_clock_breakdown": True})
    assert c.monitor == {"tensorboard": {"enabled": True, "output_path": "logs", "job_name": "a"},
                         "csv_monitor": {"enabled": False}} and c.bf16 and c.wall_clock_breakdown
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_config(tmp_path / "bad.json")


def test_the_optimizer_block_is_read_as_deepspeed_reads_it():
    from infinitrain.deepspeed import _config_optimizer
    assert _config_optimizer({"type": "Adam", "params": {"lr": 1e-3}}) == (AdamW, {"lr": 1e-3, "weight_decay": 0.0})
    assert _config_optimizer({"type": "Adam", "params": {"adam_w_mode": False}})[0] is Adam
    assert _config_optimizer({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}) == (SGD, {"lr": 0.1,
                                                                                                 "momentum": 0.9})
    with pytest.raises(ConfigError, match="optimizer.params.lr must be a number"):
        _config_optimizer({"type": "AdamW", "params": {"lr": "1e-3"}})
    with pytest.raises(ConfigError, match="optimizer.params.momentum"):
        _config_optimizer({"type": "AdamW", "params": {"momentum": 0.9}})


# ---- the schedules, by their formulas ---------------------------------------------------------------
def _lrs(schedule, optimizer, n):
    out = [optimizer.param_groups[0]["lr"]]
    for _ in range(n):
        schedule.step()
        out.append(optimizer.param_groups[0]["lr"])
    return out


def _opt(lr=0.5):
    return AdamW([it.zeros(2, requires_grad=True)], lr=lr)


def test_the_warmup_schedules_follow_deepspeeds_formulas():
    o = _opt()
    got = _lrs(WarmupLR(o, 0.01, 0.1, 10), o, 14)  # log warm-up; before the first step(), iteration 0's
    want = [0.01] + [0.01 + 0.09 * (math.log(i + 1) / math.log(10) if i < 10 else 1.0) for i in range(14)]
    np.testing.assert_allclose(got, want, rtol=1e-15)
    o = _opt()
    got = _lrs(WarmupDecayLR(o, 20, 0.0, 0.1, 5, warmup_type="linear"), o, 24)
    want = [0.0] + [0.1 * (i / 5 if i < 5 else max(0.0, (20 - i) / 15)) for i in range(24)]
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-18)
    o = _opt(0.2)
    got = _lrs(WarmupCosineLR(o, 30, warmup_min_ratio=0.1, warmup_num_steps=4, cos_min_ratio=0.01), o, 33)

    def ratio(i):
        if i < 4:
            return 0.1 + 0.9 * math.log(i + 1) / math.log(4)
        return max(0.0, 0.01 + 0.99 * (1 + math.cos(math.pi * (i - 3) / 26)) / 2)
    np.testing.assert_allclose(got, [0.2 * ratio(0)] + [0.2 * ratio(i) for i in range(33)], rtol=1e-14)


def test_one_cycle_follows_deepspeeds_formula_for_lr_and_momentum():
    o = _opt()
    s = OneCycle(o, 0.01, 0.1, decay_lr_rate=0.5, cycle_first_step_size=4, cycle_second_step_size=6,
                 decay_step_size=2, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.1)
    assert o.param_groups[0]["lr"] == 0.01 and o.param_groups[0]["betas"] == (0.8, 0.99)  # DeepSpeed's start
    for i in range(16):
        s.step()
        x = (i + 1) / 10 - math.floor(1 + (i + 1) / 10) + 1
        scale = x / 0.4 if x <= 0.4 else (x - 1) / (0.4 - 1)
        if i < 10:
            lr, mom = 0.01 + 0.09 * scale, 0.9 - 0.1 * scale
        else:
            lr, mom = 0.01 / (1 + 0.5 * (i - 9) / 2), 0.9 * (1 + 0.1 * (i - 9) / 2)
        assert o.param_groups[0]["lr"] == pytest.approx(lr, rel=1e-14), i
        assert o.param_groups[0]["betas"] == (pytest.approx(mom, rel=1e-14), 0.99), i
    state = s.state_dict()
    s2 = OneCycle(_opt(), 0.01, 0.1, cycle_first_step_size=4, cycle_second_step_size=6)
    s2.load_state_dict(state)
    assert s2.last_batch_iteration == 15


# ---- the engine ------------------------------------------------------------------------------------
def _engine(cfg, seed=3, **kw):
    model = GPT2(CFG, seed=seed)
    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg, mpu=ONE, **kw)


def _loop(engine, steps):
    losses = []
    for s in steps:
        for x, y in batches(s):
            _, loss = engine(x, y, return_logits=False)
            engine.backward(loss)
            assert engine.is_gradient_accumulation_boundary() == (engine.micro_steps % 2 == 1)
            engine.step()
            losses.append(loss.item())
    return losses


def test_the_engine_loop_is_trainsteps_step_bit_for_bit():
    engine, optimizer, loader, sched = _engine(config())
    assert optimizer is engine.optimizer and loader is None and sched is None
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()) \
        == (4, 2, 2)
    ref = GPT2(CFG, seed=3)
    trainer = TrainStep(ref, ONE, [{"params": list(ref.parameters())}], AdamW, lr=1e-2, betas=(0.9, 0.95),
                        weight_decay=0.1)
    for s in range(3):
        got = _loop(engine, [s])
        loss, norm = trainer.step(batches(s), grad_clip=0.5)
        assert sum(got) / 2 == pytest.approx(loss, rel=1e-12) and engine.get_global_grad_norm() == norm
        assert engine.was_step_applied()
    assert engine.global_steps == 3 and engine.global_samples == 12 and engine.micro_steps == 6
    for p, q in zip(engine.module.parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())


def test_the_configs_tensorboard_and_csv_blocks_log_each_step_as_deepspeed_names_them(tmp_path):
    pytest.importorskip("tensorboardX")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    engine, *_ = _engine(config(tensorboard={"enabled": True, "output_path": str(tmp_path), "job_name": "tb"},
                                csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "csv"}))
    losses = _loop(engine, [0, 1])
    engine.monitor.close()
    acc = accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={accumulator.SCALARS: 0})
    acc.Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("Train/Samples/train_loss")]
    assert logged == [(4, pytest.approx(sum(losses[:2]) / 2)), (8, pytest.approx(sum(losses[2:]) / 2))]
    assert [e.value for e in acc.Scalars("Train/Samples/lr")] == [pytest.approx(1e-2)] * 2
    rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,name,value" and rows[1].startswith("4,Train/Samples/train_loss,")


def test_bf16_is_the_flags_autocast_and_activation_checkpointing_recomputes(capsys):
    from infinitrain.amp import autocast
    cfg = config(bf16={"enabled": True}, activation_checkpointing={"partition_activations": True},
                 flops_profiler={"enabled": True, "profile_step": 1})
    engine, _, _, _ = _engine(cfg)
    assert engine.module.recompute == "full" and engine.bfloat16_enabled()
    ref = GPT2(CFG, seed=3)
    trainer = TrainStep(ref, ONE, [{"params": list(ref.parameters())}], AdamW, lr=1e-2, betas=(0.9, 0.95),
                        weight_decay=0.1)
    got = _loop(engine, [0])
    loss, _ = trainer.step(batches(0), lambda: autocast("cpu", dtype=it.bfloat16), grad_clip=0.5)
    assert sum(got) / 2 == pytest.approx(loss, rel=1e-12)
    for p, q in zip(engine.module.parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    out = capsys.readouterr().out
    assert "partition_activations" in out and "profile of step 1:" in out, out


def test_a_checkpoint_round_trips_client_state_and_resumes_bit_for_bit(tmp_path):
    cfg = config(scheduler={"type": "WarmupDecayLR", "params": {"total_num_steps": 8, "warmup_max_lr": 1e-2,
                                                                "warmup_num_steps": 3}})
    engine, _, _, sched = _engine(cfg)
    _loop(engine, range(2))
    assert engine.save_checkpoint(tmp_path, client_state={"epoch": 2, "seen": [1, 2]})
    assert (tmp_path / "latest").read_text().strip() == "global_step2"
    after = _loop(engine, range(2, 4))
    want = [p.detach().numpy().copy() for p in engine.module.parameters()]
    other, _, _, sched2 = _engine(cfg, seed=7)  # another start: everything comes from the checkpoint
    path, client = other.load_checkpoint(tmp_path)
    assert path.endswith("global_step2") and client == {"epoch": 2, "seen": [1, 2]}
    assert (other.global_steps, other.micro_steps, sched2.last_batch_iteration) == (2, 4, 1)
    assert _loop(other, range(2, 4)) == after and other.get_lr() == engine.get_lr()
    for p, w in zip(other.module.parameters(), want):
        np.testing.assert_array_equal(p.detach().numpy(), w)
    with pytest.warns(UserWarning, match="holds no 'latest'"):
        assert other.load_checkpoint(tmp_path / "empty") == (None, None)
    with pytest.raises(ValueError, match="checkpoint tag"):
        engine.save_checkpoint(tmp_path, tag="../x")


def test_initialize_takes_a_client_optimizer_and_refuses_what_does_not_fit():
    model = GPT2(CFG, seed=3)
    cfg = {"train_batch_size": 2}
    engine, opt, _, sched = deepspeed.initialize(model=model, optimizer=SGD(model.parameters(), lr=0.1), config=cfg,
                                                 mpu=ONE, lr_scheduler=lambda o: WarmupLR(o, 0.0, 0.1, 5))
    assert isinstance(opt, SGD) and opt.param_groups[0]["lr"] == 0.0 and isinstance(sched, WarmupLR)
    data = [(it.tensor([i, i + 1]), it.tensor([i])) for i in range(5)]
    _, _, loader, _ = deepspeed.initialize(model=model, optimizer=SGD(model.parameters()), config=cfg, mpu=ONE,
                                           training_data=data)
    assert [tuple(x.shape) for x, _ in loader] == [(2, 2), (2, 2), (1, 2)]  # micro-batches of 2
    with pytest.raises(ValueError, match="an optimizer was passed and the config has one too"):
        deepspeed.initialize(model=model, optimizer=SGD(model.parameters()), config=config(), mpu=ONE)
    with pytest.raises(ValueError, match="no optimizer"):
        deepspeed.initialize(model=model, config=cfg, mpu=ONE)
    with pytest.raises(ValueError, match="no DeepSpeed config"):
        deepspeed.initialize(model=model, mpu=ONE)
    args = deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_args(["--deepspeed",
                                                                                  "--deepspeed_config", "x.json"])
    assert args.deepspeed and args.deepspeed_config == "x.json"


def test_the_examples_refuse_a_flag_the_config_also_sets(tmp_path, capsys):
    from infinitrain.examples.ds_flags import COMMON, same, take_deepspeed_config
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config(zero_optimization={"stage": 2}, bf16={"enabled": True})))
    table = {**COMMON, "train_batch_size": ("batch_size", same), "train_micro_batch_size_per_gpu": (None, same),
             "gradient_accumulation_steps": ("grad_accumulation_steps", same),
             "activation_checkpointing": ("recompute", same)}
    args = argparse.Namespace(deepspeed=True, deepspeed_config=str(path))
    take_deepspeed_config(args, [], 1, "cpu", table)
    assert (args.batch_size, args.grad_accumulation_steps, args.grad_clip, args.learning_rate, args.betas,
            args.weight_decay, args.zero_stage, args.dtype, args.eps, args.offload_optimizer, args.recompute) == \
        (4, 2, 0.5, 1e-2, (0.9, 0.95), 0.1, 2, "bfloat16", 1e-8, "none", False)  # eps: DeepSpeed's default
    with pytest.raises(SystemExit):
        take_deepspeed_config(args, ["--zero_stage", "1"], 1, "cpu", table)
    assert "--zero_stage and --deepspeed_config's zero_optimization.stage both set zero_stage" in \
        capsys.readouterr().err
    del table["bf16.enabled"]
    with pytest.raises(SystemExit):
        take_deepspeed_config(args, [], 1, "cpu", table)
    assert "sets bf16.enabled, which this example has no flag for" in capsys.readouterr().err


# ---- on two ranks -----------------------------------------------------------------------------------
@pytest.mark.mpi
def test_the_loop_under_the_three_configs_equals_trainstep_on_two_ranks(tmp_path):
    out = mpirun(2, [MPI_SCRIPTS / "deepspeed_loop.py", tmp_path])
    assert len(re.findall(r"^ok ds_config_stage", out, re.M)) == 4, out


@pytest.mark.mpi
@pytest.mark.slow
def test_the_encoder_decoder_under_a_config_trains_as_its_flags(tmp_path):
    pytest.importorskip("sacrebleu")
    try:
        from infinitrain.data.prepare import translation_file
        translation_file()
    except RuntimeError as e:
        pytest.skip(f"the translation corpus could not be prepared: {e}")
    cfg = json.loads((deepspeed.CONFIGS / "ds_config_stage2.json").read_text())
    del cfg["scheduler"]  # the flags' schedule is the paper's
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    common = ["--model", "tiny", "--num_iteration", "4", "--dropout", "0", "--warmup_iters", "2", "--translate", "1",
              "--beam", "1"]
    runs = [example(2, "transformer", [*common, *flags], timeout=600) for flags in (
        ["--deepspeed", "--deepspeed_config", tmp_path / "ds.json"],
        ["--batch_size", "16", "--grad_accumulation_steps", "2", "--grad_clip", "1", "--learning_rate", "1e-3",
         "--weight_decay", "0.01", "--zero_stage", "2"])]
    got, want = ([float(x) for x in re.findall(r"train loss ([\d.]+)", out)] for out in runs)
    assert len(got) == 4 and got == want, (got, want)
