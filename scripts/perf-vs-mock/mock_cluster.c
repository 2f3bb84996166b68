/* Runs librdkafka's mock cluster (one broker) as a standalone process, so that
 * rdkafka_performance producers and consumers in other processes can share it.
 * Usage: mock_cluster [TOPIC PARTITIONS] (creates the topic first).
 * Prints the bootstrap servers on stdout, then serves until it is killed. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

int main(int argc, char **argv) {
        char errstr[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        if (rd_kafka_conf_set(conf, "test.mock.num.brokers", "1", errstr,
                              sizeof(errstr)) != RD_KAFKA_CONF_OK) {
                fprintf(stderr, "%s\n", errstr);
                return 1;
        }
        rd_kafka_t *rk =
            rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
        if (!rk) {
                fprintf(stderr, "%s\n", errstr);
                return 1;
        }
        rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(rk);
        if (!mc) {
                fprintf(stderr, "no mock cluster\n");
                return 1;
        }
        if (argc == 3 && rd_kafka_mock_topic_create(mc, argv[1], atoi(argv[2]), 1)) {
                fprintf(stderr, "cannot create topic %s\n", argv[1]);
                return 1;
        }
        printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
        fflush(stdout);
        for (;;)
                pause();
}
