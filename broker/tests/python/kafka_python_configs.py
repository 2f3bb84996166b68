"""Topic configs through kafka-python's admin client (a client that is not librdkafka).

Usage: kafka_python_configs.py BOOTSTRAP TOPIC MODE

MODE "alter": creates TOPIC with retention.ms, changes configs with IncrementalAlterConfigs
(kafka-python's default) and with AlterConfigs (incremental=False), checks that a bad value
and an unknown name are refused with InvalidConfig and change nothing, that validate_only
changes nothing, and that describe_configs reports what was set as DYNAMIC_TOPIC_CONFIG.
MODE "check": describes TOPIC and checks the configs "alter" left (after a broker restart).
Prints one JSON line with the configs it saw; exits non-zero with a message on any mismatch.
"""

import json
import sys

from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

EXPECTED = {"retention.ms": "7200000", "retention.bytes": "10000", "compression.type": "lz4"}


def modified(client, topic):
    described = client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    configs = described["topic"][topic]
    for name, config in configs.items():
        if config["config_source"] != "DYNAMIC_TOPIC_CONFIG":
            raise SystemExit(f"{name} reported with source {config['config_source']}")
    return {name: config["value"] for name, config in configs.items()}


def alter(client, topic, configs, **kwargs):
    result = client.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)], **kwargs)
    return result["topic"][topic]


def expect_refused(client, topic, configs, before, **kwargs):
    result = alter(client, topic, configs, **kwargs)
    if "InvalidConfig" not in result:
        raise SystemExit(f"{configs} {kwargs}: expected InvalidConfig, got {result!r}")
    if modified(client, topic) != before:
        raise SystemExit(f"refused change {configs} changed the configs")


def alter_mode(client, topic):
    created = client.create_topics([NewTopic(topic, 1, 1, topic_configs={"retention.ms": "3600000"})])
    if any(t["error_code"] != 0 for t in created["topics"]):
        raise SystemExit(f"create_topics: {created}")
    if modified(client, topic) != {"retention.ms": "3600000"}:
        raise SystemExit(f"created configs: {modified(client, topic)}")
    # IncrementalAlterConfigs (SET), the admin client's default on brokers that offer it.
    result = alter(client, topic, {"retention.bytes": "10000", "compression.type": "lz4"})
    if result != "OK":
        raise SystemExit(f"incremental alter: {result}")
    step = {"retention.ms": "3600000", "retention.bytes": "10000", "compression.type": "lz4"}
    if modified(client, topic) != step:
        raise SystemExit(f"after incremental alter: {modified(client, topic)}")
    expect_refused(client, topic, {"retention.ms": "soon"}, step)
    expect_refused(client, topic, {"cleanup.policy": "shred"}, step)
    result = alter(client, topic, {"retention.ms": "1"}, validate_only=True)
    if result != "OK" or modified(client, topic) != step:
        raise SystemExit(f"validate_only: {result} {modified(client, topic)}")
    # AlterConfigs (whole set; kafka-python adds the configs already set so none is reset).
    result = alter(client, topic, {"retention.ms": "7200000"}, incremental=False)
    if result != "OK":
        raise SystemExit(f"non-incremental alter: {result}")
    expect_refused(client, topic, {"retention.ms": "soon"}, EXPECTED, incremental=False)
    return modified(client, topic)


def main():
    bootstrap, topic, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    seen = alter_mode(client, topic) if mode == "alter" else modified(client, topic)
    client.close()
    if seen != EXPECTED:
        raise SystemExit(f"{mode}: configs {seen}, expected {EXPECTED}")
    print(json.dumps({"mode": mode, "configs": seen}, sort_keys=True))


if __name__ == "__main__":
    main()
