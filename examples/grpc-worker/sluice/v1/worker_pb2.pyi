from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerMessage(_message.Message):
    __slots__ = ("subscribe", "heartbeat", "outcome", "drain")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    heartbeat: Heartbeat
    outcome: Outcome
    drain: Drain
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., outcome: _Optional[_Union[Outcome, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("queues", "kinds", "slots", "worker_name")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedScalarFieldContainer[str]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    worker_name: str
    def __init__(self, queues: _Optional[_Iterable[str]] = ..., kinds: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., worker_name: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobRef]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobRef, _Mapping]]] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job_id", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("job_id", "attempt", "succeeded", "retry", "fail", "cancelled")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    succeeded: Succeeded
    retry: Retry
    fail: Fail
    cancelled: Cancelled
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., succeeded: _Optional[_Union[Succeeded, _Mapping]] = ..., retry: _Optional[_Union[Retry, _Mapping]] = ..., fail: _Optional[_Union[Fail, _Mapping]] = ..., cancelled: _Optional[_Union[Cancelled, _Mapping]] = ...) -> None: ...

class Succeeded(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Retry(_message.Message):
    __slots__ = ("error", "delay_ms")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    error: str
    delay_ms: int
    def __init__(self, error: _Optional[str] = ..., delay_ms: _Optional[int] = ...) -> None: ...

class Fail(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class Cancelled(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SidecarMessage(_message.Message):
    __slots__ = ("subscribed", "job", "cancel", "lease_lost", "refused", "draining")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    LEASE_LOST_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    job: Job
    cancel: Cancel
    lease_lost: LeaseLost
    refused: Refused
    draining: Draining
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., lease_lost: _Optional[_Union[LeaseLost, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ..., draining: _Optional[_Union[Draining, _Mapping]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("owner", "queues", "slots", "kinds")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, owner: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "queue", "kind", "payload_json", "attempt", "max_attempts", "deadline_unix_ms", "heartbeat_within_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_WITHIN_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    queue: str
    kind: str
    payload_json: str
    attempt: int
    max_attempts: int
    deadline_unix_ms: int
    heartbeat_within_ms: int
    def __init__(self, job_id: _Optional[str] = ..., queue: _Optional[str] = ..., kind: _Optional[str] = ..., payload_json: _Optional[str] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., deadline_unix_ms: _Optional[int] = ..., heartbeat_within_ms: _Optional[int] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("job_id", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class LeaseLost(_message.Message):
    __slots__ = ("job_id", "attempt", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("job_id", "attempt", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Draining(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
