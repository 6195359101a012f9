"""Is the encoder-decoder's drift between layouts round-off, amplified by training, or a real
difference? Prints, side by side per step, each run's loss minus the one-process loss of the
example (dropout off, the same flags), for one AdamW eps after another:

    dp2, tp2     the example on 2 ranks (DP 2, TP 2), through mpiexec
    halves       one process, each batch's loss summed over the halves DP 2 gives its ranks
                 (two micro-batches, each padded to its own longest): only the summation order
                 (and padding) differs from one process
    quarters     the same over the quarters DP 4 gives its ranks
    ulp1, ulp2   one process, every initial weight moved by one ulp, up or down at random
    torch32      PyTorch float32 from the same initial weights and batches
    torch64      PyTorch float64, the reference: the same model, batches and schedule
    it-t64       one process minus torch64 (how far fp32 training is from exact arithmetic)

then the parameters whose values two one-process runs (one, halves) disagree on most after the
last step, with their AdamW second moments (an update m / (sqrt(v) + eps) of a gradient that
is round-off, as the attention's key bias, whose exact gradient is zero, is of size lr either
way). Not a test: it prints figures (tiny: ~3 minutes per eps on 2 loaded cores, small: ~8).

    python benchmarks/seq2seq_drift.py                       # the tests' flags, eps 1e-9 and 1e-6
    python benchmarks/seq2seq_drift.py --model small         # the figures of docs/training.md
    python benchmarks/seq2seq_drift.py --eps 1e-9 1e-8 1e-6 --no_torch
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import numpy as np

import infinitrain as it
from infinitrain.data import LengthGroupedBatchSampler
from infinitrain.data.prepare import translation_file
from infinitrain.data.translation import PAD, load_translation, pad_collate
from infinitrain.examples.flags import plan_of
from infinitrain.examples.transformer import inverse_sqrt
from infinitrain.models.seq2seq import SEQ2SEQ_PRESETS, Seq2SeqConfig, Seq2SeqTransformer, sinusoidal_positions
from infinitrain.nn import parallel
from infinitrain.nn.parallel.train_step import TrainStep, decay_groups
from infinitrain.optim import AdamW
from infinitrain.optim.lr_scheduler import LambdaLR
from mpi_launch import start


def flags(args, eps: float) -> list:
    return ["--model", args.model, "--num_iteration", str(args.steps), "--batch_size", str(args.batch_size),
            "--dropout", "0", "--learning_rate", str(args.lr), "--warmup_iters", str(args.warmup),
            "--max_len", str(args.max_len), "--adam_eps", str(eps), "--translate", "1", "--beam", "1"]


def example(ranks: int, extra: list, args, eps: float) -> list:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [*start(ranks), sys.executable, "-m", "infinitrain.examples.transformer", *flags(args, eps), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return [float(x) for x in re.findall(r"train loss ([\d.]+)", out.stdout)]


def batches(train, args):
    """The example's global batches in its order (epoch 1 first), as lists of pairs."""
    sampler = LengthGroupedBatchSampler(train.lengths(), args.batch_size, drop_last=True, seed=args.seed)
    epoch = 1
    while True:
        sampler.set_epoch(epoch)
        for ids in sampler:
            yield [train[i] for i in ids]
        epoch += 1


def config(vocab, args) -> Seq2SeqConfig:
    return Seq2SeqConfig(vocab_size=len(vocab), dropout=0.0, max_len=args.max_len, **SEQ2SEQ_PRESETS[args.model])


def ours(corpus, args, eps: float, variant: str):
    """One process: the example's model, optimizer and schedule; returns (losses, model, optimizer)."""
    vocab, train = corpus
    it.manual_seed(args.seed)
    model = Seq2SeqTransformer(config(vocab, args))
    if variant.startswith("ulp"):  # ulpN: each initial weight one ulp up or down, the signs drawn from seed N
        rng = np.random.default_rng(int(variant[3:]))
        with it.no_grad():
            for p in model.parameters():
                w = p.detach().numpy()
                p.copy_(it.from_numpy(np.nextafter(w, np.where(rng.random(w.shape) < 0.5, -np.inf, np.inf)
                                                   .astype(np.float32))))
    plan = plan_of(parallel.init(1))
    trainer = TrainStep(model, plan, decay_groups(model, 0.0), AdamW, lr=args.lr, betas=(0.9, 0.98), eps=eps)
    schedule = LambdaLR(trainer.optimizer, inverse_sqrt(max(args.warmup, 1)))
    losses = []
    for _, items in zip(range(args.steps), batches(train, args)):
        k = {"halves": 2, "quarters": 4}.get(variant, 1)  # the shares of DP k's ranks, as micro-batches
        parts = [items[r::k] for r in range(k)]
        collated = [[it.from_numpy(a) for a in pad_collate(part, args.max_len)] for part in parts]
        tokens = sum(float((c[2].numpy() != PAD).sum()) for c in collated)
        # as the example: each part's loss weighted by its share of the tokens times the parts
        micro = [((s, ti, float((to.numpy() != PAD).sum()) * len(parts) / tokens), to) for s, ti, to in collated]
        loss, _ = trainer.step(micro, None, args.grad_clip)
        schedule.step()
        losses.append(loss)
    return losses, model, trainer.optimizer


