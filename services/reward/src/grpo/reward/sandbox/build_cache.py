"""Built programs kept between requests: a checker (or a candidate program) is compiled once per (language,
source, toolchain) and its artifacts reused by every later request that sends the same source.

Why: RL data sends one testlib checker with thousands of submissions, and a C++ testlib checker takes 4.5 s to
build on a quiet machine, 15-21 s under load. The namespace sandbox's `Held` (zygote_client.py) is a different cache,
one level down: each worker keeps the bytes of recent built programs in its `/held` tmpfs so that the runs after
the first send only a name. It is keyed by the bytes object's identity, so it only helps across requests when
they pass the very same object; this cache returns the same objects for the same build, which lets `Held` skip
the transfer too. Neither replaces the other: `Held` saves a pipe copy per run per worker, this a build.

Concurrency: one build per key at a time (single flight). Requests that want a build already under way wait for
it and share its outcome, an exception included; nothing is kept of a build that raised.

What is kept: a successful build until the LRU evicts it (by count and by bytes); a compiler's own rejection of
the source (it ran and exited > 0: the same source and toolchain fail the same way) for `error_ttl_s` only, so that
a broken checker sent with every submission costs one build a minute, not one per request, and a toolchain fixed
underneath is picked up soon. Never kept: a sandbox_error, a build killed (deadline, CPU, a signal, the OOM killer)
or one that produced nothing; those may be the machine's doing, and the next request builds again.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grpo.reward.sandbox.base import ExecResult
from grpo.reward.sandbox.languages import TOOLCHAINS, build, header

if TYPE_CHECKING:
    from grpo.reward.sandbox.base import Sandbox

log = logging.getLogger(__name__)

Outcome = tuple[ExecResult | None, dict[str, bytes]]  # languages.build's: (the failure or None, the artifacts)
Builder = Callable[["Sandbox", str, str], Outcome]
Key = tuple[str, str, tuple[object, ...]]  # (language, sha256 of the source, toolchain identity)
# A compiler that exited > 0 because something killed its own child (gcc's driver, `go build`) is the machine's
# doing, not the source's: not kept.
KILLED_MARKS = ("Killed signal terminated program", "internal compiler error", "signal: killed")


@dataclass(frozen=True)
class Entry:
    """One kept build: its outcome, its cost in bytes, and (a compile error) when it stops counting."""

    outcome: Outcome
    size: int
    expires: float | None = None  # monotonic seconds; None: until evicted


def source_digest(code: str) -> str:
    """sha256 of the source. surrogatepass: a lone surrogate still has a key; the build itself refuses it."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


@functools.cache
def _headers_digest(language: str) -> str:
    """The shared headers written beside a build (testlib.h): a changed header is another toolchain."""
    chain = TOOLCHAINS[language]
    return hashlib.sha256(b"".join(header(name) for name in chain.headers)).hexdigest()


def _stat(path: str) -> tuple[int, int, int]:
    try:
        st = Path(path).stat()
    except OSError:
        return (-1, -1, -1)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def toolchain_identity(language: str, tools: dict[str, str]) -> tuple[object, ...]:
    """What a build's output depends on besides its source: the compile line, the shared headers, and each tool's
    real path with its file's mtime, size and inode, read on every lookup (a few µs), so that a compiler upgraded
    in place, even under the same path, builds afresh. (A header or library upgraded without touching the
    compiler's own file is not seen: restart the service after such an upgrade.)"""
    chain = TOOLCHAINS[language]
    return (chain.compile, _headers_digest(language), *((n, p, *_stat(p)) for n, p in sorted(tools.items())))


def compiled(language: str) -> bool:
    """Whether `language` has a build step (nothing to keep for an interpreted one)."""
    chain = TOOLCHAINS.get(language)
    return chain is not None and bool(chain.compile)


def outcome_size(outcome: Outcome) -> int:
    failed, files = outcome
    return sum(map(len, files.values())) + (len(failed.stdout) + len(failed.stderr) if failed else 0)


def keep_for(outcome: Outcome, error_ttl_s: float) -> float | None:
    """How long an outcome is worth keeping: inf for a build, error_ttl_s for the compiler's own rejection of
    the source, None (not at all) for anything that may be the machine's doing (see the module's doc)."""
    failed, files = outcome
    if failed is None:
        return float("inf") if files else None
    rejected = failed.status == "compile_error" and failed.exit_code is not None and failed.exit_code > 0
    if not rejected or any(mark in failed.stderr for mark in KILLED_MARKS):
        return None
    return error_ttl_s if error_ttl_s > 0 else None


