"""The connectors: the word count through Kafka and NATS JetStream against the generator,
and where its time goes."""

from __future__ import annotations

from .common import fmt, opening, rounds_of, spread, times, verdict

# The connectors' pipelines, in the table's order: (result, label, its half-rate run).
CONNECTOR_ROWS = (
    ("generator", "generator -> null", None),
    ("kafka", "Kafka -> Kafka", "kafka_half"),
    ("kafka", "the same, fetch wait 20 ms", "kafka_half_short_fetch"),
    ("kafka_no_txn", "Kafka -> Kafka, no transactions", None),
    ("jetstream", "JetStream -> JetStream", "jetstream_half"),
)


def _connectors_where(d: dict) -> list[str]:
    """Where the time goes, a line per broker: the runs' operator shares and, when the
    run took the paths apart (``--profile``), their per-record costs."""
    s, apart = d["summary"], d.get("profile") or {}
    kafka, nats = apart.get("kafka", {}), apart.get("jetstream", {})

    def cpu(part: dict, name: str) -> float:
        return part.get(name, {}).get("client_cpu_us_per_record") or 0.0

    ops = s["kafka"]["operators"]
    line = (
        f"Kafka: sources backpressured "
        f"{ops['sentences']['backpressure'] or 0:.0%}, sinks busy {ops['sink']['busy'] or 0:.0%}, "
        f"tansu {s['kafka']['broker_cpu']['median'] or 0:.2f} cores"
    )
    if "workers_cpu" in s["kafka"]:
        line += f", workers {s['kafka']['workers_cpu']['median'] or 0:.2f} of 2 cores"
    if kafka:
        line += (
            f"; CPU per record written "
            f"{cpu(kafka, 'KafkaSinkWriter: encode, transaction'):.1f} µs (JSON "
            f"{cpu(kafka, 'encode JSON'):.1f}), per sentence read "
            f"{cpu(kafka, 'KafkaPartitionReader.poll (both)'):.1f} µs"
        )
    lines = [line + "."]
    if nats:
        read = cpu(nats, "JetStreamReader.poll (fetch, decode)")
        write = cpu(nats, "JetStreamWriter: encode, publish acknowledged")
        cap = round(2e6 / (read / 8 + write)) if read or write else None
        lines.append(
            f"JetStream: nats-py CPU {read:.0f} µs per sentence read, {write:.0f} µs per record "
            f"published: at most {fmt(cap)} words/s on 2 cores."
        )
    return lines


CONNECTORS_TITLE = "Connectors"


def _connectors_missed(d: dict) -> list[str]:
    s = d["summary"]
    return [
        f"{broker} {', '.join(k for k, ok in s[key]['met'].items() if not ok)}"
        for broker, key in (("Kafka", "kafka"), ("JetStream", "jetstream"))
        if not all(s[key]["met"].values())
    ]


def connectors_verdict(d: dict) -> str:
    missed = _connectors_missed(d)
    return "met" if not missed else f"missed: {'; '.join(missed)}"


def _connectors_reason(d: dict) -> str:
    """Why the connectors fall short, from what the run measured."""
    k = d["summary"]["kafka"]
    reasons = []
    if "workers_cpu" in k:
        used = k["workers_cpu"]["median"] or 0
        reasons.append(f"CPU-bound: workers use {used:.2f} of 2 cores")
    reasons.append("Kafka latency: tansu answers a fetch at librdkafka's 500 ms wait")
    return "; ".join(reasons)


def connectors_section(d: dict) -> list[str]:
    """The word count through each broker against the generator, and why it falls short."""
    s, targets = d["summary"], d["targets"]
    low, high = (f(r["load_average"][0] for r in d["rounds"]) for f in (min, max))
    load = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"
    rows = []
    for name, label, half in CONNECTOR_ROWS:
        latency = s.get(half) if half else None
        shown = name != "kafka" or half == "kafka_half"  # the second Kafka row: latency only
        rows.append(
            f"| {label} | {spread(s[name]['words_per_s'], 0) if shown else ''} | "
            f"{times(s[name].get('ratio', {})) if shown and name != 'generator' else ''} | "
            + (
                f"{fmt(latency['p50_ms']['median'])} / {spread(latency['p99_ms'])}"
                if latency
                else ""
            )
            + " |"
        )
    return [
        *opening(
            CONNECTORS_TITLE,
            f"Word count on {d['workers']} local workers, checkpoints every "
            f"{d['checkpoint_interval_s']:g} s, {d['sentences']:,} sentences from tansu "
            f"({d['partitions']} partitions) or JetStream ({d['partitions']} subjects) back "
            "to it, against the generator in the same rounds; latency at half rate from the "
            f"producer's write; {rounds_of(d['rounds_run'])}, load {load}.",
            d["command"],
        ),
        "| pipeline | words/s [range] | / generator | p50 / p99 [range] ms at half rate |",
        "|---|---|---|---|",
        *rows,
        "",
        *verdict(
            f"{targets['ratio']:.0%} of the generator's words/s, p99 under "
            f"{targets['p99_ms']:g} ms",
            ["; ".join(_connectors_missed(d))] if _connectors_missed(d) else [],
            _connectors_reason(d),
        ),
        *(line for where in _connectors_where(d) for line in (where, "")),
    ]
