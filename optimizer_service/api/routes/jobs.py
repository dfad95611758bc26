"""`/v1/optimize` and `/v1/jobs`: submit a job, follow it, cancel it, read its ranked answer."""

from __future__ import annotations

import uuid
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from models import Job, JobStatus
from optimizer_service.api.bodies import ingested, json_body
from optimizer_service.api.deps import SessionDep, SettingsDep, StateDep, WriteAuthDep, require_read_key
from optimizer_service.api.routes.documents_common import Limit, Offset
from optimizer_service.api.schemas import (
    CandidatePublic,
    CandidatesPublic,
    ErrorPublic,
    JobCreated,
    JobProgress,
    JobPublic,
    JobsPublic,
    OptimizeRequest,
    VariantPublic,
)
from optimizer_service.core import jobs as core
from optimizer_service.core.errors import unavailable
from optimizer_service.state import ServiceState
from stratagem.ir import Strategy

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_read_key)])

WAIT_POLL_S = 0.1


def job_public(job: Job, request: Request) -> JobPublic:
    progress = JobProgress.model_validate(
        {k: v for k, v in (job.progress or {}).items() if k in JobProgress.model_fields}
    )
    return JobPublic(
        id=job.id,
        url=str(request.url_for("get_job", job_id=job.id)),
        status=job.status,
        phase=job.phase,
        progress=progress,
        graph_id=job.graph_id,
        resource_id=job.resource_id,
        options=job.options,
        result=job.result,
        error=job.error,
        cancel_requested=job.cancel_requested,
        attempts=job.attempts,
        worker_id=job.worker_id,
        best_strategy_id=job.best_strategy_id,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        heartbeat_at=job.heartbeat_at,
    )


@router.post(
    "/v1/optimize",
    status_code=202,
    response_model=JobCreated,
    openapi_extra=json_body(OptimizeRequest),
    responses={
        200: {"model": JobPublic, "description": "With `wait=true`: the job ended within the timeout"},
        429: {"model": ErrorPublic, "description": "The queue is full; see Retry-After"},
    },
)
async def optimize(
    request: Request,
    state: StateDep,
    settings: SettingsDep,
    _: WriteAuthDep,
    wait: Annotated[bool, Query(description="Hold the request until the job ends or `timeout` passes")] = False,
    timeout: Annotated[
        float, Query(ge=0, le=3600, allow_inf_nan=False, description="Seconds to wait (capped by the service)")
    ] = 30.0,
) -> JSONResponse:
    """The body (an `OptimizeRequest`) is parsed, validated and stored off the event loop."""
    submitted = await ingested(state, "optimize", request)
    job_id = uuid.UUID(submitted["id"])
    if state.workers is not None:
        state.workers.notify()
    created = JobCreated(id=job_id, url=str(request.url_for("get_job", job_id=job_id)), status=submitted["status"])
    headers = {"Location": created.url}
    if wait:
        ended = await _wait_for(state, job_id, min(timeout, settings.wait_max_s))
        if ended is not None:
            return JSONResponse(job_public(ended, request).model_dump(mode="json"), status_code=200, headers=headers)
    return JSONResponse(created.model_dump(mode="json"), status_code=202, headers=headers)


async def _wait_for(state: ServiceState, job_id: uuid.UUID, timeout_s: float) -> Job | None:
    with anyio.move_on_after(timeout_s):
        while True:
            job = await anyio.to_thread.run_sync(_read_job, state, job_id)
            if job.status.terminal:
                return job
            await anyio.sleep(WAIT_POLL_S)
    return None


def _read_job(state: ServiceState, job_id: uuid.UUID) -> Job:
    if state.factory is None:
        raise unavailable("the database is not ready")
    with state.factory() as session:
        return core.get_job(session, job_id)


@router.get("/v1/jobs")
def list_jobs(
    session: SessionDep, request: Request, status: JobStatus | None = None, limit: Limit = 50, offset: Offset = 0
) -> JobsPublic:
    jobs, count = core.list_jobs(session, status=status, limit=limit, offset=offset)
    return JobsPublic(data=[job_public(job, request) for job in jobs], count=count)


@router.get("/v1/jobs/{job_id}", responses={404: {"model": ErrorPublic}})
def get_job(job_id: uuid.UUID, session: SessionDep, request: Request) -> JobPublic:
    return job_public(core.get_job(session, job_id), request)


@router.post("/v1/jobs/{job_id}/cancel", responses={404: {"model": ErrorPublic}})
def cancel_job(job_id: uuid.UUID, session: SessionDep, request: Request, _: WriteAuthDep) -> JobPublic:
    return job_public(core.cancel_job(session, job_id), request)


@router.get("/v1/jobs/{job_id}/candidates", responses={404: {"model": ErrorPublic}})
@router.get("/v1/jobs/{job_id}/strategies", responses={404: {"model": ErrorPublic}})
def job_candidates(job_id: uuid.UUID, session: SessionDep) -> CandidatesPublic:
    """The ranked candidates, the answer first; near-copies are one candidate with its variants."""
    result = core.get_job(session, job_id).result or {}
    data = []
    for candidate, row in core.job_candidates(session, job_id):
        strategy = core.annotated_strategy(candidate, row)
        variants = core.variants_of(result, row.id)
        data.append(
            CandidatePublic(
                rank=candidate.rank,
                strategy_id=row.id,
                source=candidate.source,
                description=strategy.describe(),
                predicted=strategy.predicted,
                measured=strategy.measured,
                relevelled_step_time_s=core.relevelled_of(result, row.id),
                variant_count=int(variants.get("count", 0)),
                variants=[VariantPublic.model_validate(v) for v in variants.get("listed", [])],
                variant_key=variants.get("key"),
                strategy=strategy.model_dump(mode="json"),
            )
        )
    return CandidatesPublic(data=data, count=len(data))


@router.get(
    "/v1/jobs/{job_id}/best",
    response_model=Strategy,
    responses={404: {"model": ErrorPublic}, 409: {"model": ErrorPublic, "description": "The job has not succeeded"}},
)
def job_best(job_id: uuid.UUID, session: SessionDep) -> JSONResponse:
    return JSONResponse(core.best_strategy(session, job_id).model_dump(mode="json"))
