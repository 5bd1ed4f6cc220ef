"""The three Nexmark event types: a person registers, opens auctions, and bids on them.

Records of the standard (Beam's ``org.apache.beam.sdk.nexmark.model`` and nexmark-flink's
``Person`` / ``Auction`` / ``Bid``), with the standard's fields in snake case. Times
(``date_time``, ``expires``) are epoch milliseconds; prices are in cents.

Each type is a frozen dataclass with slots, hashable and ordered by its fields, so query
outputs sort and compare exactly. They cross workers through :mod:`runtime.codec`, which
pickles what msgpack does not know: ``__reduce__`` keeps that pickle to the class and a
tuple of the values (no field names, no ``__setstate__``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Auction", "Bid", "Event", "Person", "kind_of"]


@dataclass(frozen=True, slots=True, order=True)
class Person:
    """Someone who registered: the seller of auctions, a bidder (``id`` from 1000)."""

    id: int
    name: str
    email_address: str
    credit_card: str
    city: str
    state: str
    date_time: int
    extra: str

    def __reduce__(self) -> tuple:
        s = self
        return Person, (
            s.id,
            s.name,
            s.email_address,
            s.credit_card,
            s.city,
            s.state,
            s.date_time,
            s.extra,
        )


@dataclass(frozen=True, slots=True, order=True)
class Auction:
    """An item put up for auction by ``seller`` until ``expires`` (``id`` from 1000)."""

    id: int
    item_name: str
    description: str
    initial_bid: int
    reserve: int
    date_time: int
    expires: int
    seller: int
    category: int
    extra: str

    def __reduce__(self) -> tuple:
        s = self
        return Auction, (
            s.id,
            s.item_name,
            s.description,
            s.initial_bid,
            s.reserve,
            s.date_time,
            s.expires,
            s.seller,
            s.category,
            s.extra,
        )


@dataclass(frozen=True, slots=True, order=True)
class Bid:
    """A bid of ``price`` cents by person ``bidder`` on auction ``auction``, coming through
    ``channel`` (a referrer) from ``url``."""

    auction: int
    bidder: int
    price: int
    channel: str
    url: str
    date_time: int
    extra: str

    def __reduce__(self) -> tuple:
        s = self
        return Bid, (s.auction, s.bidder, s.price, s.channel, s.url, s.date_time, s.extra)


Event = Person | Auction | Bid
"""What the generator emits: one of the three, told apart by type."""


def kind_of(event: Event) -> str:
    """``"person"``, ``"auction"`` or ``"bid"``; :class:`TypeError` for anything else."""
    kind = _KINDS.get(type(event))
    if kind is None:
        raise TypeError(f"not a Nexmark event: {type(event).__name__} {event!r}")
    return kind


_KINDS = {Person: "person", Auction: "auction", Bid: "bid"}
