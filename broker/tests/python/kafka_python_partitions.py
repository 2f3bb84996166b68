"""kafka-python's admin client (not librdkafka) against the onceflow broker's admin APIs.

Usage: kafka_python_partitions.py BOOTSTRAP TOPIC

1. create_partitions: TOPIC is created with 1 partition and grown to 3 (validate_only first,
   which must change nothing; a smaller count must fail with InvalidPartitionsError);
   describe_topics shows the count; a record written to the new partition 2 is read back.
2. KIP-664: a transactional producer writes to partition 2 and never ends its transaction;
   list_transactions (by state, by producer id, with duration_filter_ms), describe_transactions
   and describe_producers report it; abort_transaction (WriteTxnMarkers) aborts it from the
   admin side; a read_committed consumer then reads a record written after it.

Prints one JSON line with what was checked; exits non-zero on any mismatch.
"""

import json
import sys
import time

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import AbortTransactionSpec, NewTopic, TransactionState

DEADLINE_S = 40.0


def check(cond, what):
    if not cond:
        raise SystemExit(f"check failed: {what}")


def partition_count(admin, topic):
    described = admin.describe_topics([topic])
    check(len(described) == 1, f"describe_topics answered {described}")
    return len(described[0]["partitions"])


def read_committed(bootstrap, tp, until_value):
    """Reads tp read_committed from the start until `until_value` arrives."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=500,
    )
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = []
    deadline = time.monotonic() + DEADLINE_S
    while until_value not in values:
        check(time.monotonic() < deadline, f"read_committed stuck at {values}")
        for msg in consumer:
            values.append(msg.value.decode())
    consumer.close()
    return values


def grow(bootstrap, admin, topic):
    admin.create_topics([NewTopic(topic, 1, 1)])
    check(partition_count(admin, topic) == 1, "new topic has 1 partition")
    admin.create_partitions({topic: 3}, validate_only=True)
    check(partition_count(admin, topic) == 1, "validate_only changed the count")
    try:
        admin.create_partitions({topic: 1})
        raise SystemExit("shrinking to 1 partition was accepted")
    except Errors.InvalidPartitionsError:
        pass
    admin.create_partitions({topic: 3})
    count = partition_count(admin, topic)
    check(count == 3, f"describe_topics shows {count} partitions after growing to 3")
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    producer.send(topic, b"on-new-partition", partition=2).get(timeout=DEADLINE_S)
    producer.close()
    values = read_committed(bootstrap, TopicPartition(topic, 2), "on-new-partition")
    check(values == ["on-new-partition"], f"partition 2 holds {values}")
    return count


def hanging_transaction(bootstrap, admin, topic):
    tp = TopicPartition(topic, 2)
    txn = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id="py-hanging", transaction_timeout_ms=60000
    )
    txn.init_transactions()
    txn.begin_transaction()
    txn.send(topic, b"never-committed", partition=2).get(timeout=DEADLINE_S)
    plain = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    plain.send(topic, b"after-hanging", partition=2).get(timeout=DEADLINE_S)
    plain.close()

    listed = [t for ts in admin.list_transactions(state_filters=["Ongoing"]).values() for t in ts]
    check([t.transactional_id for t in listed] == ["py-hanging"], f"listed {listed}")
    pid = listed[0].producer_id
    by_pid = [t for ts in admin.list_transactions(producer_id_filters=[pid]).values() for t in ts]
    check([t.transactional_id for t in by_pid] == ["py-hanging"], f"by producer id {by_pid}")
    long_running = admin.list_transactions(duration_filter_ms=3_600_000)
    check(all(not ts for ts in long_running.values()), f"duration filter {long_running}")

    desc = admin.describe_transactions(["py-hanging"])["py-hanging"]
    check(desc.state == TransactionState.ONGOING, f"state {desc.state}")
    check(desc.producer_id == pid, "describe and list agree on the producer id")
    check(desc.topic_partitions == {tp}, f"partitions {desc.topic_partitions}")
    check(desc.transaction_timeout_ms == 60000, f"timeout {desc.transaction_timeout_ms}")

    producers = admin.describe_producers([tp])[tp].active_producers
    open_ones = [p for p in producers if p.current_transaction_start_offset >= 0]
    check(len(open_ones) == 1 and open_ones[0].producer_id == pid, f"producers {producers}")
    hanging = open_ones[0]
    check(hanging.producer_epoch == desc.producer_epoch, "epochs agree")

    admin.abort_transaction(
        AbortTransactionSpec(tp, hanging.producer_id, hanging.producer_epoch, -1)
    )
    after = admin.describe_transactions(["py-hanging"])["py-hanging"]
    check(after.state == TransactionState.COMPLETE_ABORT, f"state after abort {after.state}")
    values = read_committed(bootstrap, tp, "after-hanging")
    check("never-committed" not in values, f"aborted data visible: {values}")
    try:
        txn.close(timeout=1)
    except Exception:  # the producer was fenced by the abort; closing it may complain
        pass
    return {"producer_id": pid, "read_committed": values, "state_after": after.state.value}


def main():
    bootstrap, topic = sys.argv[1], sys.argv[2]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    out = {"partitions": grow(bootstrap, admin, topic)}
    out["hanging"] = hanging_transaction(bootstrap, admin, topic)
    admin.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