class BuildCache:
    """An LRU of builds, bounded by count and bytes, with one build per key in flight. Thread-safe.

    `on_lookup(outcome)` hears "hit" (kept), "miss" (built by this caller) or "shared" (waited for another
    caller's build of the same); `on_evict()` hears each eviction. `max_entries` 0 turns keeping off (every
    lookup builds, concurrent ones still share).
    """

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        error_ttl_s: float = 60.0,
        builder: Builder = build,
        clock: Callable[[], float] = time.monotonic,
        on_lookup: Callable[[str], None] | None = None,
        on_evict: Callable[[], None] | None = None,
    ) -> None:
        self.max_entries, self.max_bytes, self.error_ttl_s = max_entries, max_bytes, error_ttl_s
        self._builder, self._clock = builder, clock
        self._on_lookup = on_lookup or (lambda outcome: None)
        self._on_evict = on_evict or (lambda: None)
        self._entries: OrderedDict[Key, Entry] = OrderedDict()
        self._building: dict[Key, Future[Outcome]] = {}
        self._lock = threading.Lock()
        self.size = 0  # bytes kept
        self.builds = 0  # builds started (misses)

    def __len__(self) -> int:
        return len(self._entries)

    def build(self, sandbox: Sandbox, language: str, code: str) -> Outcome:
        """`languages.build(sandbox, language, code)`, or what an earlier or concurrent one of the same gave."""
        if not compiled(language):
            return self._builder(sandbox, language, code)
        key: Key = (language, source_digest(code), toolchain_identity(language, sandbox.languages[language]))
        with self._lock:
            entry = self._fresh(key)
            if entry is not None:
                self._on_lookup("hit")
                return entry.outcome
            pending = self._building.get(key)
            if pending is None:
                mine: Future[Outcome] = Future()
                self._building[key] = mine
                self.builds += 1
        if pending is not None:
            self._on_lookup("shared")
            return pending.result()
        self._on_lookup("miss")
        return self._build_once(key, mine, sandbox, language, code)

    def _build_once(self, key: Key, mine: Future[Outcome], sandbox: Sandbox, language: str, code: str) -> Outcome:
        """Build, keep what is worth keeping, then release the callers waiting on `mine`."""
        started = self._clock()
        try:
            outcome = self._builder(sandbox, language, code)
        except BaseException as exc:
            with self._lock:
                del self._building[key]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._building[key]
            self._keep(key, outcome)
        mine.set_result(outcome)
        failed = outcome[0]
        status = failed.status if failed else "ok"
        log.debug("built %s %s in %.2fs: %s", language, key[1][:12], self._clock() - started, status)
        return outcome

    def _fresh(self, key: Key) -> Entry | None:
        """The kept entry of `key`, made most recent; an expired one is dropped. Under the lock."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires is not None and self._clock() >= entry.expires:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry

    def _keep(self, key: Key, outcome: Outcome) -> None:
        """Keep `outcome` (if it is worth it and fits), evicting the least recently used. Under the lock."""
        ttl = keep_for(outcome, self.error_ttl_s)
        size = outcome_size(outcome)
        if ttl is None or self.max_entries <= 0 or size > self.max_bytes:
            return
        expires = None if ttl == float("inf") else self._clock() + ttl
        if key in self._entries:  # cannot happen while one build per key runs; keeps `size` right if it did
            self._drop(key)
        self._entries[key] = Entry(outcome, size, expires)
        self.size += size
        while len(self._entries) > self.max_entries or self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self._on_evict()

    def _drop(self, key: Key) -> None:
        self.size -= self._entries.pop(key).size


@dataclass
class BuildCaches:
    """A sandbox's build caches, kept apart so that a stream of distinct candidate programs cannot evict the
    checkers: `checkers` (required: one checker serves thousands of requests) and `programs` (a candidate sent
    again: a retried request, the same code in several test batches, a GRPO group's identical samples)."""

    checkers: BuildCache
    programs: BuildCache


def caches_of(sandbox: Sandbox) -> BuildCaches | None:
    """The sandbox's build caches; None for a sandbox outside the service (tests, benchmarks), which builds each
    time, as before."""
    return getattr(sandbox, "build_caches", None)


def build_checker(sandbox: Sandbox, language: str, code: str) -> Outcome:
    """`languages.build` of a checker, through the sandbox's checker cache when it has one."""
    caches = caches_of(sandbox)
    return caches.checkers.build(sandbox, language, code) if caches else build(sandbox, language, code)


def build_program(sandbox: Sandbox, language: str, code: str) -> Outcome:
    """`languages.build` of a candidate program, through the sandbox's program cache when it has one."""
    caches = caches_of(sandbox)
    return caches.programs.build(sandbox, language, code) if caches else build(sandbox, language, code)
