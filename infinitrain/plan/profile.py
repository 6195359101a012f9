"""A machine's profile: the rates the planner's cost model multiplies by, measured here by
`python -m infinitrain.plan calibrate` or written by hand from another machine's datasheet.

The file is JSON (docs/planning.md shows one):

    {"name": "...", "device": "cpu", "cores": 2,                 # the cores the rates were measured on
     "matmul": [[flops, flop_per_s], ...],                        # by the size of one product (2 m k n)
     "attention": [[flops, flop_per_s], ...],                     # by the size of one attention call
     "memory_bandwidth": bytes_per_s,                             # elementwise work (read + write)
     "optimizer": parameters_per_s,                               # AdamW's step, fp32
     "intra_node": {collective: {"alpha": s, "beta": s_per_byte}}, # one ring step's latency, a byte's time
     "inter_node": {...},                                         # the same across nodes (default: intra)
     "overlap": {"dp": 0.0, "tp": 0.0, "cp": 0.0, "zero": 0.0},   # the share of each group's traffic hidden
     # optional, measured by calibrate on a CPU (each absent: the simpler model it replaces)
     "matmul_backward": [[flops, flop_per_s], ...],   # a linear's backward products (default: matmul's)
     "matmul_head": ..., "matmul_backward_head": ...,  # the same at the head's [C, vocab] shape (default:
                                                       # the block's tables; calibrate measures both)
     "loss": logits_per_s,                            # cross-entropy forward + backward over the logits
     "loss_parallel": logits_per_s,                   # the same for TP's vocabulary-parallel cross-entropy
     "threads": {"2": {"matmul": ..., "matmul_backward": ..., "attention": ..., "memory_bandwidth": ...,
                       "optimizer": ..., "loss": ...}},   # one rank's rates with that many threads
     "shared_cores": [[ranks_per_core, throughput]],  # the node's throughput when ranks share cores
     "communication_cpu": share,                      # of a collective's time its rank's core is busy
     "pipeline_wait_cpu": share,                      # of a core a pipeline stage waiting asleep takes
                                                      # from the busy ranks (default: communication_cpu)
     "synchronization": seconds,                      # a blocking call's wait for the slowest rank
     "synchronization_shared": [[ranks_per_core, seconds]]}  # the same where ranks take turns on the cores

The collectives are all_reduce, all_gather, reduce_scatter, all_to_all and send_recv. alpha and
beta are a ring's per-step figures (what a datasheet gives: a link's latency and 1 / its
bandwidth): a collective over n ranks moving `nbytes` (the whole buffer) costs, on a ring,
    all_reduce                            2 (n-1) alpha + 2 (n-1)/n nbytes beta
    all_gather, reduce_scatter, all_to_all  (n-1) alpha +   (n-1)/n nbytes beta
    send_recv                                   alpha +          nbytes beta
(Thakur, Rabenseifner and Gropp 2005), which is also how `calibrate` turns a measured line
t = a + b nbytes at its n ranks into alpha and beta.

A CPU rank runs max(1, cores per node // ranks per node) threads (what init() gives it). Its
rates are the "threads" entry's for that many threads where the profile has one (threads do not
add up to cores: on this project's 2-core machine two threads make 1.3-2.1x one thread's
products), else the tables' (measured at "cores" threads, one rank per core) scaled by threads /
cores. Where ranks x threads exceed the node's cores, the ranks take turns: each gets its share
of the cores (cores / (ranks x threads)) times the node's throughput at that many ranks per core
("shared_cores", measured: switching between ranks costs caches), and its collectives stretch as
much for the share of their time its core is busy moving bytes and polling ("communication_cpu":
MPI over shared memory copies and polls on the rank's own core, so a rank waiting for its turn
delays its peers; ~1 on a CPU, 0 on a GPU whose copies are the NIC's or NVLink's).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
OVERLAPS = ("dp", "tp", "cp", "zero")


def ring_steps(collective: str, ranks: int) -> tuple:
    """(latency steps, share of the buffer each rank moves) of a ring collective over `ranks`."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose from {', '.join(COLLECTIVES)}")
    if collective == "send_recv":
        return 1, 1.0
    if ranks < 2:
        return 0, 0.0
    if collective == "all_reduce":
        return 2 * (ranks - 1), 2 * (ranks - 1) / ranks
    return ranks - 1, (ranks - 1) / ranks


def collective_time(link: dict, collective: str, ranks: int, nbytes: float) -> float:
    """Seconds of one collective over `ranks` moving `nbytes` with a link's alpha and beta."""
    steps, share = ring_steps(collective, ranks)
    return steps * link["alpha"] + share * nbytes * link["beta"]


