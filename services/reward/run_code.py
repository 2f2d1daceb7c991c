"""``POST /run_code``: the SandboxFusion request/response subset, so its recipes can point here.

The request and response models are the contract's (:class:`dynamo_rl.contracts.reward.RunCodeRequest`,
:class:`~dynamo_rl.contracts.reward.RunCodeResponse`); this module runs a request in the sandbox.
"""

from __future__ import annotations

from dynamo_rl.contracts.reward import CommandRunResult, RunCodeRequest, RunCodeResponse
from services.reward.code_runner import CodeRunner
from services.reward.sandbox import RunResult


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
        program, (req.stdin or "").encode(), runner.limits(req.run_timeout, req.memory_limit_MB)
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
