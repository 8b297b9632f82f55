"""What `grpo up` and `grpo demo` check before they start anything, each answer one line: the Redis URL (its form,
that a Redis answers there, whose keys it already holds) and whether the model hub can be reached at all.

Without these checks the services found out themselves, late: an unreachable Redis surfaced after the trainer's
outage retries (2–3 minutes) as a traceback, and a hub id with no network after huggingface_hub's five retries
(54 s, 22 warning lines) per section.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger(__name__)
KEYS_LOOKED_AT = 10_000  # the other runs' names come from a bounded SCAN: a big shared Redis is not walked whole


def shown_url(url: str) -> str:
    """The URL without its credentials (a mistyped URL must not put a password into the logs)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url.rpartition("@")[2]


def redis_url_problem(url: str) -> str | None:
    """The services' wording for a URL they would refuse (grpo.common.settings), without their `redis_url ` (the
    caller names the setting: `redis_url:` in a stack file, `--redis-url` for the demo); None for a good URL."""
    from grpo.common.settings import redis_url_problem as services_wording

    problem = services_wording(url)
    return problem.removeprefix("redis_url ") if problem else None


def redis_problem(url: str, run_id: str, timeout_s: float = 3.0, *, look_for_other_runs: bool = True) -> str | None:
    """One line when no Redis answers at `url` within `timeout_s`, or it refuses us; None when one does. A Redis
    that holds another run's keys is only warned about: runs are kept apart by their keys, but the services'
    default (127.0.0.1:6379) may well be someone else's Redis, and the user should know whose it is."""
    from grpo.common.queue import connect

    began = time.monotonic()
    client = connect(url, socket_timeout_s=timeout_s, connect_timeout_s=timeout_s)
    try:
        client.ping()
        others = other_runs(client, run_id) if look_for_other_runs else []
    except Exception as exc:  # redis-py's connection, auth and protocol errors, and OSError beneath them
        from redis.exceptions import AuthenticationError, ResponseError

        seconds = time.monotonic() - began
        if isinstance(exc, AuthenticationError | ResponseError):
            return f"redis_url {shown_url(url)}: the Redis there refuses us ({exc}); check the URL's user and password"
        return (
            f"redis_url {shown_url(url)}: no Redis answers there ({exc}, after {seconds:.1f} s); start one there, or "
            "set redis_url: null to have a private redis-server started"
        )
    finally:
        client.close()
    if others:
        log.warning(
            "the Redis at %s holds the keys of another run: %s; this run (%s) keeps to its own keys, but check that "
            "this Redis is meant for it (redis_url: null starts a private one)",
            shown_url(url), others[:5], run_id,
        )  # fmt: skip
    return None


def other_runs(client: Any, run_id: str) -> list[str]:
    """The run names of the `grpo:{<run>}:...` keys in Redis besides `run_id`'s (sorted; from a bounded SCAN)."""
    found: set[str] = set()
    for i, key in enumerate(client.scan_iter(match="grpo:{*", count=1000)):
        if i >= KEYS_LOOKED_AT:
            break
        name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        found.add(name.partition("{")[2].partition("}")[0])
    return sorted(found - {run_id})


def hub_problem(timeout_s: float = 3.0) -> str | None:
    """None when the model hub answers; else why not, in one line. Asked once, with a deadline of its own: without
    network huggingface_hub retries each file five times (54 s) before it gives up, and a name lookup that hangs
    (no DNS server answering) has no timeout at all, hence the thread."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        return None  # the cache is all there is: check_model asks it alone, at once
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout_s)
            outcome.append(None)
        except Exception as exc:  # httpx's connect, TLS, proxy and timeout errors, each its own class
            outcome.append(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)

    asker = threading.Thread(target=ask, name="hub-check", daemon=True)
    asker.start()
    asker.join(timeout_s + 1.0)
    if not outcome:
        return f"the hub ({constants.ENDPOINT}) did not answer within {timeout_s:.0f} s"
    reason = outcome[0]
    return None if reason is None else f"the hub ({constants.ENDPOINT}) cannot be reached ({reason})"
