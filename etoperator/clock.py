"""Time as the operator keeps it: naive datetimes that are UTC, written as RFC 3339 'Z' stamps,
whatever the machine's time zone."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def iso(t: datetime) -> str:
    """A naive `t` is UTC already; an aware one is converted."""
    if t.tzinfo is not None:
        t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_micro(t: datetime) -> str:
    """A MicroTime stamp (Lease renewals): RFC 3339 with microseconds."""
    if t.tzinfo is not None:
        t = t.astimezone(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(s: str | None) -> datetime | None:
    if not s:
        return None
    try:
        return datetime.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
