"""A claim log entry is the compact JSON array `[ATTEMPT,"CLAIMED_AT","NODE"]` on a line of its own, whatever
the time's offset and the node's name, and `claims_of` reads it back."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone

from sqlalchemy.orm import configure_mappers

from handles.store.models import JobRecord, claim_entry, claims_of

NODES = ["node-1:4242:ab12", 'odd "node" \\ name', "n\u00f6de \u4e2d", "tab\tnode", ""]


def test_an_entry_is_the_compact_json_of_its_claim() -> None:
    rnd = random.Random(37)
    for _ in range(2000):
        offset = timezone(timedelta(minutes=rnd.randint(-14 * 60, 14 * 60)))
        when = datetime(
            rnd.randint(2000, 2100), rnd.randint(1, 12), rnd.randint(1, 28), rnd.randint(0, 23),
            rnd.randint(0, 59), rnd.randint(0, 59), rnd.choice([0, rnd.randint(0, 999_999)]),
            tzinfo=rnd.choice([UTC, offset]),
        )  # fmt: skip
        node = rnd.choice(NODES)
        attempt = rnd.randint(1, 50)
        expected = json.dumps([attempt, when.astimezone(UTC).isoformat(), node], separators=(",", ":")) + "\n"
        assert claim_entry(attempt, when, node) == expected


def test_claims_of_reads_the_entries_back() -> None:
    when = datetime(2026, 12, 3, 7, 0, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    log = "".join(
        claim_entry(attempt, when, node) for attempt, node in [(1, NODES[1]), (1, NODES[2]), (2, NODES[0])]
    )
    configure_mappers()
    claims = claims_of(JobRecord.model_construct(claim_log=log))
    assert [(c.attempt, c.node, c.claimed_at, c.resumed) for c in claims] == [
        (1, NODES[1], when, False),
        (1, NODES[2], when, True),
        (2, NODES[0], when, False),
    ]
