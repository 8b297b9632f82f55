"""A pool of long-lived worker processes whose per-task deadline is enforced with SIGKILL.

Pure-Python verifiers (sympy!) cannot be interrupted from another thread and SIGALRM only
works on a main thread, so the only deadline that always holds is killing the process
that runs the task. Each worker slot is a thread that owns one child process: it takes up
to `max_batch` tasks from a bounded queue, sends them down a pipe, and waits for each
answer until that task's deadline; a late task kills and replaces the child and is
answered with `TaskTimeout`; the rest of its batch goes to the fresh child.

An urgent task (a timed-out verification's gold check) goes before everything queued: it decides a verdict that
is already late, and behind a backlog it once waited past the deadline, which turned a 0 into a null.

A task cancelled while it runs (its request ended: the client went away) has its worker killed once it has run
CANCEL_AFTER_S, as a late task does: a blow-up nobody waits for must not hold the worker to its deadline.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing as mp
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)
# A cancelled task that has run this long is stopped by killing its worker; a shorter one is left to finish, since
# most tasks take milliseconds and a kill costs a fresh worker. Also how often a slot looks for such a cancel.
CANCEL_AFTER_S = 0.1


class PoolFull(Exception):
    """The task queue is at its limit: the caller should back off and retry."""


class TaskTimeout(Exception):
    """The task ran for its whole `timeout_s` without finishing; its worker was killed."""


class DeadlinePassed(Exception):
    """The caller's deadline passed before the task had its `timeout_s` (waiting for a worker, mostly): the
    pool was short of time, not the task."""


class WorkerCrashed(Exception):
    """The worker process died while running the task (not a timeout)."""


class TaskFailed(Exception):
    """The task function raised inside the worker; the message carries its repr."""


class _TaskFuture(Future[Any]):
    """A task's future that remembers being cancelled even once it runs: what is left of its batch after a kill
    is then not run again for nobody."""

    abandoned = False

    def cancel(self) -> bool:
        self.abandoned = True
        return super().cancel()


class _Abandoned(Exception):
    """The running task was cancelled: its caller left."""


class _Wake:
    """Put in the queue to wake a slot waiting on it: an urgent task is waiting beside the queue."""


_WAKE = _Wake()


@dataclass
class _Task:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout_s: float  # the task's own budget, from when its worker starts it
    deadline: float  # absolute (monotonic), the caller's: waiting for a worker counts against it
    callers: bool  # the deadline is the caller's own; else `timeout_s` from submitting, and its expiry a timeout
    future: _TaskFuture = field(default_factory=_TaskFuture)


def _worker_main(conn: Connection) -> None:
    """Child process: run (index, fn, args) batches; answer each item as soon as it is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns shutdown
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return  # parent gone or pool closed
        if batch is None:
            return
        for index, fn, args in batch:
            try:
                conn.send((index, True, fn(*args)))
            except Exception as exc:
                conn.send((index, False, f"{type(exc).__name__}: {exc}"))


