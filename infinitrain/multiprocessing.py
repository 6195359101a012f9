"""torch.multiprocessing at its path: Python's multiprocessing, plus spawn (start nprocs
processes running fn(i, *args) and wait for them, raising if one fails). Tensors cross
process boundaries as Python pickles them (no shared-memory tensor storage)."""
from __future__ import annotations

import multiprocessing as _mp
from multiprocessing import connection as _connection
from multiprocessing import (Array, Barrier, Condition, Event, JoinableQueue, Lock, Manager, Pipe, Pool,  # noqa: F401
                             Process, Queue, RLock, Semaphore, SimpleQueue, Value, active_children, cpu_count,
                             current_process, get_all_start_methods, get_context, get_start_method,
                             set_start_method)


class ProcessRaisedException(Exception):
    """A spawned process failed with an exception (its traceback is in the message)."""

    def __init__(self, msg: str, error_index: int, error_pid: int):
        super().__init__(msg)
        self.error_index, self.pid = error_index, error_pid


class ProcessExitedException(Exception):
    """A spawned process ended with a non-zero exit code."""

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int):
        super().__init__(msg)
        self.error_index, self.pid, self.exit_code = error_index, error_pid, exit_code


def _run(fn, i, args, errors):
    import traceback
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass
    except Exception:
        errors.put((i, traceback.format_exc()))
        raise SystemExit(1)


class ProcessContext:
    """The processes spawn started; join() waits for all, raising on the first failure."""

    def __init__(self, processes, errors):
        self.processes, self.errors = processes, errors

    def pids(self) -> list:
        return [p.pid for p in self.processes]

    def join(self, timeout: float | None = None) -> bool:
        """Waits until a process ends (or timeout); True once all have ended well."""
        running = [p.sentinel for p in self.processes if p.exitcode is None]
        if running:
            _connection.wait(running, timeout)
        for i, p in enumerate(self.processes):
            if p.exitcode not in (0, None):
                for q in self.processes:
                    if q.is_alive():
                        q.terminate()
                if not self.errors.empty():
                    index, text = self.errors.get()
                    raise ProcessRaisedException(f"\n\n-- Process {index} terminated with the following error:\n"
                                                 f"{text}", index, self.processes[index].pid)
                raise ProcessExitedException(f"process {i} terminated with exit code {p.exitcode}", i, p.pid,
                                             p.exitcode)
        return all(p.exitcode == 0 for p in self.processes)


def start_processes(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False,
                    start_method: str = "spawn"):
    context = _mp.get_context(start_method)
    errors = context.SimpleQueue()
    processes = []
    for i in range(nprocs):
        p = context.Process(target=_run, args=(fn, i, args, errors), daemon=daemon)
        p.start()
        processes.append(p)
    ctx = ProcessContext(processes, errors)
    if not join:
        return ctx
    while not ctx.join():
        pass
    return None


def spawn(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False, start_method: str = "spawn"):
    """Starts nprocs processes running fn(i, *args), i = 0..nprocs-1, and (join=True) waits
    for all; a failure in one raises here with its traceback."""
    return start_processes(fn, args, nprocs, join, daemon, start_method)


_sharing = ["file_system"]


def get_sharing_strategy() -> str:
    return _sharing[0]


def set_sharing_strategy(new_strategy: str) -> None:
    """Accepted for PyTorch programs; tensors here cross processes by pickling either way."""
    if new_strategy not in get_all_sharing_strategies():
        raise ValueError(f"sharing strategy {new_strategy!r} is not one of {sorted(get_all_sharing_strategies())}")
    _sharing[0] = new_strategy


def get_all_sharing_strategies() -> set:
    return {"file_system", "file_descriptor"}
