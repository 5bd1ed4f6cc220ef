"""API shapes of uploaded code."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from .models import CodeModule

__all__ = ["CodeRead", "CodeSource"]


class CodeRead(BaseModel):
    id: int = Field(description="refer to its callables as code:<id>:<callable>")
    name: str
    filename: str
    sha256: str = Field(description="of the source as uploaded (UTF-8)")
    callables: list[str] = Field(description="top-level functions and classes it defines")
    refs: list[str] = Field(description="the references to use, e.g. code:3:build")
    created_at: datetime

    @classmethod
    def of(cls, code: CodeModule) -> CodeRead:
        return cls(
            id=code.id,
            name=code.name,
            filename=code.filename,
            sha256=code.sha256,
            callables=list(code.callables),
            refs=[f"code:{code.id}:{c}" for c in code.callables],
            created_at=code.created_at,
        )


class CodeSource(CodeRead):
    source: str

    @classmethod
    def of(cls, code: CodeModule) -> CodeSource:
        return cls(**CodeRead.of(code).model_dump(), source=code.source)
