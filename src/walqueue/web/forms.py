"""The writes' form bodies, read within bounds.MAX_FORM_BYTES and parsed by the standard
library (application/x-www-form-urlencoded only: the forms have no files)."""

from __future__ import annotations

from urllib.parse import parse_qs

from starlette.requests import Request

from .bounds import MAX_FORM_BYTES

MAX_FIELDS = 1000


class FormError(ValueError):
    """A body that is not a form the dashboard sent; the message says why (answered 400 or 413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


async def read_form(request: Request) -> dict[str, list[str]]:
    """The fields of the request's form, each with its values in order."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise FormError("a write is a form POST (application/x-www-form-urlencoded)", 415)
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise FormError(f"a form is at most {MAX_FORM_BYTES} bytes", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise FormError(f"a form is at most {MAX_FORM_BYTES} bytes", 413)
    try:
        return parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=False,
                        encoding="utf-8", errors="strict", max_num_fields=MAX_FIELDS)
    except (UnicodeDecodeError, ValueError) as exc:
        raise FormError(f"the form cannot be read: {exc}") from None
