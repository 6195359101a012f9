"""Run under mpiexec -n 2 with a short INFINITRAIN_COLLECTIVE_TIMEOUT: rank 1 misbehaves at the
third all-reduce of the world group (argv[1]): `desync` calls a barrier in its place, `loop`
spins in Python instead. The watchdog must end the job naming rank 1."""
import sys

import infinitrain as it
from infinitrain.nn import parallel

env = parallel.init()
for i in range(5):
    t = it.tensor([1.0])
    if env.rank == 1 and i == 2:
        if sys.argv[1] == "desync":
            env.world.barrier()
        else:
            while True:
                pass
    env.world.all_reduce(t)
print("should not get here", flush=True)
