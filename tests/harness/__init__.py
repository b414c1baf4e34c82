"""The machinery the tests and the benchmarks share, one of each.

- `process`: a server (or worker) process on 127.0.0.1, waited for, stopped, killed, restarted.
- `database`: a connection of a test's own to a store's database.
- `postgres`: a PostgreSQL schema of its own for one test or one benchmark, and dropping connections.
- `client`: the official client over Streamable HTTP with a bearer token.
- `relay`: a TCP relay that can cut connections (an outage, a fault on one request) and scan replies.
- `seed`: job rows written straight into the store, in bulk.
- `waiting`: a condition waited for with a bounded deadline.

`bench/` imports from here too (it runs from the repository root), so nothing here needs pytest.
"""
