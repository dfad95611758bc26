"""Dependencies handlers declare with `Annotated` aliases, so handlers stay short and tests override them."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from optimizer_service.settings import Settings
from optimizer_service.state import ServiceState

_bearer = HTTPBearer(auto_error=False, description="The service's API key, when one is configured")


def get_state(request: Request) -> ServiceState:
    return request.app.state.stratagem


StateDep = Annotated[ServiceState, Depends(get_state)]


def get_settings(state: StateDep) -> Settings:
    return state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(state: StateDep) -> Iterator[Session]:
    """One session per request; anything not committed by the core is rolled back on the way out."""
    if state.factory is None:
        raise HTTPException(status_code=503, detail="the database is not ready")
    with state.factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def _check_key(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    if settings.api_key is None:
        return
    expected = settings.api_key.get_secret_value().encode()
    given = credentials.credentials.encode() if credentials is not None else b""
    if credentials is None or not hmac.compare_digest(given, expected):
        raise HTTPException(
            status_code=401,
            detail="a valid API key is required: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_write_key(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    _check_key(settings, credentials)


def require_read_key(
    settings: SettingsDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    if settings.read_requires_key:
        _check_key(settings, credentials)


WriteAuthDep = Annotated[None, Depends(require_write_key)]
ReadAuthDep = Annotated[None, Depends(require_read_key)]
