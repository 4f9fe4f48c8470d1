"""What a MySQL account may do on a table, from its ``SHOW GRANTS`` lines.

Global (``*.*``), database (``db``.*, where ``_`` and ``%`` are wildcards
unless escaped, as MySQL matches them) and table grants count. Column
grants (``UPDATE (col)``) do not give the table, and grants through roles
are not followed: a ``GRANT role TO user`` line is reported as such, so the
caller can say that it could not see through it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

ALL = frozenset(
    {
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
        "CREATE",
        "DROP",
        "REFERENCES",
        "INDEX",
        "ALTER",
        "CREATE TEMPORARY TABLES",
        "LOCK TABLES",
        "EXECUTE",
        "CREATE VIEW",
        "SHOW VIEW",
        "CREATE ROUTINE",
        "ALTER ROUTINE",
        "EVENT",
        "TRIGGER",
        "DELETE HISTORY",
    }
)
DDL = frozenset({"CREATE", "DROP", "ALTER", "INDEX"})

_GRANT = re.compile(
    r"GRANT\s+(?P<privileges>.+?)\s+ON\s+(?:(?:TABLE|FUNCTION|PROCEDURE|PACKAGE(?: BODY)?)\s+)?"
    r"(?P<target>\S+)\s+TO\s",
    re.IGNORECASE | re.DOTALL,
)
_ROLE = re.compile(r"GRANT\s+(?!.*\sON\s).+\s+TO\s", re.IGNORECASE | re.DOTALL)
_NAME = r"(?:`(?:[^`]|``)*`|[^.`\s]+|\*)"
_TARGET = re.compile(rf"(?P<db>{_NAME})(?:\.(?P<table>{_NAME}))?\Z")


@dataclass(frozen=True)
class Grant:
    privileges: frozenset[str]
    # None: every database / table ("*").
    database: str | None
    table: str | None


@dataclass(frozen=True)
class Grants:
    grants: tuple[Grant, ...]
    roles: bool  # some line grants a role, which is not followed

    def on(self, database: str, table: str) -> frozenset[str]:
        """The privileges the account has on ``database``.``table``."""
        found: set[str] = set()
        for grant in self.grants:
            if grant.database is None:
                found |= grant.privileges
            elif grant.table is None:
                if _pattern_matches(grant.database, database):
                    found |= grant.privileges
            elif grant.database == database and grant.table == table:
                found |= grant.privileges
        return frozenset(found)


def _unquote(name: str) -> str | None:
    if name == "*":
        return None
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


def _privileges(text: str) -> frozenset[str]:
    # Drop column lists ("UPDATE (a, b)"): a column grant does not give the table.
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    found: set[str] = set()
    for part in parts:
        words = " ".join(part.split()).upper()
        if "(" in words:
            continue
        if words in ("ALL", "ALL PRIVILEGES"):
            found |= ALL
        elif words and words != "USAGE":
            found.add(words)
    return frozenset(found)


def _pattern_matches(pattern: str, database: str) -> bool:
    """MySQL's database-name matching in grants: ``_`` any one character,
    ``%`` any run, a backslash escapes either."""
    regex, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            regex += re.escape(pattern[i + 1])
            i += 2
            continue
        regex += "." if char == "_" else ".*" if char == "%" else re.escape(char)
        i += 1
    return re.fullmatch(regex, database) is not None


def parse_grants(lines: Iterable[str]) -> Grants:
    grants, roles = [], False
    for line in lines:
        match = _GRANT.match(line.strip())
        if match is None:
            roles = roles or _ROLE.match(line.strip()) is not None
            continue
        target = _TARGET.match(match.group("target"))
        if target is None:
            continue
        database = _unquote(target.group("db"))
        table = _unquote(target.group("table")) if target.group("table") else None
        if database is not None and target.group("table") is None:
            continue  # "ON name": a routine or a proxy, not a database
        grants.append(Grant(_privileges(match.group("privileges")), database, table))
    return Grants(tuple(grants), roles)
