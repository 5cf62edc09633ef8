#!/usr/bin/env bash
# install-kafka.sh — idempotently fetch the pinned Apache Kafka broker (4.1.2, Scala 2.13) and
# its runtime dependencies from Maven Central with the machine's `mvn`, into
# ${SLUICE_CACHE:-$HOME/.cache/sluice}/kafka-4.1.2/libs (about 45 MB, once; later runs reuse it).
# Prints the libs directory on stdout, nothing else; progress (jars fetched) goes to stderr.
#
# The jars are what Apache Kafka's own binary release puts in libs/ for a broker: kafka_2.13
# (the server, kafka.Kafka and kafka.tools.StorageTool) with its runtime dependencies, plus the
# log4j2 binding for slf4j so the broker's log reaches its file. scripts/kafka-node.sh runs them.
set -euo pipefail
KAFKA_VERSION=4.1.2
LOG4J_VERSION=2.25.3   # the log4j2 that kafka_2.13 4.1.2 depends on
CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
ROOT="$CACHE/kafka-$KAFKA_VERSION"
LIBS="$ROOT/libs"

if [ -f "$ROOT/.complete" ]; then echo "$LIBS"; exit 0; fi
command -v mvn >/dev/null || { echo "install-kafka: mvn not found (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "install-kafka: java not found (Kafka $KAFKA_VERSION needs Java 17+)" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/kafka-install.lock"
flock 9
if [ -f "$ROOT/.complete" ]; then echo "$LIBS"; exit 0; fi
rm -rf "$ROOT"
mkdir -p "$ROOT"
cat >"$ROOT/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>sluice.stack</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>$KAFKA_VERSION</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version>
    </dependency>
  </dependencies>
</project>
POM
echo "install-kafka: fetching Apache Kafka $KAFKA_VERSION and its dependencies from Maven Central, once" \
  "(about 45 MB; log: $ROOT/mvn.log)" >&2
SECONDS=0
rc=0
# -B: plain lines; every "Downloaded from" line is one file fetched.
mvn -B -f "$ROOT/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$LIBS" 2>&1 | tee "$ROOT/mvn.log" \
  | awk '/Downloaded from/ { n++; if (n % 25 == 0) { printf "install-kafka: %d files fetched\n", n > "/dev/stderr"; fflush("/dev/stderr") } }' \
  || rc=$?
if [ $rc -ne 0 ] || ! ls "$LIBS"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1; then
  echo "install-kafka: fetching Apache Kafka $KAFKA_VERSION failed; last 30 lines of $ROOT/mvn.log:" >&2
  tail -30 "$ROOT/mvn.log" >&2
  exit 1
fi
touch "$ROOT/.complete"
echo "install-kafka: Apache Kafka $KAFKA_VERSION ready: $(ls "$LIBS" | wc -l) jars in $LIBS (${SECONDS}s)" >&2
echo "$LIBS"
