"""mpi_launch speaks each launcher's language: what kind a launcher is (from its --version),
and the command line it writes for MPICH/Intel Hydra, Open MPI and Slurm's srun (ranks, the
host list, the rank prefix, the variables every rank gets, launcher flags passed through, the
first host as MASTER_ADDR). The launches themselves run in tests/parallel."""
import shutil
import stat
import sys

import pytest

import mpi_launch
from mpi_launch import command, launcher_kind, parse
from helpers import run


def fake_launcher(tmp_path, name: str, version: str):
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.slow  # runs each fake launcher's --version
@pytest.mark.parametrize("version,kind", [
    ("HYDRA build details:\n    Version: 4.0.2", "hydra"),
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/", "openmpi"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.9", "hydra"),
    ("slurm 22.05.8", "srun")])
def test_the_launchers_kind_is_read_from_its_version(tmp_path, version, kind):
    assert launcher_kind(fake_launcher(tmp_path, "mpiexec", version)) == kind


@pytest.mark.slow
def test_the_wheels_mpiexec_is_hydra_and_an_unknown_one_is_refused(tmp_path):
    from pathlib import Path
    wheel = Path(sys.executable).parent / "mpiexec"
    if wheel.is_file():  # the mpich extra's
        assert launcher_kind(str(wheel)) == "hydra"
    with pytest.raises(SystemExit, match="does not say which MPI launcher"):
        launcher_kind(fake_launcher(tmp_path, "mpiexec", "something else 1.0"))
    if shutil.which("mpirun") and "Open MPI" in run(["mpirun", "--version"]).stdout:
        assert launcher_kind(shutil.which("mpirun")) == "openmpi"


def _command(tmp_path, kind, *flags):
    hosts = tmp_path / "hosts"
    hosts.write_text("# the nodes\nnode7 slots=8\nnode8 slots=8\n")
    exe = fake_launcher(tmp_path, "srun" if kind == "srun" else "mpiexec", "x")
    a = parse(["--nnodes", "2", "--nproc_per_node", "4", "--hostfile", str(hosts), "--mpiexec", exe,
               "--launcher", kind, *flags, "train.py", "--lr", "1"])
    return command(a, {"TORCHELASTIC_RESTART_COUNT": "0"}), str(hosts), exe


def test_hydra_gets_genv_and_its_host_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    cmd, hosts, exe = _command(tmp_path, "hydra", "--launcher_args", "-bootstrap ssh")
    head = cmd[:cmd.index(sys.executable)]
    assert head[:7] == [exe, "-n", "8", "-f", hosts, "-ppn", "4"] and "-prepend-rank" in head
    assert ["-genv", "MASTER_ADDR", "node7"] == head[head.index("MASTER_ADDR") - 1:head.index("MASTER_ADDR") + 2]
    assert head[-2:] == ["-bootstrap", "ssh"] and "OMP_NUM_THREADS" not in head
    assert cmd[cmd.index(sys.executable):] == [sys.executable, "-m", "mpi_launch.worker", "train.py", "--lr", "1"]


def test_open_mpi_gets_x_variables_tagged_output_and_a_per_node_map(tmp_path, monkeypatch):
    monkeypatch.setattr(mpi_launch.os, "geteuid", lambda: 0)
    cmd, hosts, exe = _command(tmp_path, "openmpi", "--launcher_args", "--bind-to core")
    head = cmd[:cmd.index(sys.executable)]
    assert head[:3] == [exe, "-n", "8"] and "--tag-output" in head
    assert "--oversubscribe" not in head  # several nodes: each node's slots are the hostfile's
    assert "--hostfile" in head and head[head.index("--map-by") + 1] == "ppr:4:node"
    assert "--allow-run-as-root" in head and "-genv" not in head
    assert "MASTER_ADDR=node7" in head and "TORCHELASTIC_RESTART_COUNT=0" in head
    assert head[head.index("MASTER_ADDR=node7") - 1] == "-x" and head[-2:] == ["--bind-to", "core"]


