"""The exceptions hypocenter raises, all under one root (every class the package defines is drawn here).

    HypocenterError                  root: catch this to handle anything we raise on purpose
    ├── InputError                   unusable input a person must fix (permanent)
    │   ├── BundleError              an attempt bundle that cannot be analysed (missing, no attempt.yaml, …)
    │   ├── RuleError                a rule file that does not load (carries file:line and a hint)
    │   ├── StrictYAMLError          strict_yaml.py: duplicate key, alias, not YAML (file:line)
    │   ├── StoreError               store/base.py: a store that cannot be opened or migrated
    │   ├── MetricFormatError        collector/metrics.py: a metrics file that is neither format
    │   ├── HostlistError            collector/hostlist.py: a Slurm hostlist that does not parse
    │   │   └── HostlistTooLarge     … or one that names more nodes than max_nodes_per_attempt
    │   ├── LimitExceeded            limits.py: input over a bound (ranks, nodes, records, bytes): 413 / 422
    │   ├── DumpError                collector/flight_recorder.py: not a readable Flight Recorder dump
    │   ├── PickleRefused            collector/plain_pickle.py: a pickle over its bounds, or not plain values
    │   ├── AnalysisFailed           server/quarantine.py: an attempt whose analysis failed, quarantined
    │   ├── OTLPDecodeError          collector/otlp.py: a body that is no OTLP message
    │   ├── InvalidRecords           collector/otlp.py: a request whose every record was refused (400)
    │   ├── UnsupportedMediaType     collector/otlp.py: neither protobuf nor JSON
    │   ├── MessageTooLarge          collector/otlp.py: over the size limit, after decompression too
    │   ├── UsageError               collector/pull.py: a combination of analyze flags that cannot work
    │   ├── UnknownAttempt           server/service.py: no data and no scope for that attempt
    │   ├── ExportRejected           exporter/outbox.py: the receiver refused the payload
    │   └── PermanentConnectorError  a connector call that will fail again (kind permanent | auth | not_found)
    ├── RefusedCaller                api/auth.py: a caller the listeners turn away
    │   ├── Unauthenticated          no usable credentials (HTTP 401 / gRPC UNAUTHENTICATED)
    │   └── Forbidden                authenticated, without the role (HTTP 403 / gRPC PERMISSION_DENIED)
    ├── TransientError               worth retrying: a source that did not answer this time
    │   ├── Backpressure             server/service.py: the ingest queue is full (retry_after)
    │   ├── DecoderBusy              collector/otlp.py: every decode slot stayed taken (max_concurrent_decodes)
    │   ├── BudgetSpent              api/listener_limits.py: buffered request bodies hit http_body_budget_bytes
    │   ├── StoreUnavailable         store/base.py: the database cannot be reached now (logged once per outage)
    │   ├── StreamConflict           store/base.py: another writer stored a stream's records first: reduce again
    │   ├── ExportUnavailable        exporter/outbox.py: the receiver cannot take it now
    │   └── TransientConnectorError  a connector call that may succeed later (kind transient)
    ├── ConnectorError               any connector failure, with its `kind`; always one of the two above
    │                                (`ConnectorError(msg, kind=...)` makes the right one)
    └── NotText                      sources.py: a log file found unusable part way through reading it
                                     (never reaches a user: the engine drops that file's events, its
                                     coverage entry says why)

A CLI turns an `InputError` into a one-line message and exit code 2, never a traceback. Problems
with one file inside an otherwise usable bundle are not raised at all: they are reported in the
diagnosis' coverage and the rest is analysed.
"""

from __future__ import annotations

from typing import Any, Literal

ErrorKind = Literal["transient", "permanent", "auth", "not_found"]


class HypocenterError(Exception):
    """Root of every error hypocenter raises on purpose."""


class RefusedCaller(HypocenterError):
    """A request the listeners refuse because of who sent it, not what it holds."""


class InputError(HypocenterError):
    """Input that cannot be used as given; retrying will not help."""


class BundleError(InputError):
    """An attempt bundle that cannot be analysed at all."""


class RuleError(InputError):
    """A rule or rule file that fails to load; the message names file:line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        super().__init__(f"{where}{message}")
        self.path = path
        self.line = line


class TransientError(HypocenterError):
    """A failure that may go away if the same call is made again later."""


class ConnectorError(HypocenterError):
    """A connector call failed; `kind` says whether trying again may help.

    `ConnectorError(message, kind=...)` builds a `TransientConnectorError` (a `TransientError`) for
    kind "transient" and a `PermanentConnectorError` (an `InputError`) otherwise, so callers catch
    either the connector failure or its category, and nothing translates one into the other.
    """

    kind: ErrorKind

    def __new__(cls, message: str = "", *, kind: ErrorKind = "permanent", **_: Any) -> ConnectorError:
        if cls is ConnectorError:
            cls = TransientConnectorError if kind == "transient" else PermanentConnectorError
        return super().__new__(cls, message)

    def __init__(self, message: str = "", *, kind: ErrorKind = "permanent") -> None:
        super().__init__(message)
        self.kind = kind

    @property
    def transient(self) -> bool:
        return self.kind == "transient"


class TransientConnectorError(ConnectorError, TransientError):
    """A connector call that may succeed if made again (connection refused, timeout, HTTP 429/5xx)."""

    def __init__(self, message: str = "", *, kind: ErrorKind = "transient") -> None:
        super().__init__(message, kind=kind)


class PermanentConnectorError(ConnectorError, InputError):
    """A connector call that will fail the same way again (bad request, credentials, no such job)."""
