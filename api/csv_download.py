"""A CSV file as a download response (the billing and usage reports of the REST API and the console)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import Response


@dataclass(frozen=True)
class CsvFile:
    """A report as CSV text and the file name it downloads as."""

    filename: str
    text: str


def csv_download(csv_file: CsvFile) -> Response:
    """The file as text/csv with a Content-Disposition naming it."""
    return Response(
        csv_file.text,
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{csv_file.filename}"'},
    )
