"""kafka-python (a pure-Python Kafka client, not librdkafka) against the onceflow broker.

Usage: kafka_python_roundtrip.py BOOTSTRAP TOPIC COUNT [MODE]

MODE "produce-consume" (default): produce COUNT records (key, value, headers, timestamp) with
an idempotent gzip producer, check each acknowledged offset, consume the topic from the
beginning (assign, no group) and check every record. MODE "offsets": produce the same and look
offsets up (beginning, end, by timestamp: ListOffsets). MODE "consume-only": read COUNT records that a Rust (rdkafka) producer
wrote and check them against the same deterministic pattern. MODE "admin": the admin client
creates TOPIC with COUNT partitions and replication factor 3, describes it and its configs,
deletes it.
Prints one JSON line with what was checked; exits non-zero on any mismatch.
"""

import json
import sys
import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

DEADLINE_S = 40.0


def record(i):
    key = f"py-key-{i}".encode()
    value = (f"py-value-{i}-" * 8).encode()
    headers = [("n", str(i).encode()), ("src", b"kafka-python")]
    ts = 1_700_000_000_000 + i
    return key, value, headers, ts


def produce(bootstrap, topic, count):
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type="gzip",
        linger_ms=5,
        request_timeout_ms=10000,
        max_block_ms=20000,
    )
    futures = []
    for i in range(count):
        key, value, headers, ts = record(i)
        futures.append(producer.send(topic, key=key, value=value, headers=headers, partition=0, timestamp_ms=ts))
    producer.flush(timeout=30)
    offsets = [f.get(timeout=30).offset for f in futures]
    producer.close(timeout=10)
    if offsets != list(range(offsets[0], offsets[0] + count)):
        raise SystemExit(f"acknowledged offsets are not consecutive: {offsets[:10]}...")
    return offsets[0]


def consume(bootstrap, topic, count, check):
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=2000,
        fetch_max_wait_ms=100,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    seen = []
    start = time.monotonic()
    while len(seen) < count:
        if time.monotonic() - start > DEADLINE_S:
            raise SystemExit(f"timed out after {len(seen)} of {count} records")
        batch = consumer.poll(timeout_ms=500)
        for msgs in batch.values():
            for m in msgs:
                seen.append(m)
    consumer.close()
    for i, m in enumerate(seen[:count]):
        check(i, m)
    return len(seen)


def check_python_record(i, m):
    key, value, headers, ts = record(i)
    if m.offset != i:
        raise SystemExit(f"record {i} at offset {m.offset}")
    if (m.key, m.value, list(m.headers), m.timestamp) != (key, value, headers, ts):
        raise SystemExit(f"record {i} differs: {m}")


def check_rust_record(i, m):
    # The pattern of TestRecord::numbered(0, i, 64) in broker/tests/common/clients.rs.
    key = f"key-0-{i}".encode()
    seed = f"value-0-{i}-".encode()
    value = (seed * (64 // len(seed) + 1))[:64]
    headers = [("n", i.to_bytes(8, "big")), ("p", (0).to_bytes(4, "big"))]
    if m.offset != i:
        raise SystemExit(f"record {i} at offset {m.offset}")
    if (m.key, m.value, list(m.headers), m.timestamp) != (key, value, headers, 1_700_000_000_000 + i):
        raise SystemExit(f"rust record {i} differs: {m}")


def offsets(bootstrap, topic, count):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    tp = TopicPartition(topic, 0)
    begin = consumer.beginning_offsets([tp])[tp]
    end = consumer.end_offsets([tp])[tp]
    middle = count // 2
    by_time = consumer.offsets_for_times({tp: 1_700_000_000_000 + middle})[tp]
    after = consumer.offsets_for_times({tp: 1_700_000_000_000 + count + 10})[tp]
    consumer.close()
    if (begin, end) != (0, count):
        raise SystemExit(f"beginning/end offsets {begin}/{end}, expected 0/{count}")
    # Kafka answers with the first RECORD whose timestamp is >= the target (it looks inside the
    # batch), and that record's timestamp; librdkafka's test 0054_offset_time checks the same.
    want = (middle, 1_700_000_000_000 + middle)
    if by_time is None or (by_time.offset, by_time.timestamp) != want:
        raise SystemExit(f"offsets_for_times(ts of record {middle}) = {by_time}, expected offset/timestamp {want}")
    if after is not None:
        raise SystemExit(f"offsets_for_times(after the last record) = {after}, expected None")
    return {"begin": begin, "end": end, "by_time": by_time.offset}


def admin(bootstrap, topic, partitions):
    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    created = client.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=3)])
    errors = [t for t in created["topics"] if t["error_code"] != 0]
    if errors:
        raise SystemExit(f"create_topics: {errors}")
    if topic not in client.list_topics():
        raise SystemExit("created topic not listed")
    described = client.describe_topics([topic])
    got = len(described[0]["partitions"])
    if described[0]["error_code"] != 0 or got != partitions:
        raise SystemExit(f"describe_topics: {described}")
    configs = client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    topic_configs = configs["topic"][topic]
    if not topic_configs:
        raise SystemExit(f"describe_configs returned no configs: {configs}")
    deleted = client.delete_topics([topic])
    if any(t["error_code"] != 0 for t in deleted["topics"]):
        raise SystemExit(f"delete_topics: {deleted}")
    if topic in client.list_topics():
        raise SystemExit("deleted topic still listed")
    client.close()
    return {"partitions": got, "configs": sorted(topic_configs)[:5]}


def main():
    bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "produce-consume"
    if mode == "produce-consume":
        first = produce(bootstrap, topic, count)
        if first != 0:
            raise SystemExit(f"first offset {first}, expected 0 on a fresh topic")
        read = consume(bootstrap, topic, count, check_python_record)
        print(json.dumps({"mode": mode, "produced": count, "consumed": read}))
    elif mode == "offsets":
        produce(bootstrap, topic, count)
        print(json.dumps({"mode": mode, "offsets": offsets(bootstrap, topic, count)}))
    elif mode == "consume-only":
        read = consume(bootstrap, topic, count, check_rust_record)
        print(json.dumps({"mode": mode, "consumed": read}))
    elif mode == "admin":
        print(json.dumps({"mode": mode, "admin": admin(bootstrap, topic, count)}))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
