#!/usr/bin/env bash
# kafka-node.sh DIR PORT CONTROLLER_PORT [ADVERTISED] — runs one Apache Kafka KRaft node (broker
# and controller in one process) in the foreground, on 127.0.0.1 only, its state under DIR:
#   DIR/server.properties  written on every start, from the arguments
#   DIR/data/              the log, formatted (kafka.tools.StorageTool) on the first start only
# Clients reach it at 127.0.0.1:PORT and are told to come back at ADVERTISED (host:port, a proxy
# in front of it) when given. The broker logs to stdout: redirect it.
#
# The settings are one node's: replication factors of 1 for offsets and transaction state, no
# initial rebalance delay, a log cleaner that looks every second (so a compacted topic with small
# segments is cleaned within seconds), and fewer internal partitions than a cluster's 50.
# The stack's node (scripts/stack.sh) and the brokers tests and the lab start of their own
# (sluice::lab::fixture::PrivateBroker) are all started here.
#
# Heap: SLUICE_STACK_KAFKA_HEAP (512m). More JVM options: SLUICE_STACK_KAFKA_OPTS (the tests' and
# the lab's own nodes pass -XX:TieredStopAtLevel=1). Java: JAVA (java; Kafka 4 needs 17+).
# The class-data archive install-kafka.sh made (the broker's classes, parsed once) is used when it
# is there: a node starts on about a third of the CPU time.
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 DIR PORT CONTROLLER_PORT [ADVERTISED]" >&2; exit 2; }
DIR="$1" PORT="$2" CPORT="$3" ADVERTISED="${4:-127.0.0.1:$2}"
# install-kafka.sh sets SLUICE_KAFKA_LIBS when it runs a node itself (to make the archive).
LIBS="${SLUICE_KAFKA_LIBS:-$("$(dirname "${BASH_SOURCE[0]}")/install-kafka.sh")}"
JAVA="${JAVA:-java}"
mkdir -p "$DIR/data"
cat >"$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://$ADVERTISED
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DIR/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.cleaner.backoff.ms=1000
log.segment.delete.delay.ms=1000
PROPS
cat >"$DIR/log4j2.properties" <<'LOG'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
LOG
JOPTS=(-Xms128m "-Xmx${SLUICE_STACK_KAFKA_HEAP:-512m}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20
       -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true
       "-Dlog4j2.configurationFile=$DIR/log4j2.properties" -cp "$LIBS/*")
if [ -n "${SLUICE_KAFKA_ARCHIVE_AT_EXIT:-}" ]; then
  JOPTS+=("-XX:ArchiveClassesAtExit=$SLUICE_KAFKA_ARCHIVE_AT_EXIT")
elif [ -f "$LIBS/../classes.jsa" ]; then
  JOPTS+=("-XX:SharedArchiveFile=$LIBS/../classes.jsa" -Xshare:auto)
fi
# shellcheck disable=SC2206 # options, split as a shell splits words
JOPTS+=(${SLUICE_STACK_KAFKA_OPTS:-})
if [ ! -f "$DIR/data/meta.properties" ]; then
  # The cluster id is any 16 bytes in URL-safe base64 (22 characters); one per node.
  "$JAVA" "${JOPTS[@]/-XX:ArchiveClassesAtExit=*/-Xshare:auto}" kafka.tools.StorageTool format --ignore-formatted \
    --cluster-id="$(head -c 16 /dev/urandom | base64 | tr "+/" "-_" | cut -c1-22)" --config "$DIR/server.properties"
fi
exec "$JAVA" "${JOPTS[@]}" kafka.Kafka "$DIR/server.properties"
