"""Trains a tiny GPT-2 or LLaMA-3 for a few AdamW steps under DP x TP (± SP) on a fixed global
batch and prints one line per step ("loss <step> <value>") from rank 0; with --tp 1 on one
process it is the reference. At the end every parameter replicated across the TP group must be
bit-identical on all its ranks, and (with --save) the model and optimizer are checkpointed.

    mpiexec -n 4 python tp_train.py --model gpt2 --tp 2 --sp --dtype bfloat16
"""
import argparse
import hashlib

import numpy as np

import infinitrain as it
from infinitrain.amp import autocast
from infinitrain.checkpoint import load_checkpoint, save_checkpoint
from infinitrain.models import GPT2Config, LLaMA3Config
from infinitrain.models.gpt2 import GPT2
from infinitrain.models.llama3 import LLaMA3
from infinitrain.nn import parallel
from infinitrain.nn.parallel.tensor_parallel import TensorParallel, allreduce_sequence_parallel_grads
from infinitrain.nn.utils import clip_grad_norm_
from infinitrain.optim import AdamW

p = argparse.ArgumentParser()
p.add_argument("--model", choices=["gpt2", "llama3"], default="gpt2")
p.add_argument("--tp", type=int, default=1)
p.add_argument("--sp", action="store_true")
p.add_argument("--dtype", default="float32")
p.add_argument("--steps", type=int, default=10)
p.add_argument("--first", type=int, default=1, help="step to start at (after --load)")
p.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
p.add_argument("--seq", type=int, default=16)
p.add_argument("--lr", type=float, default=1e-2)
p.add_argument("--save", default=None)
p.add_argument("--load", default=None)
p.add_argument("--llmc", default=None, help="start from this llm.c checkpoint (each rank its slice)")
args = p.parse_args()

env = parallel.init(tensor_parallel=args.tp)
tp = TensorParallel(env.tp_group, sequence_parallel=args.sp) if args.tp > 1 else None
dp, dp_rank = env.layout.dp, env.dp_rank
if args.model == "gpt2":
    cfg = GPT2Config(block_size=64, vocab_size=50257, n_layer=2, n_head=4, n_embd=32)
    model = GPT2.from_llmc(args.llmc, tp=tp) if args.llmc else GPT2(cfg, seed=5, tp=tp)
else:  # grouped-query attention: 8 query heads, 4 KV heads
    cfg = LLaMA3Config(block_size=64, vocab_size=50257, n_layer=2, n_head=8, n_kv_head=4, n_embd=32,
                       ffn_dim_multiplier=None, multiple_of=32, rope_theta=10000.0)
    model = LLaMA3.from_llmc(args.llmc, tp=tp) if args.llmc else LLaMA3(cfg, seed=5, tp=tp)
net = parallel.DistributedDataParallel(model) if dp > 1 else model
decay = [q for q in model.parameters() if q.ndim >= 2]
no_decay = [q for q in model.parameters() if q.ndim < 2]
opt = AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=args.lr, betas=(0.9, 0.95))
if args.load:
    load_checkpoint(args.load, model, opt)

B, T = args.batch // dp, args.seq
for step in range(args.first, args.steps + 1):
    # two batches in turn from a few hundred ids: the loss falls fast, so steps differ a lot
    data = np.random.default_rng(step % 2).integers(0, 300, (args.batch, T + 1))
    mine = data[dp_rank * B:(dp_rank + 1) * B]
    x, y = it.from_numpy(mine[:, :-1].copy()), it.from_numpy(mine[:, 1:].copy())
    with autocast(args.dtype, enabled=args.dtype != "float32"):
        _, loss = net(x, y, return_logits=False)
    loss.backward()
    allreduce_sequence_parallel_grads(model)
    clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    value = it.tensor([loss.item()])
    env.dp_group.all_reduce(value, parallel.ReduceOp.AVG)
    if env.rank == 0:
        print(f"loss {step} {value.item():.9g}", flush=True)

# replicated parameters (not TP shards) must be bit-identical across the TP group
for name, q in model.named_parameters():
    if q.tp_shard is None:
        digest = np.frombuffer(hashlib.sha256(q.detach().float().numpy().tobytes()).digest()[:8], np.int64)
        mine = it.from_numpy(digest.copy())
        hi, lo = mine.clone(), mine.clone()
        env.tp_group.all_reduce(hi, parallel.ReduceOp.MAX)
        env.tp_group.all_reduce(lo, parallel.ReduceOp.MIN)
        assert hi.item() == lo.item(), f"{name} differs across the TP group after {args.steps} steps"
# sampling runs the model on sequences of every length (padded to a multiple of TP under SP)
with it.no_grad():
    tokens = model.generate(it.tensor([[1, 2, 3]]), 5, top_k=20, seed=1).numpy()[0].tolist()
if env.rank == 0:
    print("sample", tokens, flush=True)
if args.save:
    save_checkpoint(args.save, args.steps, model, opt, write=env.rank == 0)
print(f"rank {env.rank} OK", flush=True)
