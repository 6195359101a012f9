"""Trains an MLP on the real MNIST digits (prepared on first use, offline) and prints one line
per epoch:

    epoch 1 | train loss 0.2345 | test accuracy 96.12% | (3.4 s)

    python -m infinitrain.examples.mnist [--epochs 5] [--batch_size 128] [--train_subset N]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import infinitrain as it
import infinitrain.nn.functional as F
from infinitrain.utils.data import DataLoader, DistributedSampler, TensorDataset
from infinitrain.data.prepare import load_mnist, mnist_file, on_every_node
from infinitrain.examples.flags import (add_monitor_flags, add_nan_check_flag, check_input_files, nonnegative_float,
                                        nonnegative_int, open_monitor, positive_int, probability, run_example,
                                        stop_if_not_finite)
from infinitrain.models.mlp import MLP
from infinitrain.nn import parallel


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None, help="mnist.npz (default: prepared under $INFINITRAIN_DATA)")
    p.add_argument("--model", default="mlp", choices=["mlp"])
    p.add_argument("--hidden", type=positive_int, nargs="*", default=[512, 256])
    p.add_argument("--epochs", type=positive_int, default=5)
    p.add_argument("--batch_size", type=positive_int, default=128, help="global batch (split over data-parallel ranks)")
    p.add_argument("--learning_rate", type=nonnegative_float, default=1e-3)
    p.add_argument("--weight_decay", type=nonnegative_float, default=0.0)
    p.add_argument("--dropout", type=probability, default=0.1)
    p.add_argument("--train_subset", type=nonnegative_int, default=0,
                   help="train on the first N images (0 = all 50,000)")
    p.add_argument("--seed", type=int, default=42)
    add_nan_check_flag(p)
    add_monitor_flags(p)
    return p.parse_args(argv)


def as_inputs(images: np.ndarray) -> np.ndarray:
    return (images.reshape(len(images), -1).astype(np.float32) / 255.0 - 0.1307) / 0.3081


@it.no_grad()
def accuracy(model, images, labels, batch: int = 1000) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(images), batch):
        logits = model(it.from_numpy(as_inputs(images[i:i + batch])))
        correct += int((logits.argmax(-1).numpy() == labels[i:i + batch]).sum())
    model.train()
    return 100.0 * correct / len(images)


def main(argv=None) -> int:
    args = parse_args(argv)
    env = parallel.init()
    dp, main_rank = env.layout.dp, env.is_main
    if args.data is None:  # prepared once per job (or per node: on_every_node)
        args.data = on_every_node(env, mnist_file)
    check_input_files(env, [("--data", args.data, load_mnist)])
    data = load_mnist(args.data)
    monitor = open_monitor(args, env)
    train_x, train_y = data["train_images"], data["train_labels"]
    if args.train_subset:
        train_x, train_y = train_x[:args.train_subset], train_y[:args.train_subset]
    if args.batch_size % dp:
        sys.exit(f"--batch_size {args.batch_size} must be a multiple of the {dp} data-parallel ranks")
    it.manual_seed(args.seed)
    model = MLP(784, tuple(args.hidden), 10, args.dropout)
    net = parallel.DistributedDataParallel(model) if dp > 1 else model
    opt = it.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    dataset = TensorDataset(as_inputs(train_x), train_y)
    sampler = DistributedSampler(dataset, dp, env.dp_rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size // dp, sampler=sampler)
    if main_rank:
        print(f"MLP {[784, *args.hidden, 10]} | {model.num_parameters():,} parameters | "
              f"{len(train_x):,} training images, {len(data['test_labels']):,} test images | "
              f"{env.layout.describe()}", flush=True)
    step = 0  # optimizer steps so far: the monitor's x axis
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        t0, total, n = time.perf_counter(), 0.0, 0
        it.reset_peak_memory_stats()
        for x, y in loader:
            loss = F.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            batch_loss = loss.item()
            if args.check_for_nan_in_loss_and_grad:  # every rank's loss, so that all stop together
                both = it.tensor([batch_loss])
                env.world.all_reduce(both)
                stop_if_not_finite(args, env, model, epoch, "loss", both.item())
            opt.step()
            step += 1
            total, n = total + batch_loss * len(y), n + len(y)
        sums = it.tensor([total, float(n)])
        env.world.all_reduce(sums)
        if main_rank:
            seconds = time.perf_counter() - t0
            acc = accuracy(model, data["test_images"], data["test_labels"])
            print(f"epoch {epoch} | train loss {sums[0].item() / sums[1].item():.4f} | "
                  f"test accuracy {acc:.2f}% | ({seconds:.1f} s)", flush=True)
            memory = it.memory_stats()
            monitor.log(step, train_loss=sums[0].item() / sums[1].item(), test_accuracy=acc,
                        lr=opt.param_groups[0]["lr"], images_per_s=sums[1].item() / seconds,
                        peak_used_mb=memory["peak_allocated_bytes"] // 2**20,
                        peak_reserved_mb=memory["peak_reserved_bytes"] // 2**20)
    monitor.close()
    return 0


if __name__ == "__main__":
    run_example(main)
