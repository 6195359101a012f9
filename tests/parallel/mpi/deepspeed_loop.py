"""A DeepSpeed-style program (`loss = engine(x, y)`, `engine.backward(loss)`, `engine.step()`)
on every rank of the job, under each of infinitrain.deepspeed's example configs (ZeRO 1, 2 and
3 with offload: on a CPU the offload is where the state is already) and stage 0 (DDP), against TrainStep given the
same settings by hand, in the same processes: the losses and, at the end, every parameter must
be bit-equal (the engine runs TrainStep's code). Then save_checkpoint after 2 steps with a
client_state, 2 more steps, load_checkpoint and the same 2 steps again: bit-equal too.
Prints "ok <config> <losses>" from rank 0.

    mpiexec -n 2 python deepspeed_loop.py CHECKPOINT_DIR
"""
import json
import sys

import numpy as np

import infinitrain as it
from infinitrain import deepspeed
from infinitrain.deepspeed.lr_schedules import SCHEDULES
from infinitrain.models import GPT2Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.nn import parallel
from infinitrain.nn.parallel.train_step import TrainStep
from infinitrain.optim import AdamW

CFG = GPT2Config(block_size=16, vocab_size=300, n_layer=2, n_head=2, n_embd=16)
env = parallel.init()
STEPS = 4


def micro_batches(step: int, cfg) -> list:
    """This rank's micro-batches of one step: the global batch cut by DP rank, then by micro-batch."""
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    tokens = np.random.default_rng(step).integers(0, 300, (env.world_size, gas, micro, 9))[env.rank]
    return [(it.tensor(t[:, :-1].copy()), it.tensor(t[:, 1:].copy())) for t in tokens]


def engine_steps(engine, cfg, steps) -> list:
    losses = []
    for s in steps:
        total = 0.0
        for x, y in micro_batches(s, cfg):
            _, loss = engine(x, y, return_logits=False)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        losses.append(total / cfg["gradient_accumulation_steps"])
    return losses


def params(model) -> list:
    return [p.detach().numpy().copy() for p in model.parameters()]


for name in ("ds_config_stage0", "ds_config_stage1.json", "ds_config_stage2.json", "ds_config_stage3_offload.json"):
    if name == "ds_config_stage0":  # DDP, its reduction held back (no_sync) on all but the last micro-batch
        cfg = json.loads((deepspeed.CONFIGS / "ds_config_stage1.json").read_text())
        cfg["zero_optimization"] = {"stage": 0}
    else:
        cfg = json.loads((deepspeed.CONFIGS / name).read_text())
    cfg["steps_per_print"] = 100
    cfg["scheduler"]["params"]["warmup_num_steps"] = 3  # (the lr moves within the test's steps)
    model = GPT2(CFG, seed=3)
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                           config=cfg)
    assert engine.gradient_accumulation_steps() == 2 and engine.train_micro_batch_size_per_gpu() == 4
    # the same settings by hand: TrainStep of the plan, AdamW of the config, the config's schedule
    ref = GPT2(CFG, seed=3)
    plan = parallel.ParallelPlan(env, zero_stage=cfg["zero_optimization"]["stage"])
    trainer = TrainStep(ref, plan, [{"params": list(ref.parameters())}], AdamW, **{
        **cfg["optimizer"]["params"], "betas": tuple(cfg["optimizer"]["params"]["betas"])})
    sched = SCHEDULES[cfg["scheduler"]["type"]](trainer.optimizer, **cfg["scheduler"]["params"])
    got = engine_steps(engine, cfg, range(STEPS))
    want = []
    for s in range(STEPS):
        loss, norm = trainer.step(micro_batches(s, cfg), grad_clip=cfg["gradient_clipping"])
        sched.step()
        want.append(loss)
        assert engine.global_steps == STEPS or s < STEPS - 1
    # the engine's losses are this rank's; TrainStep's the mean over DP
    mine = it.tensor(got, dtype=it.float32)
    env.dp_group.all_reduce(mine, parallel.ReduceOp.AVG)
    np.testing.assert_allclose(mine.numpy(), want, rtol=1e-6)
    assert engine.get_global_grad_norm() == norm, (engine.get_global_grad_norm(), norm)
    with engine.trainer.gathered_parameters(), trainer.gathered_parameters():
        for a, b in zip(params(model), params(ref)):
            np.testing.assert_array_equal(a, b)
    assert engine.get_lr() == [g["lr"] for g in trainer.optimizer.param_groups]

    # a checkpoint with client_state, then resuming from it gives the same steps, bit for bit
    root = f"{sys.argv[1]}/{name}"
    engine.save_checkpoint(root, client_state={"epoch": 3, "note": name})
    after = engine_steps(engine, cfg, range(STEPS, STEPS + 2))
    final = params(engine.module) if cfg["zero_optimization"]["stage"] < 3 else None
    path, client = engine.load_checkpoint(root)
    assert client == {"epoch": 3, "note": name} and path.endswith(f"global_step{STEPS}"), (path, client)
    assert engine.global_steps == STEPS and engine.global_samples == STEPS * 16
    again = engine_steps(engine, cfg, range(STEPS, STEPS + 2))
    assert again == after, (again, after)
    if final is not None:
        for a, b in zip(params(engine.module), final):
            np.testing.assert_array_equal(a, b)
    if env.rank == 0:
        print("ok", name, " ".join(f"{x:.6f}" for x in want), flush=True)
