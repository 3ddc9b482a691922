"""Request and response models of the REST API (pydantic): what ``/openapi.json`` documents.

They mirror :mod:`forge.model` field for field; converting is ``Unit.from_dict(m.model_dump())``
and ``UnitOut.of(unit)``, so the engine's own validation stays the one that decides.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from forge.model import MAX_CONTENT_CHARS, Kind, RelationType, Status
from forge.store import Filter

KindName = Literal[tuple(k.value for k in Kind)]  # type: ignore[valid-type]
StatusName = Literal[tuple(s.value for s in Status)]  # type: ignore[valid-type]
RelationName = Literal[tuple(r.value for r in RelationType)]  # type: ignore[valid-type]
Score = Field(default=0.5, ge=0.0, le=1.0)
Text = Field(default="", max_length=200)


class _Strict(BaseModel):
    """Request bodies: unknown fields and type coercion (``0`` for ``false``) are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ContextIn(_Strict):
    domain: str = Text
    task: str = Text
    role: str = Text
    tags: list[str] = Field(default_factory=list, max_length=50)


class ProvenanceIn(_Strict):
    source: str = Text
    episodes: list[str] = Field(default_factory=list, max_length=100)
    derived_from: list[str] = Field(default_factory=list, max_length=100)


class UnitIn(_Strict):
    """A unit to add. ``owner`` defaults to the calling agent; an agent cannot set another."""

    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    kind: KindName = "fact"
    id: str | None = Field(default=None, min_length=1, max_length=128)
    context: ContextIn = Field(default_factory=ContextIn)
    scope: str = Field(default="global", max_length=200, pattern=r"^(global|private|group:\S.*)$", examples=["global", "private", "group:ops"])
    owner: str | None = Field(default=None, max_length=200)
    confidence: float = Score
    validation: float = Score
    importance: float = Score
    provenance: ProvenanceIn = Field(default_factory=ProvenanceIn)
    status: StatusName = "active"
    meta: dict[str, Any] = Field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class UnitOut(BaseModel):
    id: str
    kind: KindName
    content: str
    context: ContextIn
    scope: str
    owner: str
    confidence: float
    validation: float
    importance: float
    access_count: int
    last_access: float | None
    created_at: float
    updated_at: float | None
    provenance: ProvenanceIn
    status: StatusName
    meta: dict[str, Any]


class AddIn(_Strict):
    """Units to add. ``admit`` (default true) sends each through admission: a duplicate is
    merged into the unit already stored, a newer contradicting statement supersedes the old
    one; ``false`` stores every unit as given."""

    units: list[UnitIn] = Field(min_length=1, max_length=1000)
    admit: bool = True


class AdmissionOut(BaseModel):
    """What admission did with one unit: ``unit_id`` holds the memory now."""

    action: Literal["add", "update", "noop"]
    summary: str = Field(examples=["added", "merged into 01J...", "updated 01J... (superseded by 01K...)"])
    unit_id: str
    incoming: str
    existing: str | None
    similarity: float | None
    reason: str
    held: bool = Field(default=False, description="stored quarantined: the screen held this group or global unit for an operator's review")


class AddOut(BaseModel):
    ids: list[str] = Field(description="per unit sent, the id of the unit that holds it now (an existing one when merged)")
    admission: list[AdmissionOut]


class TurnIn(_Strict):
    role: str = Field(default="user", min_length=1, max_length=40, examples=["user", "assistant"])
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)


class MessagesIn(_Strict):
    """A conversation to remember; ``scope`` and ``admit`` as for ``POST /v1/units``."""

    messages: list[TurnIn] = Field(min_length=1, max_length=200)
    scope: str = Field(default="global", max_length=200, pattern=r"^(global|private|group:\S.*)$")
    admit: bool = True


class ExtractedOut(BaseModel):
    kind: str
    content: str
    why: str
    turns: list[int]
    decision: dict[str, Any] | None = Field(default=None, description="admission's decision (action, summary, unit_id, reason) when kept")
    skipped: str | None = Field(default=None, description="why it was not kept (not grounded in the turns, said twice...)")


class MessagesOut(BaseModel):
    model: str
    extracted: list[ExtractedOut]
    ids: list[str] = Field(description="the units that hold what was kept")


class UnitPatch(_Strict):
    """Fields to change; absent fields stay as they are."""

    content: str | None = Field(default=None, min_length=1, max_length=MAX_CONTENT_CHARS)
    kind: KindName | None = None
    context: ContextIn | None = None
    scope: str | None = Field(default=None, max_length=200)
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    importance: float | None = Field(default=None, ge=0.0, le=1.0)
    meta: dict[str, Any] | None = None


class StatusIn(_Strict):
    status: StatusName
    reason: str = Field(min_length=1, max_length=1000)


class ErasedCounts(BaseModel):
    relations: int
    history: int
    mentions_scrubbed: int


class ErasedOut(BaseModel):
    """The tombstone of an erased unit: what it was (never its text), why, what went with it."""

    erased: str
    kind: str
    scope: str
    owner: str
    reason: str
    removed: ErasedCounts
    seq: int


class UnitPage(BaseModel):
    units: list[UnitOut]
    total: int
    limit: int
    offset: int


