"""The watchdog and flight recorder: no collective hangs the job silently.

Every operation of a process group (collectives, sends, receives, barriers) is recorded as it
starts and when it completes, with a sequence number per group, in a bounded ring (PyTorch's
Flight Recorder, `TORCH_NCCL_TRACE_BUFFER_SIZE`). A thread checks the ring: an operation in
flight for longer than the timeout means a hang. Then this rank writes its ring to
DIR/flight-recorder-rank-R.json and leaves a request there that the other ranks' watchdogs
answer with their own rings (a rank busy in Python answers too; a stopped or dead one cannot),
reads the rings it finds, says which rank(s) did not reach which operation, or called another
one in its place (a desync), and aborts the job. DIR must be on storage every rank sees (the
working directory, or a shared folder on several nodes).
"""
from __future__ import annotations

import collections
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path

recorder = None  # the FlightRecorder of this process while a watchdog runs, else None


class FlightRecorder:
    """The last `size` operations: [id, group name, group ranks, op, seq, bytes, start, end].

    start() is on every collective's path, so it takes no lock: appending to a bounded deque
    and next() on a counter are atomic under the GIL, and the watchdog thread reads the ring
    through list(), one C-level copy that no append interleaves with."""

    def __init__(self, size: int = 2000):
        self.ring = collections.deque(maxlen=size)
        self.ids = itertools.count(1)
        self.started = {}  # (group name, ranks) -> [operations started on it]
        # per group object: (name, ranks (a list, as a dumped ring has them), its counter in
        # `started`, the group (kept: its id stays its own)), made once (the groups are the
        # recorder's to read only)
        self.groups = {}

    def start(self, group, op: str, nbytes: int) -> list:
        g = self.groups.get(id(group))
        if g is None:
            name, ranks = getattr(group, "name", "group"), list(group.ranks)
            g = self.groups[id(group)] = (name, ranks, self.started.setdefault((name, tuple(ranks)), [0]), group)
        g[2][0] += 1
        rec = [next(self.ids), g[0], g[1], op, g[2][0], nbytes, time.time(), None]
        self.ring.append(rec)
        return rec

    @staticmethod
    def done(rec) -> None:
        rec[7] = time.time()

    def in_flight(self) -> list:
        return [r for r in list(self.ring) if r[7] is None]

    def dump(self, path: Path, rank: int, job: str, reason: str) -> None:
        ops = [dict(zip(("id", "group", "ranks", "op", "seq", "bytes", "start", "end"), r)) for r in list(self.ring)]
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"job": job, "rank": rank, "pid": os.getpid(), "time": time.time(),
                                   "reason": reason, "ops": ops}, indent=1))
        os.replace(tmp, path)


def _describe(rec) -> str:
    return f"{rec[3]} #{rec[4]} of group {rec[1]}{rec[2]}"


