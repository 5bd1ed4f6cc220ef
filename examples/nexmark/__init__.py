"""Nexmark, the standard benchmark of stream processing, on streampilot.

- :mod:`.model`: the events, :class:`Person`, :class:`Auction`, :class:`Bid`.
- :mod:`.generator`: :class:`GeneratorConfig`, the standard generator as a pure function
  of (config, event number).
- :mod:`.source`: :class:`Nexmark`, the stream as a partitioned, paced, replayable source.
- :mod:`.reference`: the queries (q0-q5, q7, q8, q11) in plain Python over a list of events.
- :mod:`.queries`: the queries that run as streampilot jobs (q0, q1, q2).
"""

from .generator import GeneratorConfig
from .model import Auction, Bid, Event, Person
from .source import Nexmark, NexmarkReader

__all__ = ["Auction", "Bid", "Event", "GeneratorConfig", "Nexmark", "NexmarkReader", "Person"]
