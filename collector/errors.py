"""The collector's one error model.

Every failure is attributed to one boundary, translated there with ``raise ... from``, and
recorded once per episode. Truncation and malformed tool calls are *not* errors: they are
data (a `Turn` with length signals, a `ToolCall` with status MALFORMED) and typed stop
reasons. Messages never carry secrets: API keys, headers and raw model fragments stay out.

Every exception class the package defines is named here (tests/test_errors.py finds them
all in the source and fails on one that is missing); a class defined outside this module
names its module (relative to `collector`)::

    CollectorError
    ├── ConfigError                 bad config file, field or value (one line, names it)
    ├── ProviderError               the model call failed; the episode ends as `error`
    │   ├── ProviderUnavailable     retryable failures that outlived their retries
    │   │                           (transport, timeout, 408/409/429/5xx/529, broken stream)
    │   │   └── UnparsedArguments   providers.servercut: a 5xx saying the arguments failed to
    │   │                           parse; deterministic, so not retried
    │   ├── ContextOverflow         the prompt no longer fits the model's context window
    │   ├── QuotaExhausted          billing / quota / credits: fatal for the run
    │   ├── RequestRejected         any other 4xx (auth, bad request, not found)
    │   └── ProtocolViolation       a 200 reply that is not the transport's wire format
    ├── EnvironmentFailure          the environment (not a tool call) crashed
    │   ├── ImageBuildFailed        a task's image did not build (Harbor sandboxes)
    │   ├── SandboxStartFailed      the sandbox did not start (or no daemon answers)
    │   ├── SandboxLost             the sandbox or its daemon went away mid-episode
    │   ├── VerifierTimeout         the task's verifier outlived its timeout
    │   ├── VerifierCrashed         the verifier failed without writing a reward
    │   ├── RewardMissing           the verifier exited 0 and wrote no reward
    │   └── RewardUnparsable        the reward file holds no number in [0, 1]
    └── OutputError                 the run directory cannot be written, read or trusted
        ├── ShardError              record.shards: a shard cannot be read ("{path}: {reason}")
        ├── NotARunDirectory        storage.manifest: the path has no manifest at all
        ├── CommitIncomplete        storage.runstore: a commit left some episodes out (named)
        ├── LockLost                storage.runstore: the run's lock was taken mid-run
        ├── RecordInDoubt           storage.commit: a commit record may or may not have landed
        ├── FollowError             analysis.follow: the run cannot be followed from this cursor
        └── PreconditionFailed      storage.s3client: S3 refused a conditional write (412/409)

Outside the tree, each for a contract of its own (never recorded as an episode's error)::

    ToolError                       envs.toolkit: raised by a tool to answer with an error result
    ToolArgumentError (ValueError)  envs.schemas: arguments do not match the tool's schema
    ToolSchemaError (ValueError)    envs.schemas: a tool's schema failed while checking a call
    ToolThreadsExhausted (RuntimeError) envs.toolkit: every tool thread is held by a stuck call
    UnusableToolMethod (ValueError) envs.trlschema: a TRL class's method TRL could not make a tool
    ActionRefused                   envs.openenv_session: an OpenEnv server refused an action as invalid
    Interrupted (KeyboardInterrupt) run.signals: SIGINT/SIGTERM during a run; unwinds like Ctrl-C
    WorkerFailed                    run.pool: our own code raised inside a worker (the driver's seam)
    WorkerLost                      run.pool: a worker or its node is gone (the driver's seam)
    ReplacedNotDurable (OSError)    storage.manifest: a file was replaced, its fsync failed
    SimError                        sim.errors: a request the simulated server refuses
    BadRequest                      harness.request: a harness's body the gateway cannot read (400)
    Refused                         harness.request: an unknown or ended episode's token (403)
    HarnessFailed                   harness.runner: the harness crashed or its reward is unreadable
    Failure                         episode.state: internal; ends an episode as `error`
    _Exit                           envs.local_sandbox: internal; the in-process shell's `exit`
    _Stale                          providers.transport: internal; a reused connection was closed
    _Clash                          storage.mirror: internal; a key that cannot be a file of its own
    _Failed                         storage.s3client: internal; a request failed after every retry

Every `CollectorError` is picklable (its ``args`` rebuild it), so it crosses Ray boundaries
intact.
"""

from __future__ import annotations


class CollectorError(Exception):
    """Base of every error the collector raises on purpose."""


class ConfigError(CollectorError):
    """A config file, field or value is wrong. The message is one line naming it."""


class ProviderError(CollectorError):
    """A model call failed for a reason that is not the model's doing.

    `status` is the HTTP status when there was one; `retryable` says whether the failure
    class is retried (the adapter has already spent its retries when this escapes).
    """

    retryable: bool = False
    retry_after_s: float | None = None
    """The server's requested wait (`retry-after-ms`, `retry-after`, Gemini `RetryInfo`), if any."""
    retries: tuple[str, ...] = ()
    """Causes of the retries spent before this failure escaped (`collector.providers.http`)."""

    def __init__(self, message: str, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, status, retry_after_s)
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return self.message if self.status is None else f"{self.message} (HTTP {self.status})"


class ProviderUnavailable(ProviderError):
    """Transport errors, timeouts, rate limits, overloads, 5xx and dropped streams."""

    retryable = True


class ContextOverflow(ProviderError):
    """The request exceeds the model's context window. Not retried: an episode-level outcome."""


class QuotaExhausted(ProviderError):
    """Quota, spend cap or credits exhausted. Not retried: it is fatal for the whole run."""


class RequestRejected(ProviderError):
    """Any other 4xx: authentication, permissions, an invalid request. Not retried."""


class ProtocolViolation(ProviderError):
    """A successful status with a body that is not the transport's wire format."""

    retryable = True


class EnvironmentFailure(CollectorError):
    """The environment itself crashed (task set-up or grading); the episode ends as `error`."""


class ImageBuildFailed(EnvironmentFailure):
    """A sandbox image did not build (its Dockerfile failed, or the build outlived its timeout)."""


class SandboxStartFailed(EnvironmentFailure):
    """A sandbox could not be started: the container runtime refused, or is not running."""


class SandboxLost(EnvironmentFailure):
    """A running sandbox (or its daemon) went away during the episode."""


class VerifierTimeout(EnvironmentFailure):
    """A task's verifier ran past its timeout: the task's fault, not the model's."""


class VerifierCrashed(EnvironmentFailure):
    """A verifier exited non-zero without writing a reward."""


class RewardMissing(EnvironmentFailure):
    """A verifier exited 0 but wrote neither reward file."""


class RewardUnparsable(EnvironmentFailure):
    """The reward file holds text, NaN, or a number outside [0, 1]."""


class OutputError(CollectorError):
    """The run directory cannot be written, is corrupt, or belongs to another config."""
