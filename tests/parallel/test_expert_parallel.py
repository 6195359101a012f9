"""Expert parallelism: ExpertParallel's expert blocks and refusals in one process; the
all-to-all, dispatch/combine and the experts' gradient groups on 2 and 4 ranks against one
process (tests/parallel/mpi/expert_parallel.py, expert_grads.py)."""
import pytest

from infinitrain.nn.parallel.expert_parallel import ExpertParallel
from helpers import MPI_SCRIPTS, mpirun


class _Group:  # what ExpertParallel reads of a process group
    def __init__(self, rank, size):
        self.rank, self.size, self.ranks = rank, size, list(range(size))


def test_each_ep_rank_holds_a_contiguous_block_of_experts():
    assert [ExpertParallel(_Group(r, 4)).local_experts(8) for r in range(4)] == \
        [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    for bad in (6, 0):
        with pytest.raises(ValueError, match=f"num_experts {bad} must be a positive multiple of --expert_parallel 4"):
            ExpertParallel(_Group(0, 4)).local_experts(bad)


@pytest.mark.mpi
@pytest.mark.parametrize("n,ep", [(2, 2), (4, 4), (4, 2)])
def test_all_to_all_and_dispatch_combine_against_one_process(n, ep):
    assert mpirun(n, [str(MPI_SCRIPTS / "expert_parallel.py"), str(ep)]).count("OK") == n


@pytest.mark.mpi
@pytest.mark.parametrize("n,args", [(2, ["2"]), (4, ["2"]), (4, ["4", "forced"])])
def test_expert_gradients_are_reduced_over_their_group_as_one_process(n, args):
    """EP 2 (expert DP 1), EP 2 x expert DP 2, EP 4 with every token routed to one expert."""
    assert mpirun(n, [str(MPI_SCRIPTS / "expert_grads.py"), *args]).count("OK") == n