@pytest.mark.slow  # asks a Python process which MPI mpi4py loads
def test_srun_gets_export_label_tasks_per_node_and_an_mpi_plugin(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_MPI_TYPE", raising=False)
    cmd, hosts, exe = _command(tmp_path, "srun")
    head = cmd[:cmd.index(sys.executable)]
    assert head[:6] == [exe, "-n", "8", "--ntasks-per-node", "4", "--label"]
    export = next(f for f in head if f.startswith("--export="))
    assert export.startswith("--export=ALL,") and "MASTER_ADDR=node7" in export and "WORLD_SIZE=8" in export
    assert head[-3:] == ["-N", "2", "--mpi=pmi2"]  # the plugin for the MPI mpi4py loads (MPICH here)
    monkeypatch.setenv("SLURM_MPI_TYPE", "pmix")  # a choice already made is left alone
    cmd, _, _ = _command(tmp_path, "srun")
    assert not any(f.startswith("--mpi") for f in cmd)


def test_open_mpi_on_one_node_is_told_to_oversubscribe_and_run_as_root(monkeypatch, tmp_path):
    exe = fake_launcher(tmp_path, "mpirun", "x")
    monkeypatch.setattr(mpi_launch, "_cpus", lambda: 2)
    monkeypatch.setattr(mpi_launch.os, "geteuid", lambda: 0)
    assert mpi_launch.start(8, exe, "openmpi") == [exe, "-n", "8", "--tag-output", "--oversubscribe",
                                                   "--allow-run-as-root"]
    monkeypatch.setattr(mpi_launch.os, "geteuid", lambda: 1000)
    assert mpi_launch.start(2, exe, "openmpi") == [exe, "-n", "2", "--tag-output"]
    assert mpi_launch.start(8, exe, "hydra") == [exe, "-n", "8"]  # Hydra does both unasked


@pytest.mark.slow  # runs the scontrol stand-in
def test_inside_a_slurm_allocation_its_nodes_and_tasks_are_the_defaults(tmp_path, monkeypatch):
    scontrol = tmp_path / "scontrol"  # as Slurm's: expands a host list, one name per line
    scontrol.write_text("#!/bin/sh\necho node3; echo node4\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    for k, v in {"SLURM_JOB_ID": "17", "SLURM_JOB_NODELIST": "node[3-4]", "SLURM_JOB_NUM_NODES": "2",
                 "SLURM_TASKS_PER_NODE": "4(x2)"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    exe = fake_launcher(tmp_path, "mpiexec", "x")
    a = parse(["--mpiexec", exe, "--launcher", "hydra", "train.py"])
    assert (a.nnodes, a.nproc_per_node) == (2, 4)
    cmd = command(a, kind="hydra")
    assert cmd[:5] == [exe, "-n", "8", "-ppn", "4"] and "-f" not in cmd  # Hydra reads the allocation
    assert cmd[cmd.index("MASTER_ADDR") + 1] == "node3"
    # Hydra starts its proxies with srun: under MpiDefault=pmix they would get PMIx variables
    assert mpi_launch.launcher_env("hydra", {"SLURM_JOB_ID": "17"})["SLURM_MPI_TYPE"] == "none"
    assert "SLURM_MPI_TYPE" not in mpi_launch.launcher_env("openmpi", {"SLURM_JOB_ID": "17"})
    a = parse(["--nnodes", "1", "--nproc_per_node", "2", "--mpiexec", exe, "train.py"])
    assert (a.nnodes, a.nproc_per_node) == (1, 2)  # flags still win


def test_a_launcher_named_but_missing_is_an_error_not_a_substitute(tmp_path, monkeypatch):
    monkeypatch.delenv("MPIEXEC", raising=False)
    with pytest.raises(SystemExit, match="--mpiexec /nowhere/mpiexec: no such program"):
        mpi_launch.find_mpiexec("/nowhere/mpiexec")
    monkeypatch.setenv("MPIEXEC", "/nowhere/either")
    with pytest.raises(SystemExit, match=r"\$MPIEXEC /nowhere/either: no such program"):
        mpi_launch.find_mpiexec()
    with pytest.raises(SystemExit):
        parse(["--nproc_per_node", "2", "--hostfile", str(tmp_path / "missing"), "train.py"])
