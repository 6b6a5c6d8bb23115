"""The store's schema, as versioned migrations that both SQLite and PostgreSQL apply in order.

Column types are written $ID, $INTEGER, $REAL and $TEXT, and rendered per dialect (store/sql.py:
SQLite gets exactly the words, PostgreSQL BIGINT identities, BIGINT, DOUBLE PRECISION and
TEXT COLLATE "C"); everything else is SQL both take. Never edit a released migration: append a new
one (a plain string is fine when it names no column type).
"""

from __future__ import annotations

from hypocenter.store.sql import Migration, ddl

# Every migration, in order. Never edit a released one: append a new one.
MIGRATIONS: tuple[Migration, ...] = tuple(
    ddl(template)
    for template in (
        """
    CREATE TABLE attempts (
        id $ID,
        workload $TEXT NOT NULL,
        attempt $INTEGER NOT NULL,
        scope $TEXT NOT NULL DEFAULT '{}',     -- merged hypocenter.* scope attributes (JSON)
        context $TEXT,                         -- an uploaded attempt.yaml, validated (JSON), wins over scope
        first_ns $INTEGER,                     -- earliest / latest time of its workload-scoped data
        last_ns $INTEGER,
        terminal_ns $INTEGER,                  -- time of the terminal-state record, when one arrived
        activity $REAL NOT NULL,               -- wall clock of the last data that touched the attempt
        dirty $INTEGER NOT NULL DEFAULT 1,     -- data arrived since the last analysis
        analyzed_at $REAL,
        UNIQUE (workload, attempt)
    );
    CREATE TABLE attempt_nodes (
        attempt_id $INTEGER NOT NULL REFERENCES attempts(id) ON DELETE CASCADE,
        node $TEXT NOT NULL,
        PRIMARY KEY (attempt_id, node)
    );
    CREATE INDEX attempt_nodes_node ON attempt_nodes (node);
    CREATE TABLE log_entries (
        id $ID,
        attempt_id $INTEGER REFERENCES attempts(id) ON DELETE CASCADE,
        node $TEXT,
        stream $TEXT NOT NULL,
        kind $TEXT NOT NULL,
        line $INTEGER,
        time_ns $INTEGER NOT NULL,
        body $TEXT NOT NULL,
        received $REAL NOT NULL,
        dedup $TEXT NOT NULL UNIQUE
    );
    CREATE INDEX log_entries_attempt ON log_entries (attempt_id, stream, line);
    CREATE INDEX log_entries_node ON log_entries (node, time_ns) WHERE attempt_id IS NULL;
    CREATE INDEX log_entries_received ON log_entries (received);
    CREATE TABLE metric_points (
        id $ID,
        attempt_id $INTEGER REFERENCES attempts(id) ON DELETE CASCADE,
        node $TEXT,
        source $TEXT NOT NULL,
        name $TEXT NOT NULL,
        labels $TEXT NOT NULL,
        time_ns $INTEGER NOT NULL,
        value $REAL NOT NULL,
        received $REAL NOT NULL,
        dedup $TEXT NOT NULL UNIQUE
    );
    CREATE INDEX metric_points_attempt ON metric_points (attempt_id);
    CREATE INDEX metric_points_node ON metric_points (node, time_ns) WHERE attempt_id IS NULL;
    CREATE TABLE stream_drops (
        scope $TEXT NOT NULL,                  -- attempt id or '' for node-scoped streams
        node $TEXT NOT NULL,
        stream $TEXT NOT NULL,
        dropped $INTEGER NOT NULL,
        PRIMARY KEY (scope, node, stream)
    );
    CREATE TABLE diagnoses (
        id $TEXT PRIMARY KEY,
        attempt_id $INTEGER REFERENCES attempts(id) ON DELETE SET NULL,
        workload $TEXT NOT NULL,
        attempt $INTEGER NOT NULL,
        cluster $TEXT,
        outcome $TEXT NOT NULL,
        domain $TEXT,
        subdomain $TEXT,
        terminal_state $TEXT,
        provisional $INTEGER NOT NULL,
        window_start_ns $INTEGER,
        window_end_ns $INTEGER,
        created $REAL NOT NULL,
        body $TEXT NOT NULL
    );
    CREATE INDEX diagnoses_created ON diagnoses (created);
    CREATE TABLE diagnosis_nodes (
        diagnosis_id $TEXT NOT NULL REFERENCES diagnoses(id) ON DELETE CASCADE,
        node $TEXT NOT NULL,
        role $TEXT NOT NULL,                   -- culprit | affected
        PRIMARY KEY (diagnosis_id, node, role)
    );
    CREATE INDEX diagnosis_nodes_node ON diagnosis_nodes (node, role);
    """,
        # 2: node streams join attempts whole (see node_logs)
        """
    CREATE INDEX log_entries_node_stream ON log_entries (node, stream, line) WHERE attempt_id IS NULL;
    """,
        # 3: the export outbox (exporter/outbox.py)
        """
    CREATE TABLE exports (
        id $ID,
        diagnosis_id $TEXT NOT NULL,           -- no foreign key: a superseded diagnosis is reported, not cascaded away
        exporter $TEXT NOT NULL,
        created $REAL NOT NULL,                -- when the diagnosis was stored
        due $REAL NOT NULL,                    -- not before: back-off after a transient failure, or a claim's lease
        attempts $INTEGER NOT NULL DEFAULT 0,
        last_error $TEXT,
        UNIQUE (diagnosis_id, exporter)
    );
    CREATE INDEX exports_due ON exports (exporter, due);
    """,
        # 4: compaction (server/compaction.py) and the hang trigger
        """
    ALTER TABLE log_entries ADD COLUMN compacted $INTEGER NOT NULL DEFAULT 0;  -- 0 new, 1 kept as evidence, 2 blanked
    CREATE INDEX log_entries_uncompacted ON log_entries (received) WHERE compacted = 0 AND kind = 'text';
    ALTER TABLE attempts ADD COLUMN stalled_ns $INTEGER;  -- a watchdog / heartbeat timeout seen before any terminal state
    """,
        # 5: a compaction pass reads a stream's live lines only, not its tombstones
        """
    CREATE INDEX log_entries_live ON log_entries (stream, node, id) WHERE compacted < 2 AND kind = 'text';
    """,
        # 6: runs of blanked lines merge into one `gap` row (compacted = 3) once retries are no longer expected
        """
    CREATE INDEX log_entries_tombstones ON log_entries (received) WHERE compacted = 2;
    """,
        # 7: provenance, and every verdict an attempt had kept as a revision (a new one never replaces silently)
        """
    CREATE TABLE diagnosis_revisions (
        id $ID,
        workload $TEXT NOT NULL,
        attempt $INTEGER NOT NULL,
        revision $INTEGER NOT NULL,            -- 1, 2, ... per workload attempt
        diagnosis_id $TEXT NOT NULL,
        outcome $TEXT NOT NULL,
        domain $TEXT,
        subdomain $TEXT,
        provisional $INTEGER NOT NULL,
        created $REAL NOT NULL,
        provenance $TEXT NOT NULL,             -- JSON: source, client, role, time
        body $TEXT NOT NULL,
        UNIQUE (workload, attempt, revision)
    );
    CREATE INDEX diagnosis_revisions_id ON diagnosis_revisions (diagnosis_id);
    CREATE INDEX diagnosis_revisions_created ON diagnosis_revisions (created);
    ALTER TABLE diagnoses ADD COLUMN revision $INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE diagnoses ADD COLUMN provenance $TEXT;
    ALTER TABLE attempts ADD COLUMN scope_provenance $TEXT;  -- who set the scope (PUT, bundle, scope, pull)
    INSERT INTO diagnosis_revisions (workload, attempt, revision, diagnosis_id, outcome, domain, subdomain,
        provisional, created, provenance, body)
        SELECT workload, attempt, 1, id, outcome, domain, subdomain, provisional, created,
        '{"source": "unknown"}', body FROM diagnoses;
    UPDATE diagnoses SET provenance = '{"source": "unknown"}';
    """,
        # 8: the diagnosis list (web UI) pages newest first without sorting the table, and filters and counts
        # from this index alone, not from rows that carry whole bodies; storing a diagnosis finds the one it
        # replaces by attempt without a scan
        """
    CREATE INDEX diagnoses_list ON diagnoses (window_end_ns DESC, id, outcome, domain, cluster, workload,
                                              window_start_ns, provisional);
    CREATE INDEX diagnoses_attempt ON diagnoses (attempt_id);
    """,
        # 9: poison attempts are quarantined (server/quarantine.py): an analysis that failed, or that the
        # process died in twice, is recorded with its reason and not retried until new data arrives
        """
    ALTER TABLE attempts ADD COLUMN failure $TEXT;            -- why its last analysis failed, NULL once one succeeds
    ALTER TABLE attempts ADD COLUMN failed_at $REAL;
    ALTER TABLE attempts ADD COLUMN analysing_since $REAL;    -- set while an analysis runs (found set at start: died in it)
    ALTER TABLE attempts ADD COLUMN interrupted $INTEGER NOT NULL DEFAULT 0;  -- analyses in a row the process died in
    CREATE INDEX attempts_failed ON attempts (failed_at) WHERE failure IS NOT NULL;
    """,
        # 10: extraction on arrival (server/arrival.py): per-stream facts and record-number ranges, so that a
        # record-numbered text stream keeps its evidence lines and gap rows, not a row per line
        """
    CREATE TABLE stream_state (
        workload $TEXT NOT NULL,               -- '' for a node-scoped stream
        attempt $INTEGER NOT NULL,
        node $TEXT NOT NULL,                   -- '' for none
        stream $TEXT NOT NULL,
        generation $INTEGER NOT NULL,          -- rotations seen (record numbers that started again at 1)
        since_id $INTEGER NOT NULL,            -- the current generation's rows have larger ids
        head $TEXT,                            -- dedup key of the current generation's line 1
        ranges $TEXT NOT NULL,                 -- record numbers stored, JSON [[lo, hi], ...]: retries are dropped
        lines $INTEGER NOT NULL,               -- lines and bytes received (all generations)
        bytes $INTEGER NOT NULL,
        first_ns $INTEGER,                     -- earliest / latest record time
        last_ns $INTEGER,
        PRIMARY KEY (workload, attempt, node, stream)
    );
    CREATE INDEX stream_state_node ON stream_state (node, last_ns) WHERE workload = '';
    CREATE INDEX log_entries_stream ON log_entries (stream, node, id);
    """,
        # 11: fleet memory (engine/fleet.py): what each diagnosis says about nodes, GPUs and ports
        """
    CREATE TABLE fleet_marks (
        diagnosis_id $TEXT NOT NULL REFERENCES diagnoses(id) ON DELETE CASCADE,
        workload $TEXT NOT NULL,
        attempt $INTEGER NOT NULL,
        cluster $TEXT,
        time_s $REAL NOT NULL,                 -- when the failure happened (root cause first seen, else window end)
        role $TEXT NOT NULL,                   -- culprit | candidate | app_xid
        kind $TEXT NOT NULL,                   -- node | gpu | port
        node $TEXT NOT NULL,
        component $TEXT NOT NULL,              -- the GPU (PCI id or UUID) or host port, '' for a node
        domain $TEXT NOT NULL,
        subdomain $TEXT NOT NULL,
        rule $TEXT NOT NULL,
        detail $TEXT NOT NULL,                 -- the Xid code of an app_xid mark
        PRIMARY KEY (diagnosis_id, role, kind, node, component, rule, detail)
    );
    CREATE INDEX fleet_marks_time ON fleet_marks (time_s);
    CREATE TABLE fleet_pending (              -- diagnoses stored before fleet memory: the server marks them once
        diagnosis_id $TEXT PRIMARY KEY REFERENCES diagnoses(id) ON DELETE CASCADE
    );
    INSERT INTO fleet_pending SELECT id FROM diagnoses;
    """,
        # 12: the diagnosis list's index in the order its query reads (newest first, NULL windows last):
        # PostgreSQL read migration 8's index in the other NULL order, so it sorted the whole table
        """
    DROP INDEX diagnoses_list;
    CREATE INDEX diagnoses_list ON diagnoses (window_end_ns $DESC_NULLS_LAST, id, outcome, domain, cluster,
                                              workload, window_start_ns, provisional);
    """,
        # 13: replicas on one PostgreSQL act once (server/leadership.py): a lease per role (a scheduler poll,
        # the outbox) and per live replica; an analysis is claimed by its replica; what each exporter
        # delivered for an attempt, so a later verdict replaces it (the Grafana annotation's id)
        """
    CREATE TABLE leases (
        name $TEXT PRIMARY KEY,                -- outbox | poll:slurm | poll:kueue | replica:<holder>
        holder $TEXT NOT NULL,
        expires $REAL NOT NULL                 -- wall clock, renewed by the holder well before
    );
    ALTER TABLE attempts ADD COLUMN analysing_by $TEXT;  -- the replica analysing it (with analysing_since)
    CREATE INDEX attempts_analysing ON attempts (analysing_by) WHERE analysing_since IS NOT NULL;
    CREATE TABLE export_receipts (
        exporter $TEXT NOT NULL,
        workload $TEXT NOT NULL,
        attempt $INTEGER NOT NULL,
        diagnosis_id $TEXT NOT NULL,           -- the verdict delivered last for the attempt
        revision $INTEGER NOT NULL,
        ref $TEXT NOT NULL,                    -- the receiver's id for it (a Grafana annotation id), '' if none
        delivered $REAL NOT NULL,
        PRIMARY KEY (exporter, workload, attempt)
    );
    """,
        # 14: a stream state's version: a reduction's write applies only to the state it was computed
        # from, so replicas reducing one stream at once cannot overwrite each other (store/sqlite.py `_arrive`)
        """
    ALTER TABLE stream_state ADD COLUMN version $INTEGER NOT NULL DEFAULT 1;
    """,
        # 15: groups of records without record numbers take the next numbers of their stream on arrival
        # (server/arrival.py); each group's digest is kept for a while, so a retry of it is dropped
        """
    CREATE TABLE stream_batches (
        workload $TEXT NOT NULL,               -- as stream_state's key
        attempt $INTEGER NOT NULL,
        node $TEXT NOT NULL,
        stream $TEXT NOT NULL,
        digest $TEXT NOT NULL,                 -- the group's records as sent, hashed
        received $REAL NOT NULL,
        PRIMARY KEY (workload, attempt, node, stream, digest)
    );
    CREATE INDEX stream_batches_received ON stream_batches (received);
    """,
    )
)