class _Worker:
    """One child process and the pipe to it."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def kill(self) -> None:
        # Process.kill tolerates a process that another thread has already killed and reaped.
        if self.proc.pid is not None:
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class WorkerPool:
    """N worker processes behind a bounded queue; `submit` returns a Future.

    `preload` names modules the forkserver imports once, so a replaced worker starts in
    milliseconds instead of re-importing sympy.
    """

    def __init__(
        self,
        workers: int,
        *,
        max_queue: int = 1024,
        max_batch: int = 1,
        preload: Sequence[str] = (),
        on_kill: Callable[[], None] | None = None,
        on_item: Callable[[float], None] | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> None:
        """`on_item(seconds)` is called with each task's time on a worker (its answer, or its kill); `on_cancel` for
        each task cancelled before it ran. Both from the slots' threads."""
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._queue: queue.Queue[_Task | _Wake | None] = queue.Queue(maxsize=max_queue)
        self._urgent: collections.deque[_Task] = collections.deque()
        self._max_batch = max(1, max_batch)
        self._on_kill = on_kill
        self._on_item = on_item or (lambda seconds: None)
        self._on_cancel = on_cancel or (lambda: None)
        self._closed = threading.Event()
        self.kills = 0
        self.crashes = 0
        self._threads = [
            threading.Thread(target=self._slot, name=f"pool-slot-{i}", daemon=True) for i in range(workers)
        ]
        self._workers: list[_Worker | None] = [None] * workers
        for i, thread in enumerate(self._threads):
            self._workers[i] = _Worker(self._ctx)
            thread.start()

    @property
    def size(self) -> int:
        return len(self._threads)

    def pids(self) -> list[int | None]:
        """The current worker process ids, by slot."""
        return [w.proc.pid if w is not None else None for w in self._workers]

    def problem(self) -> str | None:
        """None while every slot takes work (a slot replaces its crashed worker itself); else what is wrong."""
        if self._closed.is_set():
            return "the math worker pool is closed"
        stopped = sum(not thread.is_alive() for thread in self._threads)
        return f"{stopped} of {self.size} math worker slots stopped" if stopped else None

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout_s: float,
        deadline: float | None = None,
        urgent: bool = False,
    ) -> Future[Any]:
        """Queue `fn(*args)` (both picklable) to run for at most `timeout_s` once a worker starts it, and to be
        answered by `deadline` (monotonic; default: `timeout_s` from now, queueing included); raises PoolFull.
        `urgent`: before every task queued (the next worker free takes it), never refused.

        A backlog must not spend the task's own budget: that turned items waiting behind others into
        "timeout" (a verdict on the answer) and killed the healthy workers running them."""
        if self._closed.is_set():
            raise RuntimeError("pool is closed")
        task = _Task(fn, args, timeout_s, time.monotonic() + timeout_s if deadline is None else deadline,
                     callers=deadline is not None)  # fmt: skip
        if urgent:
            self._urgent.append(task)
            with contextlib.suppress(queue.Full):  # a full queue has no slot waiting on it to wake
                self._queue.put_nowait(_WAKE)
            return task.future
        try:
            self._queue.put_nowait(task)
        except queue.Full:
            raise PoolFull(f"worker queue is full ({self._queue.maxsize} tasks waiting)") from None
        return task.future

    def _take_batch(self) -> list[_Task] | None:
        first: _Task | _Wake | None = _WAKE
        while isinstance(first, _Wake):
            if self._urgent:
                with contextlib.suppress(IndexError):  # another slot took it first
                    return [self._urgent.popleft()]
            first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        # Take a fair share of what is waiting, so one slot never hoards a small request's items.
        limit = min(self._max_batch, 1 + self._queue.qsize() // len(self._threads))
        while len(batch) < limit:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:  # keep the shutdown marker for this or another slot
                self._queue.put(None)
                break
            if isinstance(nxt, _Task):
                batch.append(nxt)
        return batch

    def _slot(self) -> None:
        index = self._threads.index(threading.current_thread())
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            live = [t for t in batch if self._claim(t)]
            while live:  # what a kill left of the batch goes to the fresh worker, unless it is late by now
                live = [t for t in self._run(index, self._urgent_first(live)) if self._in_time(t)]

    def _claim(self, task: _Task) -> bool:
        """Mark a task taken from the queue as running; False when it was cancelled or is late (answered)."""
        if not task.future.set_running_or_notify_cancel():
            self._on_cancel()
            return False
        return self._in_time(task)

    def _urgent_first(self, tasks: list[_Task]) -> list[_Task]:
        """`tasks` behind the urgent tasks waiting now (after a kill, before the rest of a batch runs)."""
        urgent: list[_Task] = []
        while self._urgent:
            try:
                task = self._urgent.popleft()
            except IndexError:
                break
            if self._claim(task):
                urgent.append(task)
        return urgent + tasks

    def _in_time(self, task: _Task) -> bool:
        """False, and the task answered, when its deadline passed before it started or its caller left."""
        if task.future.abandoned:  # cancelled while in a batch a kill cut short: nobody waits for it
            self._on_cancel()
            task.future.set_exception(CancelledError())
            return False
        if time.monotonic() < task.deadline:
            return True
        late = DeadlinePassed if task.callers else TaskTimeout
        task.future.set_exception(late(f"the deadline passed before a worker was free (limit {task.timeout_s:g}s)"))
        return False

    def _discard(self, index: int) -> None:
        old = self._workers[index]
        self._workers[index] = None
        if old is not None:
            old.kill()

    def _replace(self, index: int) -> _Worker:
        old = self._workers[index]
        if old is not None:
            old.kill()
        worker = _Worker(self._ctx)
        self._workers[index] = worker
        return worker

    def _run(self, index: int, tasks: list[_Task]) -> list[_Task]:
        """Run tasks on slot `index`'s worker; returns the tasks still to run after a kill."""
        if self._closed.is_set():
            for t in tasks:
                t.future.set_exception(RuntimeError("pool closed"))
            return []
        worker = self._workers[index]
        if worker is None or not worker.proc.is_alive():
            worker = self._replace(index)
        try:
            worker.conn.send([(i, t.fn, t.args) for i, t in enumerate(tasks)])
        except Exception as exc:  # unpicklable arguments: a caller error, not the worker's fault
            for t in tasks:
                t.future.set_exception(TaskFailed(f"cannot send task: {exc}"))
            return []
        pending = dict(enumerate(tasks))
        started = time.monotonic()
        while pending:
            current = min(pending)
            task = pending[current]
            # Each item gets its own timeout from when the previous one finished, capped by its deadline.
            due = min(task.deadline, started + task.timeout_s)
            try:
                message = self._receive(worker, task, due)
            except _Abandoned:
                self._on_cancel()
                log.info("a running task's request ended: killing worker %d (pid %s)", index, worker.proc.pid)
                self._discard(index)
                task.future.set_exception(CancelledError())
                del pending[current]
                if not self._closed.is_set():
                    self._replace(index)
                return [pending[k] for k in sorted(pending)]
            except (EOFError, OSError):
                self.crashes += 1
                log.warning("worker %d died (exit %s)", index, worker.proc.exitcode)
                self._discard(index)  # before answering, so a caller never sees the dead worker in place
                task.future.set_exception(WorkerCrashed(f"worker process died (exit {worker.proc.exitcode})"))
                del pending[current]
                if not self._closed.is_set():
                    self._replace(index)
                return [pending[k] for k in sorted(pending)]
            if message is None:
                ran = time.monotonic() - started
                self._on_item(ran)
                # Its own doing when it had (nearly) its whole limit: a limit derived from the caller's deadline
                # itself ends with that deadline, a few ms of hand-over short.
                own_limit = not task.callers or ran >= task.timeout_s - max(0.05, 0.1 * task.timeout_s)
                self.kills += 1
                if self._on_kill is not None:
                    self._on_kill()
                log.warning("task over its %s after %.2fs: killing worker %d (pid %s)",
                            "limit" if own_limit else "caller's deadline", ran, index, worker.proc.pid)  # fmt: skip
                self._discard(index)
                limit = f"its own limit: {task.timeout_s:g}s"
                task.future.set_exception(
                    TaskTimeout(f"no result within {task.timeout_s:g}s; worker killed")
                    if own_limit
                    else DeadlinePassed(f"the deadline passed {ran:.2f}s into the task ({limit}); worker killed")
                )
                del pending[current]
                if not self._closed.is_set():
                    self._replace(index)
                return [pending[k] for k in sorted(pending)]
            i, ok, payload = message
            self._on_item(time.monotonic() - started)
            done = pending.pop(i)
            if ok:
                done.future.set_result(payload)
            else:
                done.future.set_exception(TaskFailed(payload))
            started = time.monotonic()
        return []

    @staticmethod
    def _receive(worker: _Worker, task: _Task, due: float) -> Any:
        """The worker's next answer, or None once `due` (monotonic) passes; raises _Abandoned when `task`, the
        one running, is cancelled and has run CANCEL_AFTER_S (EOFError/OSError when the worker died)."""
        while True:
            left = due - time.monotonic()
            if worker.conn.poll(max(0.0, min(left, CANCEL_AFTER_S))):
                return worker.conn.recv()
            if left <= CANCEL_AFTER_S:
                return None
            if task.future.abandoned:
                raise _Abandoned

    def close(self) -> None:
        """Stop accepting tasks, fail queued ones, stop the workers."""
        if self._closed.is_set():
            return
        self._closed.set()
        while True:
            try:
                task = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(task, _Task) and task.future.set_running_or_notify_cancel():
                task.future.set_exception(RuntimeError("pool closed"))
        while self._urgent:
            task = self._urgent.popleft()
            if task.future.set_running_or_notify_cancel():
                task.future.set_exception(RuntimeError("pool closed"))
        # Kill busy workers too: a slot waiting on a sympy blow-up would otherwise hold shutdown until its deadline.
        for worker in list(self._workers):
            if worker is not None and worker.proc.pid is not None:
                worker.proc.kill()  # its slot thread sees EOF and stops waiting
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(10)
        for worker in self._workers:
            if worker is not None:
                worker.kill()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