class FilterIn(_Strict):
    kinds: list[KindName] = Field(default_factory=list)
    status: list[StatusName] | None = None
    tags_all: list[str] = Field(default_factory=list, max_length=20)
    tags_any: list[str] = Field(default_factory=list, max_length=20)
    domain: str | None = Field(default=None, max_length=200)
    task: str | None = Field(default=None, max_length=200)
    role: str | None = Field(default=None, max_length=200)
    owner: str | None = Field(default=None, max_length=200)
    scopes: list[str] = Field(default_factory=list, max_length=20)
    since: float | None = None
    until: float | None = None

    def build(self) -> Filter:
        return Filter.make(**self.model_dump())


class RecallIn(_Strict):
    query: str = Field(min_length=1, max_length=4000)
    k: int = Field(default=10, ge=1, le=200)
    hops: int = Field(default=1, ge=0, le=3)
    filter: FilterIn = Field(default_factory=FilterIn)
    touch: bool = True
    min_score: float = Field(default=0.0, ge=0.0, le=1.0, description="leave out results scored below this (scores are 0-1)")


class RecalledOut(BaseModel):
    unit: UnitOut
    score: float
    reasons: list[str]
    why: dict[str, Any]


class RecallOut(BaseModel):
    results: list[RecalledOut]
    recall_id: str = ""


class ContextReq(_Strict):
    query: str = Field(min_length=1, max_length=4000)
    budget: int = Field(default=512, ge=1, le=100_000)
    k: int = Field(default=20, ge=1, le=200)
    hops: int = Field(default=1, ge=0, le=3)
    filter: FilterIn = Field(default_factory=FilterIn)
    min_score: float = Field(default=0.0, ge=0.0, le=1.0, description="pack only results scored at least this (0-1)")


class RuleOut(BaseModel):
    unit_id: str
    when: str
    avoid: list[str]
    prefer: list[str]
    validation: float


class ContextOut(BaseModel):
    prompt: str
    tokens: int
    budget: int
    units: list[str]
    sections: dict[str, list[RecalledOut]]
    dropped: list[str]
    recall_id: str = ""
    rules: list[RuleOut] = []


class RelationIn(_Strict):
    src: str = Field(min_length=1, max_length=128)
    dst: str = Field(min_length=1, max_length=128)
    type: RelationName = "related_to"
    weight: float = Field(default=1.0, ge=-1e6, le=1e6)
    note: str = Field(default="", max_length=1000)


class RelationOut(BaseModel):
    src: str
    dst: str
    type: RelationName
    weight: float
    created_at: float
    note: str


class StepIn(_Strict):
    observation: str = Field(default="", max_length=MAX_CONTENT_CHARS)
    thought: str = Field(default="", max_length=MAX_CONTENT_CHARS)
    action: str = Field(default="", max_length=2000)
    reward: float = Field(default=0.0, ge=-1e9, le=1e9)
    role: str = Text
    info: dict[str, Any] = Field(default_factory=dict)


class EpisodeIn(_Strict):
    id: str | None = Field(default=None, min_length=1, max_length=128)
    agent: str | None = Field(default=None, max_length=200)
    task: str = Text
    env: str = Text
    steps: list[StepIn] = Field(default_factory=list, max_length=10_000)
    outcome: dict[str, Any] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)


class EpisodeOut(BaseModel):
    id: str
    agent: str
    task: str
    env: str
    steps: list[dict[str, Any]]
    outcome: dict[str, Any]
    created_at: float
    meta: dict[str, Any]


class IdOut(BaseModel):
    id: str


class CountOut(BaseModel):
    records: int


class EventOut(BaseModel):
    seq: int
    ts: float
    op: str
    unit_id: str | None
    actor: str
    data: dict[str, Any]


class EventPage(BaseModel):
    events: list[EventOut]


class SeenOut(BaseModel):
    agent: str
    before: float | None
    units: list[dict[str, Any]]


class WhoAmI(BaseModel):
    agent: str
    groups: list[str]
    admin: bool
    key_id: str


class ErrorBody(BaseModel):
    status: int
    code: str
    message: str


class ErrorOut(BaseModel):
    """Every error the API returns has this shape."""

    error: ErrorBody


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        400: "malformed request", 401: "missing or unknown API key", 403: "the key may not do this",
        404: "not found (or not visible to this key)", 409: "the id already exists",
        413: "request body too large", 421: "wrong Host for a server without keys (DNS rebinding)",
        422: "invalid input", 429: "rate limit exceeded", 500: "backend failure",
        502: "a backend answered wrongly (an LLM that gave no valid reply)", 503: "backend unavailable",
    }.items()
}


# -- the learning door ---------------------------------------------------------------------


class OutcomeIn(_Strict):
    """How a decision fed by a recall turned out: credits the units that recall showed, once."""

    recall_id: str = Field(min_length=1, max_length=16_384)
    success: bool | None = None
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    feedback: str = Field(default="", max_length=16_000)


class OutcomeOut(BaseModel):
    recall_id: str
    success: bool | None
    credited: list[str]
    retired: list[str]


class LearnIn(BaseModel):
    """A trace (``task``, ``kind``, ``steps``, ``answer``, ``recall_ids``) and its outcome
    (``success``, ``score``, ``feedback``); validated by :class:`forge.learn.trace.Trace`."""

    model_config = ConfigDict(extra="forbid")
    trace: dict[str, Any]
    outcome: dict[str, Any] | None = None


class JobIn(BaseModel):
    job_id: str
    status: str
    url: str


class JobOut(BaseModel):
    job_id: str
    status: str
    result: dict[str, Any] | None = None
    error: str = ""


