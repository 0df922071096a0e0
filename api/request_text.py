"""Every string a client sends is valid Unicode, or the request is a 400 naming the field (issue 33 item 2).

Python decodes JSON's `"\\ud800"` escape (and a multipart part in a charset such as utf-7) into a str holding a
lone surrogate: a code point that is not a character, which the tokenizer, the database driver and the blob
store all refuse with an exception (a 500). This module is the one check, on decoded values:

  `TextCheckedRoute`  the route class of every API and console router: it checks the path and query parameters
                      and, for a route whose body FastAPI parses (a JSON model or Form fields), the parsed body,
                      before the handler runs (FastAPI then reuses the parsed body the request cached).
  `check_json_text`   for the routes that read their body themselves (inference: api/request_limits.py, the
                      adapter import: api/upload_request.py); `check_form_text` for the multipart upload
                      (api/uploads.py).

The 400 is `invalid_request` with `param` naming the field as a dotted path (`messages.0.content`,
`query.name`, `path.name`, `form.name`). Path, query and form values (names and identifiers, looked up in the
database) may not hold a NUL either (422, as the admin API's patterns answer a control character): PostgreSQL
text cannot hold one (JSON bodies may: prompts are never stored).
tests/api/test_request_text.py checks that every route of the app uses the route class.
"""

from __future__ import annotations

import email.message
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from fastapi import Request, Response, params
from fastapi.routing import APIRoute
from starlette.datastructures import FormData, UploadFile

from api.errors import ApiError

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def is_valid_text(text: str) -> bool:
    """True when `text` encodes to UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def invalid_text_error(param: str) -> ApiError:
    """The 400 for a field that is not valid Unicode."""
    return ApiError(
        400,
        "invalid_request",
        f"{param} is not valid Unicode text (it holds a lone UTF-16 surrogate such as \\ud800); send UTF-8 "
        "text (a character outside the BMP as one code point or a surrogate pair)",
        param=param,
    )


def find_invalid_text(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (key or value) in decoded JSON `value` that is not valid Unicode;
    None when all are (iterative: no recursion on deep input)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            if not is_valid_text(node):
                return where or "body"
        elif isinstance(node, dict):
            for key, child in node.items():
                child_path = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not is_valid_text(key):
                    return f"{where}.<key>" if where else "<key>"
                stack.append((child, child_path))
        elif isinstance(node, list):
            stack.extend((child, f"{where}.{i}" if where else str(i)) for i, child in enumerate(node))
    return None


def check_json_text(value: Any, path: str = "") -> None:
    """Raise the 400 naming the first string of decoded JSON `value` that is not valid Unicode."""
    bad = find_invalid_text(value, path)
    if bad is not None:
        raise invalid_text_error(bad)


def nul_error(param: str) -> ApiError:
    """The 422 for a NUL character in a path, query or form value (PostgreSQL text cannot hold one): the status
    the admin API's patterns already give a control character in a name or id."""
    return ApiError(
        422, "invalid_request", f"{param} contains a NUL character (\\u0000); remove it", param=param
    )


def check_pairs_text(pairs: Iterable[tuple[str, Any]], prefix: str) -> None:
    """Raise the 400 for the first name or string value of `pairs` (query, path or form items) that is not
    valid Unicode or holds a NUL (these are names and identifiers, looked up in the database); an uploaded
    file is checked by its file name."""
    for name, value in pairs:
        if not is_valid_text(name) or "\x00" in name:
            raise invalid_text_error(f"{prefix}.<name>")
        text = value.filename if isinstance(value, UploadFile) else value
        if isinstance(text, str) and not is_valid_text(text):
            raise invalid_text_error(f"{prefix}.{name}")
        if isinstance(text, str) and "\x00" in text:
            raise nul_error(f"{prefix}.{name}")


def check_form_text(form: FormData) -> None:
    """Raise the 400 for the first form field (name, value or file name) that is not valid Unicode."""
    check_pairs_text(form.multi_items(), "form")


def _is_json(request: Request) -> bool:
    content_type = request.headers.get("content-type")
    if not content_type:
        return True  # FastAPI parses a body without a content type as JSON
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def check_parsed_body(request: Request, is_form: bool) -> None:
    """Parse the body the way FastAPI will (the request caches it) and check its text; a body that does not
    parse is left to FastAPI's own error."""
    if is_form:
        check_form_text(await request.form())
        return
    if not _is_json(request) or not await request.body():
        return
    try:
        value = await request.json()
    except (ValueError, RecursionError):
        return
    check_json_text(value)


class TextCheckedRoute(APIRoute):
    """An APIRoute that refuses (400 naming the field) any path or query parameter, or FastAPI-parsed body
    field, that is not valid Unicode, before its handler runs."""

    def get_route_handler(self) -> Handler:
        """The route's handler, behind the text check."""
        handler = super().get_route_handler()
        has_body = self.body_field is not None
        is_form = self.body_field is not None and isinstance(self.body_field.field_info, params.Form)

        async def checked(request: Request) -> Response:
            check_pairs_text(request.path_params.items(), "path")
            check_pairs_text(request.query_params.multi_items(), "query")
            if has_body:
                await check_parsed_body(request, is_form)
            return await handler(request)

        return checked
