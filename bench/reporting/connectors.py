"""The connectors: the word count through Kafka and NATS JetStream against the generator,
and where its time goes."""

from __future__ import annotations

from .common import fmt, rerun, rounds_of, spread, times

# The connectors' pipelines, in the table's order: (result, label, its half-rate run).
CONNECTOR_ROWS = (
    ("generator", "generator -> null", None),
    ("kafka", "Kafka -> Kafka", "kafka_half"),
    ("kafka", "the same, fetch wait 20 ms", "kafka_half_short_fetch"),
    ("kafka_no_txn", "Kafka -> Kafka, no transactions", None),
    ("jetstream", "JetStream -> JetStream", "jetstream_half"),
)


def _connectors_where(d: dict) -> list[str]:
    """Two lines on where the time goes, from the runs' operator shares and, when the
    run took the paths apart (``--profile``), their per-record costs."""
    s, apart = d["summary"], d.get("profile") or {}
    kafka, nats = apart.get("kafka", {}), apart.get("jetstream", {})

    def cpu(part: dict, name: str) -> float:
        return part.get(name, {}).get("client_cpu_us_per_record") or 0.0

    ops = s["kafka"]["operators"]
    line = (
        f"Kafka: sources backpressured {ops['sentences']['backpressure'] or 0:.0%}, sinks busy "
        f"{ops['sink']['busy'] or 0:.0%}, tansu {s['kafka']['broker_cpu']['median'] or 0:.2f} cores"
    )
    if kafka:
        line += (
            f"; alone, a count record costs the sink "
            f"{cpu(kafka, 'KafkaSinkWriter: encode, transaction'):.1f} µs of CPU (JSON "
            f"{cpu(kafka, 'encode JSON'):.1f}), a sentence the reader "
            f"{cpu(kafka, 'KafkaPartitionReader.poll (both)'):.1f} µs"
        )
    lines = [
        line + f". The workers use {s['kafka']['workers_cpu']['median'] or 0:.2f} of the 2 "
        "cores: the pipeline is CPU-bound. At half rate the p50 is tansu's (it answers a "
        "fetch when librdkafka's 500 ms wait is up); what is left of the p99 with a 20 ms "
        "wait was not taken apart."
        if "workers_cpu" in s["kafka"]
        else line + ". At half rate the p50 is tansu's (it answers a fetch when librdkafka's "
        "500 ms wait is up)."
    ]
    if nats:
        read = cpu(nats, "JetStreamReader.poll (fetch, decode)")
        write = cpu(nats, "JetStreamWriter: encode, publish acknowledged")
        cap = round(2e6 / (read / 8 + write)) if read or write else None
        lines.append(
            f"JetStream: nats-py takes {read:.0f} µs of CPU per sentence read, {write:.0f} µs per "
            f"record published and acknowledged: with 2 cores, {fmt(cap)} words/s at most "
            "before the broker's share. Commits run off the worker's loop."
        )
    return lines


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
    missed = [
        f"{broker} {', '.join(k for k, ok in s[key]['met'].items() if not ok)}"
        for broker, key in (("Kafka", "kafka"), ("JetStream", "jetstream"))
        if not all(s[key]["met"].values())
    ]
    return [
        "## Connectors: Kafka and NATS JetStream",
        "",
        f"Word count on {d['workers']} local workers, checkpoints every "
        f"{d['checkpoint_interval_s']:g} s, from {d['sentences']:,} sentences in a tansu topic "
        f"(memory storage, {d['partitions']} partitions) or a JetStream stream "
        f"({d['partitions']} subjects) to a topic or stream; the generator pipeline in the "
        "same rounds. Latency at half rate, from the producer's write. Medians of "
        f"{rounds_of(d['rounds_run'])}, load {load}. {rerun(d['command'])}",
        "",
        "| pipeline | words/s [range] | / generator | p50 / p99 [range] ms at half rate |",
        "|---|---|---|---|",
        *rows,
        "",
        f"**Targets:** {targets['ratio']:.0%} of the generator's words/s, p99 under "
        f"{targets['p99_ms']:g} ms. " + (f"Missed: {'; '.join(missed)}." if missed else "Met."),
        "",
        *(line for where in _connectors_where(d) for line in (where, "")),
    ]
