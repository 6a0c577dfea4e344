"""The one exception tree of lego-proxy, shared by every package (the bottom layer).

The core raises these; nothing returns errors as values. Each wire adapter maps a
``LegoError`` to its own error shape in exactly one function (``error_body``), using the
``status`` and ``code`` carried here, so every protocol agrees on what went wrong.

    LegoError                      base; status 500, code "internal_error"
    ├── InvalidRequest             400  malformed body, wrong types, bad values
    │   ├── Unsupported            400  an option lego-proxy does not serve (n > 1, images, ...)
    │   └── ContextLengthExceeded  400  prompt (plus reserved output) over the budget
    ├── AuthenticationFailed       401  missing or unknown key
    ├── PermissionDenied           403  a key that cannot reach this endpoint
    ├── NotFound                   404  unknown run, session or route
    ├── MethodNotAllowed           405  a known route asked with another method
    ├── Conflict                   409  session already finished, run name taken
    ├── PayloadTooLarge            413  request body over the configured limit
    ├── Overloaded                 429  new turns held back (run paused); retry after a delay
    ├── BackendError               502  the SGLang backend answered with an error
    │   ├── BackendUnavailable     503  the backend cannot be reached
    │   └── WeightGroupFailed      502  a weight-update process group did not form, or a
    │                                   broadcast over it failed (kernel.weight_group)
    ├── BackendMisconfigured       500  a backend worker cannot serve what the proxy needs
    ├── RecorderError              500  the database refused a control-plane write
    │   └── RecorderUnavailable    503  nothing can make a turn durable, or the recorder is
    │                                   still catching up; retry after a while
    ├── ServerDidNotStart          500  a child server exited or never answered (kernel.process)
    ├── ConfigurationError         500  settings or surroundings a process cannot start with
    ├── PostgresUnavailable        500  no scratch Postgres here (recorder.scratch_postgres)
    ├── SandboxError               500  a sandbox could not be created or run
    └── TaskError                  500  a task directory is malformed (tasks.spec, tasks.pool)
        └── EnvSetupFailure        500  a task image could not be built: its setup failed

``BackendError.retryable`` tells adapters whether the harness may retry (it becomes the
in-band error's ``type``); the turn that hit it is recorded as failed either way.
``ContextLengthExceeded`` carries the prompt length and the limit when they are known, so
an adapter can say it in its protocol's own words (Anthropic's "prompt is too long").
"""

from __future__ import annotations


class LegoError(Exception):
    """Base of every error lego-proxy raises on purpose."""

    status: int = 500
    code: str = "internal_error"
    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if param is not None:
            self.param = param


class InvalidRequest(LegoError):
    status = 400
    code = "invalid_request_error"


class Unsupported(InvalidRequest):
    code = "unsupported_option"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        prompt_tokens: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class AuthenticationFailed(LegoError):
    status = 401
    code = "invalid_api_key"


class PermissionDenied(LegoError):
    status = 403
    code = "permission_denied"


class NotFound(LegoError):
    status = 404
    code = "not_found"


class MethodNotAllowed(LegoError):
    status = 405
    code = "method_not_allowed"


class Conflict(LegoError):
    status = 409
    code = "conflict"


class PayloadTooLarge(LegoError):
    status = 413
    code = "payload_too_large"


class Overloaded(LegoError):
    """New turns are held back (a run paused around a weight sync); ``retry_after_s``
    becomes the ``Retry-After`` header in the adapter's error response."""

    status = 429
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BackendError(LegoError):
    status = 502
    code = "backend_error"

    def __init__(
        self, message: str, *, retryable: bool = True, backend_status: int | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.backend_status = backend_status


class BackendUnavailable(BackendError):
    status = 503
    code = "backend_unavailable"


class WeightGroupFailed(BackendError):
    """A weight-update process group could not be joined, or a broadcast over it failed
    (a peer unreachable or gone, the timeout); the message is torch's."""

    code = "weight_group_failed"


class BackendMisconfigured(LegoError):
    """A worker's configuration (``/server_info``) rules out what the proxy must record,
    e.g. an MoE model served without routed-expert capture."""

    code = "backend_misconfigured"


class RecorderError(LegoError):
    status = 500
    code = "recorder_error"


class ConfigurationError(LegoError):
    """What a process was told to start with cannot work: the message says what to change
    (the command line prints it as one line and exits before starting anything)."""

    code = "configuration_error"


class RecorderUnavailable(RecorderError):
    status = 503
    code = "recorder_unavailable"


class SandboxError(LegoError):
    """A sandbox could not be created or run (the backend is missing, refused the spec,
    or its process died before the command ran). A trial that meets it is an
    ``env_setup_failure``, never a zero reward."""

    code = "sandbox_error"


class TaskError(LegoError):
    """A task directory is malformed (``task.json`` invalid, a patch or the repository
    missing) or its image could not be built; the message names the task and the cause."""

    code = "task_error"


class EnvSetupFailure(TaskError):
    """A task's image could not be built (its ``setup_command`` failed, the repository
    would not check out, the grading toolchain does not run in the sandbox). A trial of
    that task is an ``env_setup_failure``, never a zero reward; ``reason`` says why."""

    code = "env_setup_failure"

    def __init__(self, message: str, *, task_id: str, reason: str) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.reason = reason
