"""The one exception hierarchy of fastllm. Every error a user can cause is one of these.

    FastllmError                      base; `.http_status` and `.error_type` map it to an API error
    ├── ConfigError                   bad settings / CLI flags                              (400)
    │   └── AlertRuleError            (alerts.errors) a rule file that does not parse / validate
    ├── ModelLoadError                checkpoint problems: missing dir/config, unsupported
    │   │                             architecture, missing/mismatched tensor, corrupt file  (500*)
    │   └── UnsafeCheckpointError     a pickle that would run code, refused                 (400)
    ├── InvalidRequestError           bad request parameters, prompt beyond the context     (400)
    ├── AuthenticationError           missing / wrong API key                               (401)
    ├── PermissionDeniedError         missing / wrong admin token                           (403)
    ├── ModelNotFoundError            unknown model name                                    (404)
    ├── ConflictError                 valid request the current state forbids (no canary)   (409)
    ├── Overloaded                    admission refused; carries retry_after_s              (429)
    ├── ServiceUnavailable            not ready / draining                                  (503)
    ├── RequestTimeout                a request ran past its deadline                       (504)
    ├── RequestCancelled              the request was cancelled (client went away)          (499)
    ├── EngineInternalError           a model step failed; its requests fail, engine lives  (500)
    ├── StorageError                  (storage.errors) database unreachable / not migrated  (503)
    └── AllocatorError                misuse of a memory block
        ├── DoubleReleaseError
        ├── UseAfterReleaseError
        └── ForeignBlockError

(*) a model that fails to load is an operator error, not a client one; the server answers 503.

Each package keeps its own errors at home (alerts.errors, storage.errors); they derive from the
classes here, so the server maps every one of them the same way.
"""

from __future__ import annotations


class FastllmError(Exception):
    """Base of every fastllm error."""

    http_status = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ConfigError(FastllmError):
    http_status = 400
    error_type = "invalid_request_error"


class ModelLoadError(FastllmError):
    http_status = 503
    error_type = "model_load_error"


class UnsafeCheckpointError(ModelLoadError):
    http_status = 400
    error_type = "invalid_request_error"


class InvalidRequestError(FastllmError):
    http_status = 400
    error_type = "invalid_request_error"


class AuthenticationError(FastllmError):
    http_status = 401
    error_type = "authentication_error"


class PermissionDeniedError(FastllmError):
    http_status = 403
    error_type = "permission_error"


class ModelNotFoundError(FastllmError):
    http_status = 404
    error_type = "not_found_error"


class ConflictError(FastllmError):
    """A well-formed request that the server's current state rules out (e.g. no canary)."""

    http_status = 409
    error_type = "conflict_error"


class Overloaded(FastllmError):
    http_status = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, code: str | None = None):
        super().__init__(message, code=code or "overloaded")
        self.retry_after_s = retry_after_s


class ServiceUnavailable(FastllmError):
    http_status = 503
    error_type = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, code: str | None = None):
        super().__init__(message, code=code or "unavailable")
        self.retry_after_s = retry_after_s


class RequestTimeout(FastllmError):
    http_status = 504
    error_type = "timeout_error"


class RequestCancelled(FastllmError):
    http_status = 499
    error_type = "cancelled"


class EngineInternalError(FastllmError):
    """A step of the engine failed (e.g. an exception in the model); its requests fail with it."""

    http_status = 500
    error_type = "internal_error"


class AllocatorError(FastllmError):
    """Misuse of an allocator block: a programming error inside the stack, typed for tests."""


class DoubleReleaseError(AllocatorError):
    pass


class UseAfterReleaseError(AllocatorError):
    pass


class ForeignBlockError(AllocatorError):
    pass
