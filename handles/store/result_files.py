"""Result files too large to return inline, stored in parts (`handles_result_parts`)."""

from __future__ import annotations

from sqlalchemy import bindparam
from sqlalchemy import insert as sa_insert
from sqlalchemy import select as sa_select
from sqlmodel import col, delete

from handles.store.engine import Database
from handles.store.models import ResultPartRecord

_PARTS = ResultPartRecord.__table__  # type: ignore[attr-defined]
_PART_BY_KEY = sa_select(_PARTS.c.data).where(
    _PARTS.c.job_id == bindparam("job_id"),
    _PARTS.c.file_id == bindparam("file_id"),
    _PARTS.c.part == bindparam("part"),
)


class ResultFiles(Database):
    """The parts of result files, a part of `JobRepository`."""

    def put_result_part(self, job_id: str, file_id: str, part: int, data: bytes) -> None:
        """Store one part of a result file; the first part of a file clears the parts of earlier
        attempts' files (a retried job rewrites its file under a new `file_id`)."""
        with self._writing() as session:
            if part == 0:
                session.exec(
                    delete(ResultPartRecord).where(
                        col(ResultPartRecord.job_id) == job_id, col(ResultPartRecord.file_id) != file_id
                    )
                )
            session.execute(sa_insert(_PARTS).values(job_id=job_id, file_id=file_id, part=part, data=data))

    def drop_result_file(self, job_id: str, file_id: str) -> None:
        """Delete every part of one result file (a file that could not be finished)."""
        with self._writing() as session:
            session.exec(
                delete(ResultPartRecord).where(
                    col(ResultPartRecord.job_id) == job_id, col(ResultPartRecord.file_id) == file_id
                )
            )

    def result_part(self, job_id: str, file_id: str, part: int) -> bytes | None:
        """One part of a result file, or None when there is no such part."""
        with self._fast_reading() as connection:
            row = connection.execute(
                _PART_BY_KEY, {"job_id": job_id, "file_id": file_id, "part": part}
            ).first()
        return None if row is None else bytes(row[0])