def theirs(corpus, args, eps: float, dtype: str) -> list:
    """PyTorch at dtype from our model's initial weights, on the same batches and schedule."""
    import torch
    vocab, train = corpus
    c = config(vocab, args)
    it.manual_seed(args.seed)
    start_weights = {k: v.numpy() for k, v in Seq2SeqTransformer(c).state_dict().items()}
    torch.manual_seed(0)
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(c.vocab_size, c.d_model, padding_idx=PAD)
            self.transformer = nn.Transformer(c.d_model, c.nhead, c.num_encoder_layers, c.num_decoder_layers,
                                              c.dim_feedforward, 0.0, batch_first=True, norm_first=c.norm_first)
            self.generator = nn.Linear(c.d_model, c.vocab_size, bias=False)
            self.generator.weight = self.embedding.weight

        def forward(self, src, tgt_in, tgt_out):
            pe = torch.from_numpy(sinusoidal_positions(c.max_len, c.d_model)).to(d)
            emb = lambda ids: self.embedding(ids) * c.d_model ** 0.5 + pe[:ids.shape[1]]  # noqa: E731
            T = tgt_in.shape[1]
            h = self.transformer(emb(src), emb(tgt_in), tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1),
                                 src_key_padding_mask=src == PAD, tgt_key_padding_mask=tgt_in == PAD,
                                 memory_key_padding_mask=src == PAD)
            logits = self.generator(h)
            return nn.functional.cross_entropy(logits.reshape(-1, c.vocab_size), tgt_out.reshape(-1),
                                               ignore_index=PAD, label_smoothing=c.label_smoothing)

    d = torch.float64 if dtype == "float64" else torch.float32
    model = Model().to(d)
    missing = model.load_state_dict({k: torch.from_numpy(v).to(d) for k, v in start_weights.items()}, strict=False)
    assert not missing.unexpected_keys and not missing.missing_keys, missing
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.0},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.98), eps=eps)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt(max(args.warmup, 1)))
    losses = []
    for _, items in zip(range(args.steps), batches(train, args)):
        src, tgt_in, tgt_out = (torch.from_numpy(a) for a in pad_collate(items, args.max_len))
        loss = model(src, tgt_in, tgt_out)
        opt.zero_grad()
        loss.backward()
        if args.grad_clip > 0:
            nn.utils.clip_grad_norm_(params, args.grad_clip)
        opt.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def moments_table(one, halves, top: int = 8) -> str:
    """The parameters two one-process runs disagree on most, and their second moments."""
    (_, m1, o1), (_, m2, _) = one, halves
    rows = []
    p2 = dict(m2.named_parameters())
    for name, p in m1.named_parameters():
        a, b = p.detach().numpy(), p2[name].detach().numpy()
        v = o1.state[p]["exp_avg_sq"].numpy() if p in o1.state else np.zeros_like(a)
        # the attention's packed query/key/value bias in its thirds: the key's has a zero gradient
        packed = name.endswith("in_proj_bias")
        parts = zip("qkv", np.split(np.stack([a, b, v]), 3, axis=1)) if packed else [("", (a, b, v))]
        for third, (x, y, w) in parts:
            rows.append((float(np.abs(x - y).max()), name + (f"[{third}]" if third else ""),
                         float(np.sqrt(w).min()), float(np.median(np.sqrt(w)))))
    rows.sort(reverse=True)
    lines = [f"  {'parameter':<52} {'max |one-halves|':>16} {'min sqrt(v)':>12} {'median sqrt(v)':>15}"]
    lines += [f"  {n:<52} {d:16.2e} {lo:12.2e} {med:15.2e}" for d, n, lo, med in rows[:top]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=sorted(SEQ2SEQ_PRESETS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch_size", type=int, default=16)  # the layout tests' flags
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--max_len", type=int, default=64)
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eps", type=float, nargs="+", default=[1e-9, 1e-6])
    p.add_argument("--no_torch", action="store_true", help="skip the PyTorch float32/float64 references")
    p.add_argument("--no_ranks", action="store_true", help="skip the 2-rank runs of the example")
    args = p.parse_args(argv)
    vocab, train, _ = load_translation(translation_file())
    corpus = (vocab, train)
    for eps in args.eps:
        runs = {}
        one = ours(corpus, args, eps, "one")
        example_one = example(1, [], args, eps) if not args.no_ranks else None
        if example_one is not None:  # the in-process run is the example's one-process run
            assert np.allclose(example_one, one[0], rtol=0, atol=1.5e-6), (example_one, one[0])
            runs["dp2"] = example(2, [], args, eps)
            runs["tp2"] = example(2, ["--tensor_parallel", "2"], args, eps)
        halves = ours(corpus, args, eps, "halves")
        runs["halves"] = halves[0]
        runs["quarters"] = ours(corpus, args, eps, "quarters")[0]
        for seed in (1, 2):
            runs[f"ulp{seed}"] = ours(corpus, args, eps, f"ulp{seed}")[0]
        if not args.no_torch:
            runs["torch32"] = theirs(corpus, args, eps, "float32")
            runs["torch64"] = theirs(corpus, args, eps, "float64")
        print(f"\n--model {args.model}, batch {args.batch_size}, lr {args.lr} (warm-up {args.warmup}), dropout 0, "
              f"AdamW eps {eps:g}: each run's loss minus one process's")
        header = " ".join(f"{k:>9}" for k in runs) + ("   it-t64" if "torch64" in runs else "")
        print(f"{'step':>4} {'one':>10} {header}")
        for s in range(args.steps):
            row = " ".join(f"{runs[k][s] - one[0][s]:9.1e}" for k in runs)
            if "torch64" in runs:
                row += f" {one[0][s] - runs['torch64'][s]:9.1e}"
            print(f"{s + 1:4d} {one[0][s]:10.6f} {row}")
        print(f"after step {args.steps}, eps {eps:g}:\n" + moments_table(one, halves))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
