"""What may leave the service in words: secrets masked everywhere, server paths kept from clients.

`mask_secrets` hides passwords in URLs (`postgresql://user:***@host`), `password=`-style settings and
bearer tokens; `install_log_masking` applies it to every log record, whoever logs it. `public_text`
also shortens absolute paths on this machine to their file name, for text a client reads (a trial's
error, a failed job's message): a traceback names the file and line, never where it is installed.
"""

from __future__ import annotations

import logging
import re
import threading

MASK = "***"

_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@'\"]*:)(?P<secret>[^\s@/'\"]+)(?=@)")
_KEY_VALUE = re.compile(
    r"(?P<head>\b(?:password|passwd|pwd|secret|token|api[_-]?key)\b\s*[=:]\s*['\"]?)(?P<secret>[^\s'\"&;,]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<secret>[A-Za-z0-9._~+/=\-]+)", re.IGNORECASE)
_PATH = re.compile(r"(?<![\w.:/])(?:/[\w.\-+@]+){2,}/(?P<name>[\w.\-+@]+)")


def mask_secrets(text: str) -> str:
    for pattern in (_URL_PASSWORD, _KEY_VALUE, _BEARER):
        text = pattern.sub(lambda m: m.group("head") + MASK, text)
    return text


def strip_paths(text: str) -> str:
    """`/srv/app/trial_runner/worker.py` -> `worker.py`: the file a message is about, not where it lives."""
    return _PATH.sub(lambda m: m.group("name"), text)


def public_text(text: str) -> str:
    """Text fit for a client: secrets masked, this machine's paths reduced to file names."""
    return strip_paths(mask_secrets(text))


class _MaskedRecord(logging.LogRecord):
    def getMessage(self) -> str:
        return mask_secrets(super().getMessage())


_installed = threading.Lock()
_done = False


def install_log_masking() -> None:
    """Make every log record of this process mask secrets in its message (once per process)."""
    global _done
    with _installed:
        if _done:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: object, **kwargs: object) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if type(record) is logging.LogRecord:
                record.__class__ = _MaskedRecord
            return record

        logging.setLogRecordFactory(factory)
        _done = True