class Watchdog:
    """Started by parallel.init (collective_timeout > 0): one daemon thread per process."""

    def __init__(self, comm, timeout: float, folder, job: str, size: int = 2000, poll: float = 0.5):
        global recorder
        self.comm, self.timeout, self.folder, self.job = comm, float(timeout), Path(folder), job
        self.rank, self.world = comm.Get_rank(), comm.Get_size()
        self.poll = poll
        self.recorder = recorder = FlightRecorder(size)
        self.answered = set()
        self._thread = threading.Thread(target=self._run, name="infinitrain-watchdog", daemon=True)
        self._thread.start()

    def _path(self, rank: int) -> Path:
        return self.folder / f"flight-recorder-rank-{rank}.json"

    def _run(self) -> None:
        while True:
            time.sleep(self.poll)
            try:
                self._check()
            except Exception as e:  # noqa: BLE001 - the watchdog must never die silently
                sys.stderr.write(f"[rank {self.rank}] watchdog: {type(e).__name__}: {e}\n")

    def _check(self) -> None:
        now = time.time()
        stuck = [r for r in self.recorder.in_flight() if now - r[6] > self.timeout]
        if stuck:
            self._hang(min(stuck, key=lambda r: r[6]), now)
        # another rank asks for this rank's ring
        if self.folder.is_dir():
            for req in self.folder.glob(f"dump-request-{self.job}-*"):
                if req.name not in self.answered:
                    self.answered.add(req.name)
                    self.recorder.dump(self._path(self.rank), self.rank, self.job, f"asked by {req.name}")

    def _hang(self, rec, now: float) -> None:
        waited = now - rec[6]
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.recorder.dump(self._path(self.rank), self.rank, self.job, f"timed out in {_describe(rec)}")
            request = self.folder / f"dump-request-{self.job}-{self.rank}"
            request.write_text(_describe(rec))
            self.answered.add(request.name)
            time.sleep(min(5.0, max(2.0, 4 * self.poll)))  # the others' watchdogs answer
            verdict = self.diagnose(rec, self._read_rings())
            request.unlink(missing_ok=True)
            records = f"Flight records of every rank that answered are in {self.folder}/"
        except OSError as e:  # no flight records, but the job must still end
            verdict = "the other ranks' flight records could not be collected"
            records = f"The flight records could not be written to {self.folder} ({e.strerror or e})"
        sys.stderr.write(f"[rank {self.rank}] watchdog: waited {waited:.1f} s (collective timeout "
                         f"{self.timeout:g}) in {_describe(rec)}: {verdict}. {records}; aborting the job.\n")
        sys.stderr.flush()
        time.sleep(0.5)
        self.comm.Abort(1)

    def _read_rings(self) -> dict:
        rings = {}
        for path in self.folder.glob("flight-recorder-rank-*.json"):
            try:
                data = json.loads(path.read_text())
                if data.get("job") == self.job:  # not a ring an earlier job left there
                    rings[int(data["rank"])] = data["ops"]
            except (OSError, ValueError, KeyError):
                continue
        return rings

    @staticmethod
    def diagnose(rec, rings: dict) -> str:
        """Which members of rec's group did not reach it, or called something else as that
        operation of the group (rings: rank -> its recorded operations)."""
        name, ranks, op, seq = rec[1], rec[2], rec[3], rec[4]
        findings = []
        for m in ranks:
            ops = rings.get(m)
            if ops is None:
                findings.append(f"rank {m} did not answer (stopped, dead, or stuck outside Python)")
                continue
            mine = [o for o in ops if o["group"] == name and o["ranks"] == ranks]
            same = [o for o in mine if o["seq"] == seq]
            if same and same[0]["op"] != op:
                findings.append(f"rank {m} called {same[0]['op']} as #{seq} of group {name} (a desync)")
            elif not same:
                last = max((o["seq"] for o in mine), default=0)
                busy = [o for o in ops if o["end"] is None]
                where = f"; it is in {busy[-1]['op']} #{busy[-1]['seq']} of group {busy[-1]['group']}" if busy \
                    else "; it is in no collective"
                findings.append(f"rank {m} is stuck before it (its last on that group: #{last}{where})")
        return "; ".join(findings) if findings else "every rank of the group entered it"


def check_folder(folder) -> None:
    """The flight recorder's folder must be one this process can write (made when a hang is
    dumped): refused at start, not found out when a rank hangs."""
    path = Path(folder)
    if path.exists():
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"flight recorder folder {path}: {'not a folder' if not path.is_dir() else 'not writable'}"
                             " (--flight_recorder_dir or INFINITRAIN_FLIGHT_RECORDER_DIR names where hangs are "
                             "recorded)")
        return
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"flight recorder folder {path}: cannot be made under {parent} (not writable); name "
                         "another with --flight_recorder_dir or INFINITRAIN_FLIGHT_RECORDER_DIR")


def start(comm, timeout: float, folder) -> Watchdog | None:
    """Collective over comm (the job's id is broadcast); None when timeout <= 0."""
    job = comm.bcast(f"{os.getpid()}-{int(time.time() * 1000)}" if comm.Get_rank() == 0 else None, root=0)
    if timeout <= 0:
        return None
    return Watchdog(comm, timeout, folder, job)