def fit_alpha_beta(collective: str, ranks: int, sizes, seconds) -> dict:
    """alpha and beta of a collective from times measured at `ranks` ranks (least squares of
    t = a + b nbytes, then divided by the ring's steps and share)."""
    n = len(sizes)
    if n < 2:
        raise ValueError("fitting alpha and beta needs times at two message sizes or more")
    mx, my = sum(sizes) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    b = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds)) / sxx
    a = my - b * mx
    steps, share = ring_steps(collective, ranks)
    return {"alpha": max(a, 0.0) / steps, "beta": max(b, 0.0) / share}


def interpolate(table, x: float) -> float:
    """A rate from a table of [size, rate] rows (any order), log-linear between rows and flat
    beyond the ends."""
    rows = sorted((float(s), float(r)) for s, r in table)
    if not rows:
        raise ValueError("an empty rate table")
    if x <= rows[0][0]:
        return rows[0][1]
    for (s0, r0), (s1, r1) in zip(rows, rows[1:]):
        if x <= s1:
            w = (math.log(x) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return r0 + w * (r1 - r0)
    return rows[-1][1]


# a placeholder for a CPU node no one has measured: one 2020s server core's float32 rates and
# a 100 Gb/s Ethernet; `calibrate` replaces every figure with this machine's
DEFAULT = {"name": "unmeasured CPU defaults", "device": "cpu", "cores": 1,
           "matmul": [[1e6, 5e9], [1e8, 4e10], [1e10, 6e10]],
           "attention": [[1e6, 2e9], [1e8, 1.5e10], [1e10, 3e10]],
           "memory_bandwidth": 5e9, "optimizer": 2e8,
           "intra_node": {c: {"alpha": 5e-6, "beta": 1 / 5e9} for c in COLLECTIVES},
           "inter_node": {c: {"alpha": 2e-5, "beta": 1 / 12.5e9} for c in COLLECTIVES},
           "overlap": {k: 0.0 for k in OVERLAPS}}


# placeholders for a GPU node no one has measured, from an H100 SXM's datasheet (float32
# products through TF32 tensor cores at a realistic share of their peak, HBM3, NVLink 4 within a
# node, 400 Gb/s InfiniBand across): `calibrate` on the machine, or its own figures, replace them
DEFAULT_GPU = {**DEFAULT, "name": "unmeasured GPU defaults (H100 datasheet)", "device": "cuda",
               "matmul": [[1e8, 5e13], [1e10, 3e14]], "attention": [[1e8, 3e13], [1e10, 2e14]],
               "memory_bandwidth": 3e12, "optimizer": 1e11,
               "intra_node": {c: {"alpha": 3e-6, "beta": 1 / 4.5e11} for c in COLLECTIVES},
               "inter_node": {c: {"alpha": 1e-5, "beta": 1 / 5e10} for c in COLLECTIVES}}


# profiles written by hand for machines this project cannot measure, each with its sources
SHIPPED = {f.stem: f for f in sorted((Path(__file__).parent / "profiles").glob("*.json"))}


class Profile:
    """A machine's rates (the JSON above), with every field checked when read."""

    def __init__(self, data: dict, source: str = "<dict>"):
        self.source = source
        data = {**DEFAULT, **data}
        for key in ("memory_bandwidth", "optimizer", "cores"):
            if not _positive(data[key]):
                raise ValueError(f"profile {source}: {key!r} must be a positive number, got {data[key]!r}")
        links = {}
        for where in ("intra_node", "inter_node"):
            given = data.get(where) or data["intra_node"]
            for c in COLLECTIVES:
                link = given.get(c) if isinstance(given, dict) else None
                if not isinstance(link, dict) or not all(isinstance(link.get(k), (int, float)) and link[k] >= 0
                                                         for k in ("alpha", "beta")):
                    raise ValueError(f"profile {source}: {where}.{c} must be {{'alpha': seconds, 'beta': seconds per "
                                     f"byte}} (numbers >= 0), got {link!r}")
            links[where] = {c: dict(given[c]) for c in COLLECTIVES}
        _check_rates(data, source)
        for n, rates in (data.get("threads") or {}).items():
            if not str(n).isdigit() or int(n) < 1 or not isinstance(rates, dict):
                raise ValueError(f"profile {source}: threads must map a thread count to its rates, got {n!r}: "
                                 f"{rates!r}")
            _check_rates(rates, f"{source} threads.{n}", required=())
        shared = data.get("shared_cores", [[1, 1.0]])
        if not isinstance(shared, list) or not shared or any(
                not isinstance(r, (list, tuple)) or len(r) != 2 or not all(_positive(v) for v in r) for r in shared):
            raise ValueError(f"profile {source}: shared_cores must be [ranks_per_core, throughput] rows of positive "
                             f"numbers, got {shared!r}")
        if not isinstance(data.get("synchronization", 0.0), (int, float)) or data.get("synchronization", 0.0) < 0:
            raise ValueError(f"profile {source}: synchronization must be seconds >= 0, got "
                             f"{data['synchronization']!r}")
        waits = data.get("synchronization_shared", [[1, 0.0]])
        if not isinstance(waits, list) or not waits or any(
                not isinstance(r, (list, tuple)) or len(r) != 2 or not _positive(r[0])
                or not isinstance(r[1], (int, float)) or r[1] < 0 for r in waits):
            raise ValueError(f"profile {source}: synchronization_shared must be [ranks_per_core, seconds >= 0] rows, "
                             f"got {waits!r}")
        for key in ("communication_cpu", "pipeline_wait_cpu"):
            busy = data.get(key, 0.0)
            if not isinstance(busy, (int, float)) or isinstance(busy, bool) or not 0 <= busy <= 1:
                raise ValueError(f"profile {source}: {key} must be a share in [0, 1], got {busy!r}")
        overlap = {**DEFAULT["overlap"], **(data.get("overlap") or {})}
        for k, v in overlap.items():
            if k not in OVERLAPS or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"profile {source}: overlap.{k} must be one of {OVERLAPS} with a share in [0, 1], "
                                 f"got {v!r}")
        self.data = {**data, **links, "overlap": overlap}

    @classmethod
    def load(cls, path) -> "Profile":
        """A profile file, or the name of one this package ships (SHIPPED: machines written from
        their datasheets, e.g. h100-sxm)."""
        if not Path(path).exists() and str(path) in SHIPPED:
            path = SHIPPED[str(path)]
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"profile {path}: cannot be read as JSON ({e})") from None
        if not isinstance(data, dict):
            raise ValueError(f"profile {path}: expected a JSON object, got {type(data).__name__}")
        return cls(data, str(path))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.data, indent=1) + "\n")

    def __getitem__(self, key):
        return self.data[key]

    def rates(self, cores_per_node: float, ranks_per_node: int) -> "Rates":
        """A rank's rates on a node of `cores_per_node` cores running `ranks_per_node` ranks (for a
        GPU profile, the profile's own)."""
        if self["device"] != "cpu":
            return Rates(self.data, 1.0, 1.0)
        threads = max(1, int(cores_per_node // ranks_per_node))
        measured = (self.data.get("threads") or {}).get(str(threads), {})
        # what the "threads" entry lacks: the one-rank-per-core tables scaled by threads / cores
        table = {k: measured[k] if k in measured else _scaled(self.data.get(k), threads / self["cores"])
                 for k in RATES}
        per_core = ranks_per_node * threads / cores_per_node  # > 1: the ranks take turns on the cores
        rates = Rates(table, 1.0, 1.0)
        rates.slowdown = lambda k: k / _linear(self.data.get("shared_cores", [[1, 1.0]]), k) if k > 1 else 1.0
        rates.per_core, rates.busy = per_core, self.data.get("communication_cpu", 0.0)
        rates.waiting = self.data.get("pipeline_wait_cpu", rates.busy)
        if per_core > 1:
            rates.scale = 1 / rates.slowdown(per_core)
            rates.stretch = 1 + rates.busy * (rates.slowdown(per_core) - 1)
        return rates

    def matmul_rate(self, flops: float, cores: float) -> float:
        """FLOP/s of one product of `flops` on a rank of `cores` cores (one rank per core: rates())."""
        return interpolate(self["matmul"], flops) * self._scale(cores)

    def attention_rate(self, flops: float, cores: float) -> float:
        return interpolate(self["attention"], flops) * self._scale(cores)

    def bandwidth(self, cores: float) -> float:
        return self["memory_bandwidth"] * self._scale(cores)

    def optimizer_rate(self, cores: float) -> float:
        return self["optimizer"] * self._scale(cores)

    def _scale(self, cores: float) -> float:
        return 1.0 if self["device"] != "cpu" else cores / self["cores"]

    def synchronization(self, ranks_per_core: float) -> tuple:
        """(seconds a blocking call waits for the slowest rank, whether that was measured with the
        ranks taking turns on the cores as many to a core): the measured figure at that many ranks
        per core where the profile has them (linear between), else the one-per-core figure."""
        waits = self.data.get("synchronization_shared")
        if ranks_per_core > 1 and waits:
            return _linear(waits, ranks_per_core), True
        return self.data.get("synchronization", 0.0), False

    def collective(self, collective: str, ranks: int, nbytes: float, inter_node: bool) -> float:
        return collective_time(self["inter_node" if inter_node else "intra_node"][collective], collective, ranks,
                               nbytes)


class Rates:
    """One rank's rates: its threads' tables (RATES: the profile's "threads" entry's, or the
    tables scaled) times its share of the cores, and how much its collectives stretch where ranks
    share cores."""

    def __init__(self, table: dict, scale: float, stretch: float):
        self.table, self.scale, self.stretch = table, scale, stretch
        # ranks per core (threads counted), the busy share of a core waiting in MPI, and the
        # slowdown of a rank at k ranks per core (k / the node's throughput there)
        self.per_core, self.busy, self.slowdown = 1.0, 0.0, lambda k: 1.0
        self.waiting = 0.0  # the share of a core a pipeline stage asleep in its wait takes

    def describe(self) -> str:
        """What --explain says of the share (nothing where a rank has its cores to itself)."""
        if self.scale == 1.0:
            return ""
        return f", the ranks sharing cores: {self.scale:.2f} of the rates, collectives x {self.stretch:.2f}"

    def matmul(self, flops: float, head: bool = False) -> float:
        """FLOP/s of a forward product of `flops` (head: the vocabulary's product, rated from its
        own table where the profile has one: at equal FLOPs a [tokens, C] x [C, vocab] product
        runs at another rate than a block's square ones, so the two are not interpolated together)."""
        return interpolate(self._table("matmul", head), flops) * self.scale

    def matmul_backward(self, flops: float, head: bool = False) -> float:
        """FLOP/s of a linear's backward products (the input's and the weight's gradients), by
        the size of the forward product."""
        return interpolate(self._table("matmul_backward", head) or self._table("matmul", head), flops) * self.scale

    def _table(self, key: str, head: bool):
        return (self.table.get(key + "_head") if head else None) or self.table.get(key)

    def attention(self, flops: float) -> float:
        return interpolate(self.table["attention"], flops) * self.scale

    @property
    def bandwidth(self) -> float:
        return self.table["memory_bandwidth"] * self.scale

    @property
    def optimizer(self) -> float:
        return self.table["optimizer"] * self.scale

    @property
    def loss_parallel(self) -> float | None:
        """Logits per second through TP's vocabulary-parallel cross-entropy (None: unmeasured)."""
        rate = self.table.get("loss_parallel")
        return rate * self.scale if rate else None

    @property
    def loss(self) -> float | None:
        """Logits per second through the cross-entropy's forward and backward (None: unmeasured)."""
        rate = self.table.get("loss")
        return rate * self.scale if rate else None


RATES = ("matmul", "matmul_backward", "matmul_head", "matmul_backward_head", "attention", "memory_bandwidth",
         "optimizer", "loss", "loss_parallel")


def _scaled(rate, factor: float):
    if rate is None:
        return None
    return [[s, r * factor] for s, r in rate] if isinstance(rate, list) else rate * factor


def _check_rates(data: dict, source: str, required=("matmul", "attention")) -> None:
    for key in ("matmul", "matmul_backward", "matmul_head", "matmul_backward_head", "attention"):
        rows = data.get(key)
        if rows is None and key not in required:
            continue
        if not isinstance(rows, list) or not rows or any(
                not isinstance(r, (list, tuple)) or len(r) != 2 or not all(_positive(v) for v in r) for r in rows):
            raise ValueError(f"profile {source}: {key!r} must be a list of [flops, flop_per_s] rows of positive "
                             f"numbers, got {rows!r}")
    for key in ("memory_bandwidth", "optimizer", "loss", "loss_parallel"):
        if key in data and not _positive(data[key]):
            raise ValueError(f"profile {source}: {key!r} must be a positive number, got {data[key]!r}")


def _linear(table, x: float) -> float:
    """Linear between [x, y] rows, flat beyond the ends."""
    rows = sorted((float(a), float(b)) for a, b in table)
    if x <= rows[0][0]:
        return rows[0][1]
    for (x0, y0), (x1, y1) in zip(rows, rows[1:]):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return rows[-1][1]


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
