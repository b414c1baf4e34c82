"""`ReplyMemo`: a job's last reply comes back only for an equal state, and only the most recently polled jobs
are kept."""

from __future__ import annotations

from handles.server.reply_memo import ReplyMemo


def test_a_reply_comes_back_only_for_the_state_it_was_built_from() -> None:
    memo: ReplyMemo[str] = ReplyMemo()
    assert memo.get("a", ("working", 1)) is None
    memo.put("a", ("working", 1), "reply 1")
    assert memo.get("a", ("working", 1)) == "reply 1"
    assert memo.get("a", ("working", 2)) is None, "a changed state must build a new reply"
    assert memo.get("b", ("working", 1)) is None, "another job's reply is never given"
    memo.put("a", ("working", 2), "reply 2")
    assert memo.get("a", ("working", 1)) is None and memo.get("a", ("working", 2)) == "reply 2"


def test_only_the_most_recently_polled_jobs_are_kept() -> None:
    memo: ReplyMemo[int] = ReplyMemo(size=3)
    for n, job in enumerate("abc"):
        memo.put(job, n, n)
    assert memo.get("a", 0) == 0  # polled again: now the most recent
    memo.put("d", 3, 3)  # the least recently polled, b, goes
    assert len(memo._last) == 3
    assert memo.get("b", 1) is None
    assert [memo.get(job, n) for job, n in (("a", 0), ("c", 2), ("d", 3))] == [0, 2, 3]
