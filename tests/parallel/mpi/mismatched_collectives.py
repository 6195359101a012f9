"""Ranks that call a collective differently (tests/parallel/test_distributed.py): MODE
"dtype" passes float32 on rank 0 and int32 (the same bytes) on the others; "size" passes
tensors of different lengths; "op" calls all_reduce on rank 0 and broadcast on the others;
"missing" calls all_reduce on rank 0 only (the others wait, then leave)."""
import sys
import time

import infinitrain as it
from infinitrain.nn import parallel

env = parallel.init()
mode, g = sys.argv[1], env.world
if mode == "dtype":
    g.all_reduce(it.ones(4, dtype=it.float32 if env.rank == 0 else it.int32))
elif mode == "size":
    g.all_reduce(it.ones(4 if env.rank == 0 else 1000))
elif mode == "missing":
    g.all_reduce(it.ones(4)) if env.rank == 0 else time.sleep(60)
else:
    t = it.ones(4)
    g.all_reduce(t) if env.rank == 0 else g.broadcast(t, 0)
print("no error", flush=True)
