"""SQL written once for SQLite and PostgreSQL: the store's query layer.

    sql(*parts) → Statement     a statement, rendered for both dialects when it is first defined
    Statement                   a str holding SQLite's text (sqlite3 takes it as it is) + `.postgres`
    json_text(column, *path)    one member of a JSON document held in a text column, as text
    placeholders(n)             "?, ?, ?": the placeholders of an IN list of n values
    ddl(template) → Migration   a migration's statements for both dialects ($ID $INTEGER $REAL $TEXT,
                                $DESC_NULLS_LAST)

Most of what differs between the two dialects has a spelling both take (SQLite 3.30 or newer),
and the store's statements use it, so there is nothing to render:

    insert, ignoring a duplicate     INSERT INTO t (…) VALUES (…) ON CONFLICT DO NOTHING
                                     (not SQLite's INSERT OR IGNORE)
    upsert                           ON CONFLICT (key) DO UPDATE SET x = excluded.x; the row already
                                     there is `t.x`, never a bare `x` (ambiguous in PostgreSQL)
    an id next to text               CAST(attempt_id AS TEXT) (PostgreSQL does not mix the types)
    HAVING                           on the aggregate, COUNT(*) > ?, not on its select alias
    ORDER BY a nullable column       NULLS FIRST ascending, NULLS LAST descending: SQLite's own
                                     order, written out because PostgreSQL's default is the reverse
    LIKE                             lower() on both sides (PostgreSQL's LIKE is case-sensitive)

What has no common spelling is a construct here, rendered per dialect once:

    placeholders     `?` in the text; `%s` for psycopg (and a literal % doubled). A `?` inside a
                     quoted literal is refused: pass the value as a parameter.
    JSON members     json_text("body", "root_cause", "components") is, in SQLite,
                     json_extract(body, '$.root_cause.components'), and in PostgreSQL
                     (body::jsonb #>> '{root_cause,components}')
    column types     in migrations: $ID (rowid alias / identity), $INTEGER (PostgreSQL BIGINT: times
                     are nanoseconds), $REAL (DOUBLE PRECISION), $TEXT (PostgreSQL TEXT COLLATE "C":
                     text sorts by its bytes, as in SQLite, whatever the database's locale, so a
                     diagnosis does not depend on where it was stored)
    index order      in migrations: $DESC_NULLS_LAST, a descending index column in the order the
                     statements' `DESC NULLS LAST` reads it (SQLite refuses NULLS in an index and
                     already orders so; PostgreSQL's plain DESC puts NULLs first, and a query in
                     the other order would sort the whole table instead of reading the index)

A `Statement` is a `str` so that SQLite's path costs nothing: `SQLiteStore` hands it to sqlite3
unchanged, and `PostgresStore`'s connection reads `.postgres` (a plain string there is a
TypeError: every statement of the shared store goes through `sql`). Rendering is cached by the
statement's parts, so a statement written inline at its call site is rendered once.

A new statement is written where it runs, in the spellings above:
`db.execute(sql("UPDATE attempts SET dirty=1 WHERE id=?"), (aid,))`, or for a JSON member
`sql("SELECT ", json_text("body", "a", "b"), " FROM diagnoses WHERE id=?")`; an IN list is
`sql(f"… IN ({placeholders(len(ids))})")`. This module knows no table and runs nothing: the
statements stay beside the store methods that run them (store/sqlite.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from string import Template


@dataclass(frozen=True, slots=True)
class Construct:
    """A piece of a statement spelled differently in each dialect."""

    sqlite: str
    postgres: str


class Statement(str):
    """SQLite's text of a statement (a str: sqlite3 executes it as it is) with PostgreSQL's beside it."""

    postgres: str


def _postgres(text: str) -> str:
    quoted = text.split("'")[1::2]
    if any("?" in literal for literal in quoted):
        raise ValueError(
            f"a '?' inside a quoted literal reads as a placeholder; pass it as a parameter: {text!r}"
        )
    return text.replace("%", "%%").replace("?", "%s")


@lru_cache(maxsize=2048)
def sql(*parts: str | Construct) -> Statement:
    """A statement from portable text (with `?` placeholders) and constructs such as `json_text`."""
    statement = Statement("".join(p if isinstance(p, str) else p.sqlite for p in parts))
    statement.postgres = "".join(_postgres(p) if isinstance(p, str) else p.postgres for p in parts)
    return statement


def json_text(column: str, *path: str) -> Construct:
    """A member of the JSON document in `column` (a text column), as text; NULL when it is missing."""
    return Construct(
        f"json_extract({column}, '$.{'.'.join(path)}')", f"({column}::jsonb #>> '{{{','.join(path)}}}')"
    )


def placeholders(n: int) -> str:
    """The placeholders of an IN list of `n` values (the caller makes sure n > 0: `IN ()` is not SQL)."""
    return ", ".join("?" * n)


# --------------------------------------------------------------------------------------------- migrations

_TYPES = {
    "sqlite": {
        "ID": "INTEGER PRIMARY KEY",
        "INTEGER": "INTEGER",
        "REAL": "REAL",
        "TEXT": "TEXT",
        "DESC_NULLS_LAST": "DESC",
    },
    "postgres": {
        "ID": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
        "INTEGER": "BIGINT",
        "REAL": "DOUBLE PRECISION",
        "TEXT": 'TEXT COLLATE "C"',
        "DESC_NULLS_LAST": "DESC NULLS LAST",
    },
}


class Migration(str):
    """One schema version: SQLite's script (a str, as `executescript` takes it), its statements in
    each dialect's column types, and the template they were rendered from."""

    template: str
    sqlite: tuple[str, ...]
    postgres: tuple[str, ...]


def _statements(text: str) -> tuple[str, ...]:
    # `;` ends a statement (none is inside a comment or literal); a piece that holds only comments
    # is no statement (PostgreSQL refuses an empty query)
    pieces = (s.strip() for s in text.split(";"))
    return tuple(
        s
        for s in pieces
        if any(line.strip() and not line.strip().startswith("--") for line in s.splitlines())
    )


def ddl(template: str) -> Migration:
    """A migration written with $ID, $INTEGER, $REAL and $TEXT for its column types."""
    t = Template(template)
    migration = Migration(t.substitute(_TYPES["sqlite"]))
    migration.template = template
    migration.sqlite = _statements(migration)
    migration.postgres = _statements(t.substitute(_TYPES["postgres"]))
    return migration
