"""kafka-python over TLS / SASL: produce, consume and (when this kafka-python has them)
commit a transaction, or check that the connection is refused.

usage: kafka_python_security.py BOOTSTRAP PROTOCOL TOPIC [key=value ...]
keys: cafile, certfile, keyfile, mechanism, user, password, mode=roundtrip|expect-fail
Prints one JSON line.
"""
import json
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def main():
    bootstrap, protocol, topic = sys.argv[1:4]
    opts = dict(a.split("=", 1) for a in sys.argv[4:])
    common = dict(
        bootstrap_servers=bootstrap,
        security_protocol=protocol,
        request_timeout_ms=20000,
        api_version_auto_timeout_ms=10000,
    )
    if "cafile" in opts:
        common["ssl_cafile"] = opts["cafile"]
        common["ssl_check_hostname"] = True
    if "certfile" in opts:
        common["ssl_certfile"] = opts["certfile"]
        common["ssl_keyfile"] = opts["keyfile"]
    if "mechanism" in opts:
        common["sasl_mechanism"] = opts["mechanism"]
        common["sasl_plain_username"] = opts["user"]
        common["sasl_plain_password"] = opts["password"]
    mode = opts.get("mode", "roundtrip")

    if mode == "expect-fail":
        try:
            producer = KafkaProducer(max_block_ms=8000, **common)
            producer.send(topic, b"never").get(timeout=8)
            print(json.dumps({"failed": False}))
        except Exception as e:  # any refusal counts; the test checks the broker log
            print(json.dumps({"failed": True, "error": type(e).__name__}))
        return

    producer = KafkaProducer(acks="all", **common)
    for i in range(10):
        producer.send(topic, key=b"k", value=("v%d" % i).encode()).get(timeout=30)
    producer.close()
    produced = 10

    transactional = hasattr(KafkaProducer, "init_transactions")
    if transactional:
        txp = KafkaProducer(transactional_id="py-sec-tx-" + topic, **common)
        txp.init_transactions()
        txp.begin_transaction()
        for i in range(5):
            txp.send(topic, key=b"t", value=("t%d" % i).encode())
        txp.commit_transaction()
        txp.close()
        produced += 5

    consumer = KafkaConsumer(
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=2000,
        **common,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = []
    deadline = time.time() + 60
    while len(values) < produced and time.time() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value.decode() for r in records)
    consumer.close()
    print(json.dumps({
        "produced": produced,
        "consumed": len(values),
        "transactional": transactional,
        "values": values,
    }))


if __name__ == "__main__":
    main()
