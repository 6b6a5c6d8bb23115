"""One replica acts where acting twice would be wrong: the scheduler polls and the outbox.

Each role is a lease row in the shared database (store/coordination.py) that its holder renews;
when the holder dies the lease expires and another replica takes it. On a store only one process
uses (SQLite) every role is this process's from the start.

Details and reasons: docs/modules.md.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence

from hypocenter.store.base import Coordination, StoreUnavailable
from hypocenter.store.coordination import REPLICA_LEASE

log = logging.getLogger("hypocenter.server")

OUTBOX = "outbox"
SLURM_POLL = "poll:slurm"
KUEUE_POLL = "poll:kueue"


def default_holder() -> str:
    """This process among the replicas: host name (the pod's, in Kubernetes) and process id."""
    return f"{socket.gethostname()}/{os.getpid()}"


class Leadership:
    """The roles this replica holds; `start()` the renewal thread, `close()` gives them up."""

    def __init__(
        self,
        store: Coordination,
        roles: Sequence[str],
        *,
        holder: str = "",
        lease_s: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.roles = tuple(roles)
        self.holder = holder or default_holder()
        self.lease_s = lease_s
        self.clock = clock
        self.shared = bool(store.shared)
        self._held: set[str] = set() if self.shared else set(self.roles)
        self._until = float("inf") if not self.shared else 0.0  # the leases last renewed run until then
        self._reachable = True
        self._outage_logged = False  # this keeper logged the outage itself (not the store)
        self._logged: set[str] = set()  # the roles the log last said this replica holds
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def holds(self, role: str) -> bool:
        """True while this replica holds `role`'s lease (a paused process that missed its renewals
        does not act on a lease that has expired meanwhile)."""
        with self._lock:
            return role in self._held and self.clock() < self._until

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held) if self.clock() < self._until else []

    def start(self) -> None:
        if not self.shared:
            return
        self.renew()
        self._thread = threading.Thread(target=self._run, name="hypocenter-leases", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.lease_s)
        if not self.shared:
            return
        with self._lock:
            held, self._held = self._held, set()
        for name in [*sorted(held), REPLICA_LEASE + self.holder]:
            try:
                self.store.release_lease(name, self.holder)
            except Exception:  # the database is away: the lease expires by itself
                break

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            self.renew()

    def renew(self) -> None:
        """One round: keep this replica's lease, then take or renew each role's."""
        now = self.clock()
        got: set[str] = set()
        try:
            self.store.acquire_lease(REPLICA_LEASE + self.holder, self.holder, now, self.lease_s)
            for role in self.roles:
                if self.store.acquire_lease(role, self.holder, now, self.lease_s):
                    got.add(role)
        except Exception as exc:  # the database is away: act on nothing until it is back
            # One line per outage in all: a store that logs its own outages (StoreUnavailable) has
            # said it; the roles this replica stops acting on meanwhile are not listed one by one.
            if self._reachable:
                self._outage_logged = not isinstance(exc, StoreUnavailable)
                if self._outage_logged:
                    log.warning(
                        "leases: the store is unreachable, this replica stops polling and exporting: %s", exc
                    )
            self._reachable = False
            with self._lock:
                self._held = set()
                self._until = now + self.lease_s
            return
        if not self._reachable and self._outage_logged:
            log.info("leases: the store is reachable again")
        self._reachable, self._outage_logged = True, False
        with self._lock:
            self._held = got
            self._until = now + self.lease_s
        # what changed since the log last spoke: an outage that ends with the same roles logs none
        before, self._logged = self._logged, set(got)
        for role in sorted(got - before):
            log.info("replica %s took the %s lease", self.holder, role)
        for role in sorted(before - got):
            log.warning("replica %s no longer holds the %s lease", self.holder, role)
