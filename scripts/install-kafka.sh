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

if [ -f "$ROOT/.complete" ] && [ -f "$ROOT/.archived" ]; then echo "$LIBS"; exit 0; fi
command -v mvn >/dev/null || { echo "install-kafka: mvn not found (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "install-kafka: java not found (Kafka $KAFKA_VERSION needs Java 17+)" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/kafka-install.lock"
flock 9

# The class-data archive (classes.jsa beside libs/): a node run once, to the point it answers,
# dumps the classes it loaded when it stops; later nodes map them instead of parsing every class
# again (about 10 -> 3.5 CPU seconds and 7 -> 3.5 s to start on 2 cores). Without it a node still
# starts, only slower: a failure here is reported, not fatal.
archive() {
  local dir port pid i
  dir="$(mktemp -d)" port=$((20000 + RANDOM % 20000))
  SLUICE_KAFKA_LIBS="$LIBS" SLUICE_KAFKA_ARCHIVE_AT_EXIT="$ROOT/classes.jsa.tmp" \
    "$(dirname "${BASH_SOURCE[0]}")/kafka-node.sh" "$dir" "$port" $((port + 1)) >"$dir/kafka.log" 2>&1 &
  pid=$!
  for i in $(seq 600); do
    grep -q "Kafka Server started" "$dir/kafka.log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  if [ -s "$ROOT/classes.jsa.tmp" ]; then
    mv "$ROOT/classes.jsa.tmp" "$ROOT/classes.jsa"
    echo "install-kafka: class-data archive ready ($ROOT/classes.jsa)" >&2
  else
    echo "install-kafka: no class-data archive (nodes start without it); the node's log ends:" >&2
    tail -5 "$dir/kafka.log" >&2
  fi
  rm -rf "$dir"
  touch "$ROOT/.archived"
}

if [ -f "$ROOT/.complete" ]; then
  [ -f "$ROOT/.archived" ] || archive
  echo "$LIBS"
  exit 0
fi
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
archive
echo "install-kafka: Apache Kafka $KAFKA_VERSION ready: $(ls "$LIBS" | wc -l) jars in $LIBS (${SECONDS}s)" >&2
echo "$LIBS"
