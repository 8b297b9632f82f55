"""The rollout worker inside the service: its engine calls, reward client and episode runner, built from a
RolloutService and its settings, and the thread that runs it (`run_worker`; the loop itself is worker.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from grpo.common.queue import RunQueue, connect, redacted
from grpo.common.registry import ReplicaRegistry
from grpo.common.reward_client import RewardClient
from grpo.rollout.engines.base import SamplingParams
from grpo.rollout.episodes.runner import EpisodeRunner
from grpo.rollout.episodes.spec import episode_rules
from grpo.rollout.episodes.tools import load_tools
from grpo.rollout.records import Generated
from grpo.rollout.request_checks import encode_prompts, sampling_params
from grpo.rollout.service import RolloutService
from grpo.rollout.settings import RolloutSettings
from grpo.rollout.stats import WorkerStats
from grpo.rollout.worker import RolloutWorker
from grpo.v1 import queue_pb2

log = logging.getLogger(__name__)


def service_generator(
    service: RolloutService, episodes: EpisodeRunner | None = None
) -> Callable[[Sequence[queue_pb2.PromptTask]], Generated]:
    """Generate a batch of tasks (identical sampling params, and episode rules) in-process; BadRequest (a
    ValueError) for bad tasks. Tasks with an EpisodeSpec run as multi-turn episodes on `episodes`."""

    def generate(tasks: Sequence[queue_pb2.PromptTask]) -> Generated:
        params = sampling_params(tasks[0].sampling, service.limits)
        if tasks[0].HasField("episode"):
            return generate_episodes(tasks, params)
        prompts = encode_prompts(service, [t.prompt for t in tasks], params.max_new_tokens)
        outputs, version, checksum = service.generate(prompts, params, source="worker")
        return Generated(
            [o.prompt_token_ids for o in outputs], [o.samples for o in outputs], version, checksum, decode=decode
        )

    def generate_episodes(tasks: Sequence[queue_pb2.PromptTask], params: SamplingParams) -> Generated:
        if episodes is None:
            raise ValueError("this worker runs no episodes: publish the task without `episode`")
        if any(t.prompt.prefix_token_ids for t in tasks):
            raise ValueError("an episode task cannot continue prompt.prefix_token_ids (value tasks are single-turn)")
        rules = episode_rules(tasks[0].episode, params.max_new_tokens, set(episodes.tools))
        prompts = encode_prompts(service, [t.prompt for t in tasks], rules.max_total_tokens)
        batch = episodes.run(prompts, rules, params)
        return Generated(prompts, list(batch.episodes), batch.weight_version, batch.weight_checksum, decode=decode)

    def decode(token_ids: list[int]) -> str:  # as the engines decode a completion's text
        return str(service.tokenizer.decode(token_ids, skip_special_tokens=True))

    return generate


def episode_runner(
    service: RolloutService, settings: RolloutSettings, reward: RewardClient, stop: threading.Event
) -> EpisodeRunner:
    """The worker's episode runner: the built-in python tool through `reward`, plug-ins from settings."""
    return EpisodeRunner(
        lambda prompts, params: service.generate(prompts, params, source="worker"),
        service.tokenizer,
        load_tools(settings.tool_plugins, reward.execute),
        settings.tool_concurrency,
        stopping=stop.is_set,
    )


def reward_client(settings: RolloutSettings, stop: threading.Event | None = None) -> RewardClient:
    """The worker's client of the reward service at `settings.reward_addr` (TLS when a CA file is set); `stop`
    ends its retries at once (a stop during a reward outage is prompt, not up to reward_retry_budget_s)."""
    if not settings.reward_addr:
        raise ValueError("the worker loop needs --reward-addr (host:port of the reward gRPC API)")
    return RewardClient(
        settings.reward_addr,
        token=settings.reward_token,
        timeout_s=settings.reward_timeout_s,
        retry_budget_s=settings.reward_retry_budget_s,
        ca_file=settings.reward_tls_ca_file,
        stop=stop,
    )


def run_worker(service: RolloutService, settings: RolloutSettings, stop_event: threading.Event) -> None:
    """The service's worker thread: consume tasks from `settings.redis_url` until `stop_event` is set."""
    if not settings.redis_url or not settings.reward_addr:
        raise ValueError("the worker loop needs --redis-url and --reward-addr (host:port of the reward gRPC API)")
    # Blocking reads wait worker_block_ms; the socket deadline must outlast them.
    client = connect(settings.redis_url, socket_timeout_s=settings.worker_block_ms / 1000 + 5.0)
    reward = reward_client(settings, stop_event)
    episodes = episode_runner(service, settings, reward, stop_event)
    worker = RolloutWorker(
        service_generator(service, episodes),
        lambda: (service.version, service.checksum),
        reward.score,
        RunQueue(client, settings.run),
        ReplicaRegistry(client, settings.run, ttl_s=settings.registry_ttl_s),
        replica_id=settings.replica_id,
        address=f"{settings.advertise_host}:{service.grpc_port or settings.grpc_port}",
        options=settings,
        data_port=service.data_port.port if service.data_port is not None else 0,
        stats=WorkerStats(service.metrics.registry),
        on_written=service.record_task,
        broken=lambda: service.broken,
        max_context=service.engine.max_context,
    )
    log.info(
        "worker %s: run %s on %s, reward service %s",
        settings.replica_id,
        settings.run,
        redacted(settings.redis_url),
        settings.reward_addr,
    )
    try:
        worker.run(stop_event)
    finally:
        episodes.close()
        reward.close()
        client.close()
