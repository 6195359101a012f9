"""The flat parameter/gradient buffer that data parallelism works on (Megatron's and
InfiniTrain's param_and_grad_buffer, llm.c's single buffer): DDP, the pipeline's per-chunk
reducers and ZeRO 1/2/3 all pack their parameters here, and ZeRO shards the buckets DDP would
reduce whole.

- Order: the trainable parameters, each once, in reverse registration order (roughly the order
  backward produces their gradients), so a bucket is complete early and its collective starts
  while backward goes on.
- Buckets: one dtype each, at most `bucket_cap_mb` (the first one `first_bucket_mb`, so that
  communication starts soon), padded to a multiple of `pad_to` (ZeRO: the DP size, so that
  every rank owns an equal piece of every bucket).
- Views: a parameter's gradient (and, for ZeRO, the parameter itself) is a view into its
  bucket's flat tensor, so backward accumulates straight into what is communicated.
- Replicas start equal: `broadcast_replicas` copies rank 0's tensors to the group.
"""
from __future__ import annotations

from ...autograd import no_grad
from ...creation import zeros


def trainable(params) -> list:
    """The parameters that require grad, each once, in the order given."""
    seen, out = set(), []
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def pack(params, bucket_cap_mb: float, first_bucket_mb: float | None = None) -> list:
    """params (registration order) -> buckets as lists of parameters: reverse order, one dtype
    per bucket, experts' parameters (`expert_parallel`, reduced over their own group) apart
    from the rest, a new bucket when the next parameter would pass the cap (the very first
    bucket's cap is first_bucket_mb when given)."""
    packs, open_, size = [], {}, {}
    for p in reversed(params):
        key = (p.dtype.name, bool(getattr(p, "expert_parallel", False)))
        b = open_.get(key)
        first = first_bucket_mb is not None and b is not None and b is packs[0]
        cap = (first_bucket_mb if first else bucket_cap_mb) * 2**20
        if b is None or size[key] + p.nbytes > cap:
            b = open_[key] = []
            size[key] = 0
            packs.append(b)
        b.append(p)
        size[key] += p.nbytes
    return packs


def mark_ready(ready: set, p) -> None:
    """Counts p's gradient as final for this backward pass; a second one for the same pass
    (two separate accumulations: a nested backward, such as a hand-made recomputation) would
    arrive after its bucket may already have been reduced, so it is an error, not silent
    garbage."""
    if id(p) in ready:
        raise RuntimeError(f"a parameter of shape {tuple(p.shape)} got its gradient twice in one backward "
                           f"pass (two separate accumulations, e.g. a nested backward inside a custom "
                           f"Function): its bucket may already be reduced. Let the outer pass accumulate it "
                           f"once (return it from the Function, as infinitrain.autograd.checkpoint does)")
    ready.add(id(p))


class Bucket:
    """Parameters packed end to end: parameter j is elements [offsets[j], offsets[j] + numel)
    of the flat tensors, which hold `padded` elements (a multiple of pad_to), `piece` per rank."""

    def __init__(self, params, pad_to: int = 1):
        self.params = params
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.numel = n
        self.padded = -(-max(n, 1) // pad_to) * pad_to
        self.piece = self.padded // pad_to
        self.dtype, self.device = params[0].dtype, params[0].device
        self.flat_param = None  # the parameters' memory, when the buffer holds them (ZeRO)
        self.flat_grad = None   # the full-size gradient, while it exists

    def new_flat(self):
        return zeros(self.padded, dtype=self.dtype, device=self.device)

    def view(self, flat, j: int):
        """Parameter j's part of a flat tensor of this bucket, in the parameter's shape."""
        p = self.params[j]
        return flat[self.offsets[j]:self.offsets[j] + p.numel()].view(*p.shape)

    def grad_view(self, j: int):
        return self.view(self.flat_grad, j)

    def shard(self, flat, rank: int):
        """Rank's piece of a flat tensor of this bucket."""
        return flat[rank * self.piece:(rank + 1) * self.piece]

    @no_grad()
    def hold_params(self) -> None:
        """The parameters move into the bucket: each becomes a view of flat_param (one
        collective then refreshes them all)."""
        self.flat_param = self.new_flat()
        for j, p in enumerate(self.params):
            view = self.view(self.flat_param, j)
            view.copy_(p)
            p._assign(view)


class ParamAndGradBuffer:
    """The buckets of a set of parameters and where each parameter sits in them."""

    def __init__(self, packs, pad_to=1):
        """pad_to: an int, or a function of a pack giving its bucket's (ZeRO: the size of the
        group that shards it)."""
        self.buckets = [Bucket(ps, pad_to(ps) if callable(pad_to) else pad_to) for ps in packs if ps]
        self.where = {id(p): (bi, j) for bi, b in enumerate(self.buckets) for j, p in enumerate(b.params)}

    def __iter__(self):
        return iter(self.buckets)

    def locate(self, p) -> tuple:
        """(bucket index, index in the bucket) of parameter p."""
        return self.where[id(p)]

    def grad_view(self, p):
        bi, j = self.where[id(p)]
        return self.buckets[bi].grad_view(j)

    @no_grad()
    def hold_grads(self) -> None:
        """Every bucket gets a flat gradient and every .grad becomes its view in it (what it
        held is copied in: a gradient assigned by the user, or one accumulated elsewhere)."""
        for b in self.buckets:
            if b.flat_grad is None:
                b.flat_grad = b.new_flat()
            for j, p in enumerate(b.params):
                g = p.grad
                if g is None or g._storage is not b.flat_grad._storage:
                    view = b.grad_view(j)
                    view.copy_(g) if g is not None else view.zero_()
                    p.grad = view


@no_grad()
def broadcast_replicas(tensors, group, src: int = 0) -> None:
    """Every rank of group gets src's values of tensors (a strided tensor through a contiguous
    copy): the replicas of a data-parallel group start equal."""
    for t in tensors:
        if t.is_contiguous():
            group.broadcast(t, src)
        else:
            tmp = t.contiguous()
            group.broadcast(tmp, src)
            t.copy_(tmp)
