"""What replicas sharing one database agree on through it: leases, analysis claims, delivery receipts.

    acquire_lease(name, holder, now, ttl_s)   take or renew a named lease (a row: holder + expiry); True
                                              when `holder` holds it now. A lease whose holder stopped
                                              renewing it expires and the next asker takes it.
    release_lease(name, holder)               give it up (a clean stop: the next asker need not wait)
    claim_analysis(attempt_id, holder, now)   mark an attempt as being analysed by `holder`; False when
                                              another live replica is analysing it (or, for a
                                              trigger, analysed it already)
    delivered(exporter, workload, attempt)    what an exporter delivered last for an attempt (`Delivered`)
    record_delivery(receipts)                 keep that, after a delivery

A replica is live while it holds the lease `replica:<holder>` (server/leadership.py renews it); the
claim of a replica that is not live any more is taken back by `recover_interrupted` with that
holder in mind. `shared` says whether several processes may use the store at once (PostgreSQL):
on SQLite there is one process, every lease is its own and no lease row is ever written.

A mixin of `SQLiteStore` (and so of `PostgresStore`): the statements are written once (store/sql.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from hypocenter.store.base import Delivered
from hypocenter.store.sql import sql

REPLICA_LEASE = "replica:"  # + holder: the lease a live replica renews


class Coordination:
    """Leases, claims and receipts over the store's own connection (`_tx`, `_rows`)."""

    shared = False  # PostgresStore: True

    def _tx(self) -> AbstractContextManager[Any]:  # pragma: no cover - provided by the store
        raise NotImplementedError

    def _rows(self, statement: str, args: Sequence[Any] = ()) -> list[Any]:  # pragma: no cover
        raise NotImplementedError

    # ----------------------------------------------------------------------------------- leases

    def acquire_lease(self, name: str, holder: str, now: float, ttl_s: float) -> bool:
        """Take `name` when it is free or expired, renew it when `holder` has it; True when held now."""
        with self._tx() as db:
            # One statement: two replicas asking at once both reach the row's lock (PostgreSQL) and the
            # second sees the first's holder and a future expiry, so it takes nothing.
            db.execute(
                sql(
                    "INSERT INTO leases (name, holder, expires) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE"
                    " SET holder=excluded.holder, expires=excluded.expires"
                    " WHERE leases.holder = excluded.holder OR leases.expires <= ?"
                ),
                (name, holder, now + ttl_s, now),
            )
            row = db.execute(sql("SELECT holder FROM leases WHERE name=?"), (name,)).fetchone()
        return row is not None and row[0] == holder

    def release_lease(self, name: str, holder: str) -> None:
        with self._tx() as db:
            db.execute(sql("DELETE FROM leases WHERE name=? AND holder=?"), (name, holder))

    def lease_holder(self, name: str, now: float) -> str | None:
        """Who holds `name` now (None: nobody, or the holder let it expire)."""
        rows = self._rows(sql("SELECT holder FROM leases WHERE name=? AND expires > ?"), (name, now))
        return str(rows[0][0]) if rows else None

    # ----------------------------------------------------------------------------------- claims

    def claim_analysis(self, attempt_id: int, holder: str, now: float, *, due_only: bool = False) -> bool:
        """Mark the attempt as analysed by `holder` since `now` (committed, so a replica that dies in
        the analysis is noticed), unless another replica's analysis of it is under way. `due_only`
        (a trigger, not a request): only while data is still unanalysed — a replica that found the
        attempt due just before another analysed it does not analyse it again."""
        with self._tx() as db:
            cur = db.execute(
                sql(
                    "UPDATE attempts SET analysing_since=?, analysing_by=? WHERE id=? AND (analysing_since IS NULL"
                    " OR analysing_by IS NULL OR analysing_by=?) AND (? = 0 OR dirty = 1)"
                ),
                (now, holder, attempt_id, holder, int(due_only)),
            )
            return bool(cur.rowcount == 1)

    def analysing_by(self, attempt_id: int) -> str | None:
        """The replica analysing the attempt now, if any."""
        rows = self._rows(
            sql("SELECT analysing_by FROM attempts WHERE id=? AND analysing_since IS NOT NULL"), (attempt_id,)
        )
        return str(rows[0][0]) if rows and rows[0][0] is not None else None

    # ----------------------------------------------------------------------------------- receipts

    def delivered(self, exporter: str, workload: str, attempt: int) -> Delivered | None:
        rows = self._rows(
            sql(
                "SELECT diagnosis_id, revision, ref FROM export_receipts WHERE exporter=? AND workload=?"
                " AND attempt=?"
            ),
            (exporter, workload, attempt),
        )
        if not rows:
            return None
        r = rows[0]
        return Delivered(exporter, workload, int(attempt), str(r[0]), int(r[1]), str(r[2]))

    def record_delivery(self, receipts: Sequence[Delivered]) -> None:
        if not receipts:
            return
        now = time.time()
        with self._tx() as db:
            db.executemany(
                sql(
                    "INSERT INTO export_receipts (exporter, workload, attempt, diagnosis_id, revision, ref,"
                    " delivered) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (exporter, workload, attempt) DO UPDATE"
                    " SET diagnosis_id=excluded.diagnosis_id, revision=excluded.revision, ref=excluded.ref,"
                    " delivered=excluded.delivered"
                ),
                [
                    (d.exporter, d.workload, d.attempt, d.diagnosis_id, d.revision, d.ref, now)
                    for d in receipts
                ],
            )
