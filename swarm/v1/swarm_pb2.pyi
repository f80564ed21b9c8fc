from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Sampling(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class PlanSwarmRequest(_message.Message):
    __slots__ = ("config_yaml",)
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    def __init__(self, config_yaml: _Optional[str] = ...) -> None: ...

class PlanSwarmResponse(_message.Message):
    __slots__ = ("plan_json", "table", "explanation", "predicted_tokens_per_s")
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    plan_json: str
    table: str
    explanation: str
    predicted_tokens_per_s: float
    def __init__(self, plan_json: _Optional[str] = ..., table: _Optional[str] = ..., explanation: _Optional[str] = ..., predicted_tokens_per_s: _Optional[float] = ...) -> None: ...

class AgentGroupSpec(_message.Message):
    __slots__ = ("name", "count", "context", "system_prompt", "tasks", "inputs_from", "max_new_tokens", "sampling")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FROM_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    context: int
    system_prompt: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    inputs_from: str
    max_new_tokens: int
    sampling: Sampling
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., context: _Optional[int] = ..., system_prompt: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ..., inputs_from: _Optional[str] = ..., max_new_tokens: _Optional[int] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ...) -> None: ...

class WorkerSpec(_message.Message):
    __slots__ = ("name", "kind", "device", "memory", "calibration")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    device: str
    memory: str
    calibration: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., device: _Optional[str] = ..., memory: _Optional[str] = ..., calibration: _Optional[str] = ...) -> None: ...

class SwarmSpec(_message.Message):
    __slots__ = ("name", "model_path", "agents", "workers", "kv_formats", "threads")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    KV_FORMATS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    name: str
    model_path: str
    agents: _containers.RepeatedCompositeFieldContainer[AgentGroupSpec]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerSpec]
    kv_formats: _containers.RepeatedScalarFieldContainer[str]
    threads: int
    def __init__(self, name: _Optional[str] = ..., model_path: _Optional[str] = ..., agents: _Optional[_Iterable[_Union[AgentGroupSpec, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerSpec, _Mapping]]] = ..., kv_formats: _Optional[_Iterable[str]] = ..., threads: _Optional[int] = ...) -> None: ...

class LaunchSwarmRequest(_message.Message):
    __slots__ = ("config_yaml", "spec")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    spec: SwarmSpec
    def __init__(self, config_yaml: _Optional[str] = ..., spec: _Optional[_Union[SwarmSpec, _Mapping]] = ...) -> None: ...

class LaunchSwarmResponse(_message.Message):
    __slots__ = ("swarm", "plan_json")
    SWARM_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    swarm: SwarmInfo
    plan_json: str
    def __init__(self, swarm: _Optional[_Union[SwarmInfo, _Mapping]] = ..., plan_json: _Optional[str] = ...) -> None: ...

class StopSwarmRequest(_message.Message):
    __slots__ = ("swarm",)
    SWARM_FIELD_NUMBER: _ClassVar[int]
    swarm: str
    def __init__(self, swarm: _Optional[str] = ...) -> None: ...

class StopSwarmResponse(_message.Message):
    __slots__ = ("swarm",)
    SWARM_FIELD_NUMBER: _ClassVar[int]
    swarm: SwarmInfo
    def __init__(self, swarm: _Optional[_Union[SwarmInfo, _Mapping]] = ...) -> None: ...

class ListSwarmsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SwarmInfo(_message.Message):
    __slots__ = ("name", "state", "agents", "workers", "tokens_generated", "started_unix", "error", "agent_names")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAMES_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    agents: int
    workers: int
    tokens_generated: int
    started_unix: float
    error: str
    agent_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., agents: _Optional[int] = ..., workers: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., started_unix: _Optional[float] = ..., error: _Optional[str] = ..., agent_names: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSwarmsResponse(_message.Message):
    __slots__ = ("swarms",)
    SWARMS_FIELD_NUMBER: _ClassVar[int]
    swarms: _containers.RepeatedCompositeFieldContainer[SwarmInfo]
    def __init__(self, swarms: _Optional[_Iterable[_Union[SwarmInfo, _Mapping]]] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("swarm", "agent", "group", "new_agent", "messages", "max_tokens", "sampling", "stop", "idempotency_key", "deadline_s")
    SWARM_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NEW_AGENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    swarm: str
    agent: str
    group: str
    new_agent: bool
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    max_tokens: int
    sampling: Sampling
    stop: _containers.RepeatedScalarFieldContainer[str]
    idempotency_key: str
    deadline_s: float
    def __init__(self, swarm: _Optional[str] = ..., agent: _Optional[str] = ..., group: _Optional[str] = ..., new_agent: _Optional[bool] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[Sampling, _Mapping]] = ..., stop: _Optional[_Iterable[str]] = ..., idempotency_key: _Optional[str] = ..., deadline_s: _Optional[float] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "swarm", "agent", "state", "tokens", "text", "finish_reason", "error", "worker", "kv_format", "created_unix", "time_to_first_token_s", "duration_s", "prompt_tokens", "idempotency_key")
    ID_FIELD_NUMBER: _ClassVar[int]
    SWARM_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    KV_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    id: str
    swarm: str
    agent: str
    state: str
    tokens: int
    text: str
    finish_reason: str
    error: str
    worker: str
    kv_format: str
    created_unix: float
    time_to_first_token_s: float
    duration_s: float
    prompt_tokens: int
    idempotency_key: str
    def __init__(self, id: _Optional[str] = ..., swarm: _Optional[str] = ..., agent: _Optional[str] = ..., state: _Optional[str] = ..., tokens: _Optional[int] = ..., text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., error: _Optional[str] = ..., worker: _Optional[str] = ..., kv_format: _Optional[str] = ..., created_unix: _Optional[float] = ..., time_to_first_token_s: _Optional[float] = ..., duration_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class StreamJobRequest(_message.Message):
    __slots__ = ("job_id", "offset", "cancel_job_on_disconnect")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    CANCEL_JOB_ON_DISCONNECT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    offset: int
    cancel_job_on_disconnect: bool
    def __init__(self, job_id: _Optional[str] = ..., offset: _Optional[int] = ..., cancel_job_on_disconnect: _Optional[bool] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("offset", "token_ids", "pieces", "done", "job")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    offset: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    pieces: _containers.RepeatedScalarFieldContainer[str]
    done: bool
    job: Job
    def __init__(self, offset: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., pieces: _Optional[_Iterable[str]] = ..., done: _Optional[bool] = ..., job: _Optional[_Union[Job, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("swarm", "state", "limit")
    SWARM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    swarm: str
    state: str
    limit: int
    def __init__(self, swarm: _Optional[str] = ..., state: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetPlacementRequest(_message.Message):
    __slots__ = ("swarm",)
    SWARM_FIELD_NUMBER: _ClassVar[int]
    swarm: str
    def __init__(self, swarm: _Optional[str] = ...) -> None: ...

class WorkerPlacement(_message.Message):
    __slots__ = ("worker", "device", "kind", "kv_k", "kv_v", "agents", "kv_bytes_budget", "kv_bytes_reserved", "kv_bytes_used", "predicted_tokens_per_s", "measured_tokens_per_s", "node_id", "queue_depth", "alive", "sessions", "lifecycle")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KV_K_FIELD_NUMBER: _ClassVar[int]
    KV_V_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_BUDGET_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_RESERVED_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_FIELD_NUMBER: _ClassVar[int]
    worker: str
    device: str
    kind: str
    kv_k: str
    kv_v: str
    agents: _containers.RepeatedScalarFieldContainer[str]
    kv_bytes_budget: int
    kv_bytes_reserved: int
    kv_bytes_used: int
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    node_id: str
    queue_depth: int
    alive: bool
    sessions: _containers.RepeatedCompositeFieldContainer[SessionState]
    lifecycle: Lifecycle
    def __init__(self, worker: _Optional[str] = ..., device: _Optional[str] = ..., kind: _Optional[str] = ..., kv_k: _Optional[str] = ..., kv_v: _Optional[str] = ..., agents: _Optional[_Iterable[str]] = ..., kv_bytes_budget: _Optional[int] = ..., kv_bytes_reserved: _Optional[int] = ..., kv_bytes_used: _Optional[int] = ..., predicted_tokens_per_s: _Optional[float] = ..., measured_tokens_per_s: _Optional[float] = ..., node_id: _Optional[str] = ..., queue_depth: _Optional[int] = ..., alive: _Optional[bool] = ..., sessions: _Optional[_Iterable[_Union[SessionState, _Mapping]]] = ..., lifecycle: _Optional[_Union[Lifecycle, _Mapping]] = ...) -> None: ...

class SessionState(_message.Message):
    __slots__ = ("agent", "state", "where", "kv_bytes", "tokens")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    state: str
    where: str
    kv_bytes: int
    tokens: int
    def __init__(self, agent: _Optional[str] = ..., state: _Optional[str] = ..., where: _Optional[str] = ..., kv_bytes: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class Lifecycle(_message.Message):
    __slots__ = ("policy", "active", "idle", "parked", "dropped", "idle_bytes", "parked_ram_bytes", "parked_disk_bytes", "restores", "ships_in", "ships_out", "reprefill_tokens", "reprefill_tokens_saved")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    IDLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARKED_RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARKED_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    SHIPS_IN_FIELD_NUMBER: _ClassVar[int]
    SHIPS_OUT_FIELD_NUMBER: _ClassVar[int]
    REPREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPREFILL_TOKENS_SAVED_FIELD_NUMBER: _ClassVar[int]
    policy: str
    active: int
    idle: int
    parked: int
    dropped: int
    idle_bytes: int
    parked_ram_bytes: int
    parked_disk_bytes: int
    restores: int
    ships_in: int
    ships_out: int
    reprefill_tokens: int
    reprefill_tokens_saved: int
    def __init__(self, policy: _Optional[str] = ..., active: _Optional[int] = ..., idle: _Optional[int] = ..., parked: _Optional[int] = ..., dropped: _Optional[int] = ..., idle_bytes: _Optional[int] = ..., parked_ram_bytes: _Optional[int] = ..., parked_disk_bytes: _Optional[int] = ..., restores: _Optional[int] = ..., ships_in: _Optional[int] = ..., ships_out: _Optional[int] = ..., reprefill_tokens: _Optional[int] = ..., reprefill_tokens_saved: _Optional[int] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("swarm", "workers", "generation")
    SWARM_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    swarm: str
    workers: _containers.RepeatedCompositeFieldContainer[WorkerPlacement]
    generation: int
    def __init__(self, swarm: _Optional[str] = ..., workers: _Optional[_Iterable[_Union[WorkerPlacement, _Mapping]]] = ..., generation: _Optional[int] = ...) -> None: ...
