"""``POST /run_code``: the SandboxFusion request/response subset, so its recipes can point here.

Request: ``code``, ``language`` (python | c | cpp), ``stdin``, ``run_timeout``,
``compile_timeout``, ``memory_limit_MB`` (-1 or absent: the server default); ``files`` and
``fetch_files`` are accepted only empty. Response: ``status`` (Success | Failed | SandboxError),
``message``, ``compile_result`` and ``run_result`` each ``{status (Finished | Error |
TimeLimitExceeded), execution_time, return_code, stdout, stderr}`` plus ``truncated``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.reward.code_runner import CodeRunner, Language
from services.reward.sandbox import RunResult


class RunCodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(description="the program")
    language: Language
    stdin: str = ""
    run_timeout: float | None = Field(None, gt=0, description="seconds (capped by the server)")
    compile_timeout: float | None = Field(None, gt=0, description="seconds (capped by the server)")
    memory_limit_MB: int | None = Field(
        None, description="address space per process; -1 or absent: server default (capped)"
    )
    files: dict[str, str] = Field(default_factory=dict, description="unsupported: must be empty")
    fetch_files: list[str] = Field(default_factory=list, description="unsupported: must be empty")

    @field_validator("memory_limit_MB")
    @classmethod
    def _memory(cls, v: int | None) -> int | None:
        if v is None or v == -1:
            return None
        if v < 16:
            raise ValueError("must be -1 (server default) or at least 16")
        return v

    @field_validator("files", "fetch_files")
    @classmethod
    def _empty(cls, v: dict[str, str] | list[str]) -> dict[str, str] | list[str]:
        if v:
            raise ValueError("extra files are not supported by this server; send it empty")
        return v


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    truncated: bool = Field(False, description="output exceeded the server cap and was cut")


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def _command_result(r: RunResult) -> CommandRunResult:
    status = {"finished": "Finished", "timeout": "TimeLimitExceeded"}.get(r.status, "Error")
    return CommandRunResult(
        status=status,  # type: ignore[arg-type]
        execution_time=round(r.duration_s, 6),
        return_code=r.return_code,
        stdout=r.stdout.decode(errors="replace"),
        stderr=r.stderr.decode(errors="replace") or r.sandbox_error,
        truncated=r.truncated,
    )


def run_code_blocking(runner: CodeRunner, req: RunCodeRequest) -> RunCodeResponse:
    """Compile (C/C++) and run once; blocking, for a sandbox slot's thread."""
    program, compiled = runner.prepare(req.language, req.code, req.compile_timeout)
    compile_result = _command_result(compiled) if compiled is not None else None
    if compile_result is not None:
        compile_result.stdout = ""  # that was the binary
    if program is None:
        assert compiled is not None
        if compiled.status == "sandbox_error":
            return RunCodeResponse(
                status="SandboxError", message=compiled.sandbox_error, compile_result=compile_result
            )
        return RunCodeResponse(
            status="Failed", message="compilation failed", compile_result=compile_result
        )
    run = runner.run(
        program, req.stdin.encode(), runner.limits(req.run_timeout, req.memory_limit_MB)
    )
    result = _command_result(run)
    if run.status == "sandbox_error":
        return RunCodeResponse(
            status="SandboxError",
            message=run.sandbox_error,
            compile_result=compile_result,
            run_result=result,
        )
    message = ""
    if run.truncated:
        message = f"output exceeded {runner.cfg.max_output_bytes} bytes: truncated, run stopped"
    return RunCodeResponse(
        status="Success" if run.ok else "Failed",
        message=message,
        compile_result=compile_result,
        run_result=result,
    )
