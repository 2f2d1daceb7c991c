# Local stand-in for prom/prometheus (scripts/docker_local.sh): Debian's prometheus, with wget for
# the compose health check. The entrypoint takes the same arguments as the official image.
FROM dynamo-rl-base/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
