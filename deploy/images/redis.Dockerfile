# Local stand-in for redis:7.4-bookworm (scripts/docker_local.sh): Debian's redis-server.
FROM dynamo-rl-base/debian:bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
