"""Trains a tiny GPT-2 or LLaMA-3 on this rank's GPU with TrainStep twice, without offload and
with the AdamW state in host memory (offload_optimizer="cpu"), whose gradients stream to the
host during the step's last backward; two micro-batches per step, gradient clipping on every
other step (its factor must reach the streamed copies). Every step's loss and norm and every
parameter must be bit-identical, the profile must show the copies queued inside backward, and
the same bytes must have streamed every step. Prints "OK <bytes streamed per step> <bytes of
this rank's gradients>".

    mpiexec -n 2 python offload_streaming.py --model llama3 --zero 2
    mpiexec -n 4 python offload_streaming.py --pp 2     # DP 2 x PP 2: each chunk's reducer streams
"""
import argparse

import numpy as np

import infinitrain as it
from infinitrain.models import GPT2Config, LLaMA3Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.models.llama3 import LLaMA3
from infinitrain.nn import parallel
from infinitrain.nn.parallel import ParallelPlan
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.optim import AdamW
from infinitrain.profiler import profile

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["gpt2", "llama3"], default="gpt2")
p.add_argument("--zero", type=int, default=0)
p.add_argument("--tp", type=int, default=1, help="tensor parallel with sequence parallelism")
p.add_argument("--pp", type=int, default=1, help="pipeline stages (1F1B)")
p.add_argument("--no_clip", action="store_true",
               help="never clip: on one DP rank the host then updates each parameter during backward")
args = p.parse_args()
env = parallel.init(tensor_parallel=args.tp, pipeline_parallel=args.pp, device="cuda")


def build():
    plan = ParallelPlan(env, sequence_parallel=True)
    tp, pp = plan.tensor_parallel(), plan.pipeline_stage()
    if args.model == "gpt2":
        model = GPT2(GPT2Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_embd=32), seed=3, tp=tp, pp=pp)
    else:
        model = LLaMA3(LLaMA3Config(block_size=32, vocab_size=300, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                                    ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0), seed=3, tp=tp, pp=pp)
    return model.to(env.device)


runs = {}
for offload in ("none", "cpu"):
    model = build()
    plan = ParallelPlan(env, sequence_parallel=True, zero_stage=args.zero, offload_optimizer=offload)
    trainer = TrainStep(model, plan, decay_groups(model, 0.1), AdamW, bucket_cap_mb=0.01, lr=1e-2)
    history, streamed = [], set()
    for step in range(4):
        micro = []
        for m in range(2):
            data = np.random.default_rng(10 * step + m + 100 * env.dp_rank).integers(0, 300, (2, 17))
            micro.append(tuple(it.from_numpy(data[:, s].copy()).to(env.device) for s in (slice(0, -1), slice(1, None))))
        with profile() as prof:
            history.append(trainer.step(micro, grad_clip=0.0 if args.no_clip else 0.3 if step % 2 else 100.0))
        if offload == "cpu":
            streamed.add(trainer.offloaded.streamed_bytes if trainer.offloaded is not None else 0)
            events = prof.events
            # the step's last backward (a pipeline's schedule interleaves them all)
            backward = [e for e in events if e[0] == ("pipeline forward_backward" if args.pp > 1 else "backward")][-1]
            copies = [e for e in events if e[0] == "offload gradients"]
            assert (len(copies) > 0) == (max(streamed) > 0), (len(copies), streamed)
            assert all(backward[3] <= e[3] <= backward[4] for e in copies), "a copy queued outside backward"
            if args.no_clip and env.world.size == 1 and step > 0:  # (the first step reads every weight back)
                updates = [e for e in events if e[0] == "offload update"]
                assert updates and min(e[3] for e in updates) <= backward[4], "no update began during backward"
    with trainer.gathered_parameters():
        runs[offload] = history, [q.detach().cpu().numpy().copy() for q in model.parameters()]
assert runs["cpu"][0] == runs["none"][0], runs
assert all(np.array_equal(a, b) for a, b in zip(runs["cpu"][1], runs["none"][1]))
assert len(streamed) == 1, streamed  # the same bytes every step
print("OK", streamed.pop(), sum(q.nbytes for q in model.parameters()), flush=True)
