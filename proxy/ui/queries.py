"""The Live UI's query strings, validated at the edge: the sessions list's filters and sort.

Contract: ``SessionsQuery.parse(params)`` takes a request's query parameters and returns
a frozen, validated query, or raises ``InvalidRequest`` naming the parameter at fault.
Unknown parameters are ignored (a browser form sends what it has), an empty value reads
as "not given" (a form's blank field). ``wanted()`` is the read model's
``SessionFilter``; ``link(**changes)`` is the query string of this query with some
parameters changed (``None`` drops one), in a fixed order, for the page's sort, pager and
task links.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kernel.errors import InvalidRequest
from recorder.read_models.tables import SESSION_SORTS, SessionFilter

MAX_PAGE = 1_000_000
DEFAULT_SORT = "-created"  # newest first


class SessionsQuery(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    page: int = Field(default=1, ge=1, le=MAX_PAGE)
    task: str | None = Field(default=None, max_length=500)
    termination: str | None = Field(default=None, max_length=100)
    purpose: Literal["train", "validation", "check"] | None = None
    excluded: Literal["yes", "no"] | None = None
    fork: str | None = Field(default=None, max_length=100)
    min_reward: float | None = Field(default=None, allow_inf_nan=False)
    max_reward: float | None = Field(default=None, allow_inf_nan=False)
    sort: str | None = None  # one of SESSION_SORTS, "-" first for descending

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_absent(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("sort")
    @classmethod
    def _known_sort(cls, value: str | None) -> str | None:
        if value is not None and value.removeprefix("-") not in SESSION_SORTS:
            raise ValueError(f"must be one of {', '.join(SESSION_SORTS)}")
        return value

    @property
    def order(self) -> str:
        return self.sort or DEFAULT_SORT

    @classmethod
    def parse(cls, params: dict[str, str]) -> SessionsQuery:
        try:
            return cls.model_validate(params)
        except ValidationError as exc:
            error = exc.errors()[0]
            name = str(error["loc"][0]) if error["loc"] else "query"
            raise InvalidRequest(f"{name}: {error['msg']}", param=name) from exc

    def wanted(self) -> SessionFilter:
        return SessionFilter(
            task=self.task,
            termination=self.termination,
            purpose=self.purpose,
            excluded=None if self.excluded is None else self.excluded == "yes",
            fork=self.fork,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
        )

    def link(self, **changes: object) -> str:
        values = {**self.model_dump(), **changes}
        kept = {k: v for k, v in values.items() if v is not None and k in type(self).model_fields}
        if kept.get("page") == 1:
            del kept["page"]
        if kept.get("sort") == DEFAULT_SORT:
            del kept["sort"]
        return "?" + urlencode(kept)
